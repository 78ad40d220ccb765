#pragma once
// The CPU's memory read bandwidth, measured: what decode's weight reads are
// held against ("% of memory bandwidth" in the tables). One thread, like the
// kernels it is compared with.
#include <cstddef>

namespace step06 {

// GB/s (1e9 bytes per second) of one thread summing a buffer larger than
// the last-level cache (twice it, from 256 MiB up to `max_bytes`): the median
// of `runs` passes after a warm-up. A default run passes 256 MiB (past any
// laptop's cache); --full allows 1 GiB (a server's cache is hundreds of MiB).
double measure_cpu_read_bandwidth_gbps(int runs = 5, std::size_t max_bytes = std::size_t{1} << 30);

}  // namespace step06
