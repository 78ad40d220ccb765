// The paged KV cache in GPU memory: the same pools and tables as the CPU one
// (paged_kv_cache.cpp), in device memory. The block manager stays on the
// host; prepare() uploads its tables when they changed since the last forward.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"

namespace step05 {
namespace {

using llm::cuda::DeviceBuffer;

class CudaPagedKvCache final : public PagedKvCache {
 public:
  CudaPagedKvCache(const llm::ModelConfig& config, const PagedKvCacheOptions& options) : PagedKvCache(config, options) {
    if (element() == llm::KvElement::Float32) {
      allocate_zeroed(keys_, values_per_pool());
      allocate_zeroed(values_, values_per_pool());
    } else {
      allocate_zeroed(keys_int8_, values_per_pool());
      allocate_zeroed(values_int8_, values_per_pool());
      allocate_zeroed(key_scales_, scales_per_pool());
      allocate_zeroed(value_scales_, scales_per_pool());
    }
    tables_.ensure(blocks().all_tables().size());
    upload_tables();
  }
  std::string device_name() const override { return "cuda"; }

  // Once per forward, after every reserve: the kernels read the tables from
  // device memory. The previous forward has finished (the model waits for
  // its logits), so a synchronous copy cannot race a kernel still reading.
  void prepare() override {
    if (blocks().tables_version() != uploaded_version_) upload_tables();
  }

 private:
  template <class T>
  static void allocate_zeroed(DeviceBuffer<T>& buffer, std::size_t count) {
    buffer.ensure(count);
    buffer.zero();
  }
  void upload_tables() {
    tables_.upload(blocks().all_tables());
    uploaded_version_ = blocks().tables_version();
  }

  Pools pools() const override {
    Pools p;  // every pointer is device memory: pass views to kernels, never dereference them here
    p.keys = const_cast<float*>(keys_.data());
    p.values = const_cast<float*>(values_.data());
    p.keys_int8 = const_cast<std::int8_t*>(keys_int8_.data());
    p.values_int8 = const_cast<std::int8_t*>(values_int8_.data());
    p.key_scales = const_cast<float*>(key_scales_.data());
    p.value_scales = const_cast<float*>(value_scales_.data());
    p.tables = tables_.data();
    return p;
  }

  // Copy-on-write's copies: device to device. Synchronous (cudaMemcpy), so
  // the copy is done before the forward that follows writes into the block.
  void copy_bytes(void* dst, const void* src, std::size_t bytes) override {
    LLM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  }

  DeviceBuffer<float> keys_, values_;                  // fp32 pools [n_layers, n_blocks * block_size, kv_dim]
  DeviceBuffer<std::int8_t> keys_int8_, values_int8_;  // int8 pools, the same shape
  DeviceBuffer<float> key_scales_, value_scales_;      // [n_layers, n_blocks * block_size, n_kv_heads]
  DeviceBuffer<std::int32_t> tables_;                  // [num_sequences, max_blocks_per_sequence]
  std::uint64_t uploaded_version_ = 0;                 // blocks().tables_version() of the tables on the device
};

}  // namespace

std::unique_ptr<PagedKvCache> make_cuda_paged_kv_cache(const llm::ModelConfig& config,
                                                       const PagedKvCacheOptions& options) {
  const llm::cuda::DeviceStatus status = llm::cuda::device_status();
  if (!status.usable) throw llm::DeviceError("cannot make a CUDA paged KV cache: " + status.reason);
  auto cache = std::make_unique<CudaPagedKvCache>(config, options);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets are done before anyone uses the cache
  return cache;
}

}  // namespace step05
