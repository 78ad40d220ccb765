#pragma once
// CudaStream: a CUDA stream that destroys itself. A stream is a queue of GPU
// work that runs in order; the model queues a whole forward on its own stream
// and waits once, at the end, for the logits.
#include <cuda_runtime.h>

#include "llm/cuda/cuda_check.hpp"

namespace llm::cuda {

class CudaStream {
 public:
  // cudaStreamCreate (not ...WithFlags(cudaStreamNonBlocking)): a blocking
  // stream stays ordered with the legacy default stream, which time_cuda's
  // events are recorded on (llm/cuda/cuda_timer.hpp).
  CudaStream() { LLM_CUDA_CHECK(cudaStreamCreate(&stream_)); }
  ~CudaStream() {
    if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  void synchronize() const { LLM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace llm::cuda
