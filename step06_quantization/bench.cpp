// Temporary (branch only): replaced by the step's benchmarks before merging.
int main() { return 0; }
