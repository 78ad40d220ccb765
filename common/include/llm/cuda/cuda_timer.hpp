#pragma once
// The GPU side of the one timer (llm/harness/timer.hpp): warm-up runs, then
// the median (and min/max) of N runs, each timed with a pair of CUDA events.
//
// Why events and not a host clock: a kernel launch returns before the kernel
// has run, so a host stopwatch around a launch measures the launch, not the
// work. Events are timestamps the GPU itself writes when it reaches them in
// the stream, so stop - start is the GPU time of everything queued between.
//
// Why flush L2: a kernel timed twice in a row finds its inputs still in the
// L2 cache (50 MB on an H100) the second time and looks faster than it would
// inside a real model, where other layers' data evicted them. With flush_l2
// the timer writes a buffer twice the size of the L2 before every run.
//
// The events are recorded on the legacy default stream, which waits for (and
// is waited on by) every blocking stream (cudaStreamCreate without
// cudaStreamNonBlocking); `fn` must queue its work on such streams. The
// header has no CUDA types so ordinary .cpp code of a CUDA build can call it;
// only CUDA builds define it.
#include <functional>

#include "llm/harness/timer.hpp"

namespace llm::cuda {

// Runs `fn` `warmup` times untimed, then `runs` times, each between two CUDA
// events (and after an L2 flush when `flush_l2`). Throws DeviceError on a
// CUDA failure.
TimingStats time_cuda(const std::function<void()>& fn, int warmup, int runs, bool flush_l2 = true);

}  // namespace llm::cuda
