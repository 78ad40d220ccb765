// Temporary entry point while step 06 is assembled on its branch (replaced before merging).
int main() { return 0; }
