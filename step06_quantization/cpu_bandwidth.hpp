#pragma once
// The CPU's memory read bandwidth, measured: what decode's weight reads are
// held against ("% of memory bandwidth" in the tables). One thread, like the
// kernels it is compared with.
namespace step06 {

// GB/s (1e9 bytes per second) of one thread summing a buffer larger than
// the last-level cache (256 MiB to 1 GiB): the median of `runs` passes after
// a warm-up.
double measure_cpu_read_bandwidth_gbps(int runs = 5);

}  // namespace step06
