// time_cuda: CUDA events around each run, optional L2 flush in between.
#include "llm/cuda/cuda_timer.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/device_buffer.hpp"

namespace llm::cuda {
namespace {

// One CUDA event that destroys itself.
class Event {
 public:
  Event() { LLM_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { static_cast<void>(cudaEventDestroy(event_)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Bytes to write so that nothing timed before survives in L2: twice its size
// (the replacement policy is not strict LRU), and at least 8 MiB.
std::size_t l2_flush_bytes() {
  int device = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  int l2_bytes = 0;
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  return std::max<std::size_t>(2 * static_cast<std::size_t>(l2_bytes), std::size_t{8} << 20);
}

}  // namespace

TimingStats time_cuda(const std::function<void()>& fn, int warmup, int runs, bool flush_l2) {
  DeviceBuffer<unsigned char> flush;
  if (flush_l2) flush.ensure(l2_flush_bytes());
  cudaStream_t stream = nullptr;  // the legacy default stream (see the header)

  for (int i = 0; i < warmup; ++i) fn();
  LLM_CUDA_CHECK(cudaDeviceSynchronize());

  Event start, stop;
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(std::max(runs, 0)));
  for (int i = 0; i < runs; ++i) {
    // A different value each run, so no layer of the memory system can skip
    // the writes as redundant.
    if (flush_l2) LLM_CUDA_CHECK(cudaMemsetAsync(flush.data(), (i + 1) & 0xff, flush.bytes(), stream));
    LLM_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    fn();
    LLM_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    LLM_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    LLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    samples.push_back(static_cast<double>(ms));
  }
  return TimingStats::from_samples(std::move(samples));
}

}  // namespace llm::cuda
