#pragma once
// Programmatic dependent launch (PDL, sm_90 and later): a kernel of the
// forward starts while the kernel before it on the stream is still running,
// and does what does not depend on that kernel first.
//
// Why. At decode every kernel of a token waits for the one before it, and
// each boundary costs more than the launch itself: the next grid's blocks
// are scheduled only when the last block of the previous grid has exited,
// and only then request their first bytes from HBM: a whole round trip
// before the bandwidth is back. A TinyLlama token crosses such a boundary
// some six times a layer (docs/01_kv_cache.md, section 5.7). But most of
// what a product kernel reads, its weights, does not depend on the kernel
// before it at all: only x does. So the next kernel may as well be resident
// and have its first weights in flight while the previous kernel finishes.
//
// How. A kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start as soon as
// every block of the kernel before it has called let_next_kernel_launch()
// (griddepcontrol.launch_dependents) or exited. It then runs in two parts:
//
//   1. what reads only memory that no earlier kernel of the stream writes
//      (a product's weights) and writes nothing;
//   2. wait_for_previous_kernel() (griddepcontrol.wait: returns once the
//      kernel before has finished and its writes are visible), then
//      everything else.
//
// The rule that keeps this correct, in every kernel launch_kernel() launches:
// every block calls wait_for_previous_kernel() before it reads or writes
// anything another kernel writes or reads (activations, the K/V cache,
// split-K scratch and its counters, y), and before it exits. Then "the
// kernel before has finished" also means every kernel before that one has:
// each of them waited for its own predecessor before it could finish.
//
// Each kernel here calls let_next_kernel_launch() right after its wait: the
// next kernel's blocks may then take the SM room this grid's finished blocks
// leave and start their part 1, but no kernel gets more than one ahead (the
// next one's blocks can only trigger the one after once they have waited).
//
// Without the attribute (launch_kernel outside an OverlapLaunches scope, a
// GPU before sm_90, or code compiled for an older architecture) the wait
// returns at once and the trigger does nothing: the kernel starts after the
// one before it has finished, as a <<<...>>> launch does. Both instructions
// exist only from sm_90 on, so older code compiles them away.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "llm/cuda/cuda_check.hpp"

namespace llm::cuda {

// --- Device side (CUDA translation units only: a .cpp may include this
// file for the host side).
#if defined(__CUDACC__)

// griddepcontrol.wait: blocks until the kernels this grid depends on have
// finished and their memory is visible. The "memory" clobber keeps the
// compiler from moving loads or stores of part 2 above it.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents: this block no longer holds the next
// kernel back (once every block of the grid has said so, or exited, it may
// be scheduled). Says nothing about this block's writes: the next kernel
// still waits for them with wait_for_previous_kernel().
__device__ __forceinline__ void let_next_kernel_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Part 2's opening, for a kernel with no part 1.
__device__ __forceinline__ void wait_then_let_next_kernel_launch() {
  wait_for_previous_kernel();
  let_next_kernel_launch();
}

#endif  // __CUDACC__

// --- Host side.

// While one is alive on this thread, launch_kernel() launches with the
// programmatic attribute where the GPU and the kernel's code allow it. The
// model opens one around the kernels of a forward that follow its first
// kernel (a kernel whose predecessor on the stream is a copy, not a kernel,
// gains nothing from it); scopes nest, the innermost decides. Opening an
// enabled scope asks which GPU is current and whether it is sm_90 or later,
// once, so that the launches inside it do not.
class OverlapLaunches {
 public:
  explicit OverlapLaunches(bool enabled);
  ~OverlapLaunches();
  OverlapLaunches(const OverlapLaunches&) = delete;
  OverlapLaunches& operator=(const OverlapLaunches&) = delete;

  // What a scope knows (the innermost open one's, on this thread).
  struct State {
    bool gpu_overlaps = false;  // enabled, and the current GPU is sm_90 or later
    int device = -1;            // the current GPU, when gpu_overlaps
  };

 private:
  State enclosing_;
};

// Whether a launch of `kernel` now gets the programmatic attribute: an
// OverlapLaunches(true) scope is open on this thread over an sm_90 or later
// GPU, and the kernel's code for it was compiled for sm_90 or later (its
// ptxVersion; code for an older architecture, JIT-compiled for this GPU, has
// no wait in it and must not overlap). The kernel's answer is asked of the
// runtime once per thread, device and kernel.
bool launch_overlaps(const void* kernel);

// kernel<<<grid, block, shared_bytes, stream>>>(args...), with the attribute
// when launch_overlaps(kernel); throws DeviceError when the launch fails. A
// kernel launched here follows the rule at the top of this file.
template <class... Parameters, class... Arguments>
void launch_kernel(void (*kernel)(Parameters...), dim3 grid, dim3 block, std::size_t shared_bytes,
                   cudaStream_t stream, Arguments&&... arguments) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute overlap{};
  if (launch_overlaps(reinterpret_cast<const void*>(kernel))) {
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, std::forward<Arguments>(arguments)...);
  // A failed launch is also the thread's "last error" until read: read it
  // here (as LLM_CUDA_CHECK_LAUNCH does after a <<<...>>> launch), so that a
  // later check does not report this launch again.
  if (launched != cudaSuccess) static_cast<void>(cudaGetLastError());
  LLM_CUDA_CHECK(launched);
}

}  // namespace llm::cuda
