// Step 05: PagedAttention (being built: see the step's README once it lands).
int main() { return 0; }
