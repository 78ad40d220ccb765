#pragma once
// Independent pieces of host-side set-up work on every core: filling a large
// preset's random matrices, quantizing a model's layers, the double-precision
// reference products of the GPU tests. Not for anything timed: the CPU rows
// the steps measure run on one thread, so that they mean the same on every
// machine.
#include <cstddef>
#include <functional>

namespace llm {

// Calls work(index) once for every index in [0, count), on up to
// `max_threads` threads (0: one per hardware thread, at most 32; a count
// above the hardware's is honoured, as the tests ask), the calling thread
// among them, fewer if the system gives no more. Indices are handed out in increasing order, one at a
// time, so uneven pieces balance. The caller makes the pieces independent
// (each writes only its own outputs); then the results do not depend on the
// number of threads. If pieces throw, every piece still runs to its end or
// its throw, and the exception of the lowest index is rethrown: the one a
// loop from 0 would have thrown first.
void parallel_for(std::size_t count, const std::function<void(std::size_t index)>& work, unsigned max_threads = 0);

}  // namespace llm
