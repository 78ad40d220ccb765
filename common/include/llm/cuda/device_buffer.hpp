#pragma once
// DeviceBuffer<T>: an array of T in GPU memory that frees itself (RAII), so no
// error path can leak device memory. Move-only: two owners of one cudaMalloc
// would free it twice.
//
//   DeviceBuffer<float> w(host_weights);         // cudaMalloc + upload
//   DeviceBuffer<float> y(rows * n);             // uninitialized
//   y.download(std::span<float>(host_y));        // cudaMemcpy back
//
// The *_async helpers queue the copy on a stream. With pageable (ordinary)
// host memory the CUDA documentation only promises that an async copy *may*
// return before it is done, so keep the host vector unchanged until the
// stream is synchronized (CudaModel::forward synchronizes once, at its end);
// a device->host copy is complete only after that synchronization.
//
// CUDA-aware translation units only (includes the CUDA headers).
#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "llm/cuda/cuda_check.hpp"

namespace llm::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) { allocate(count); }
  // Allocates host.size() elements and copies `host` into them (synchronous).
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) { upload(host); }

  ~DeviceBuffer() { release(); }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }  // elements
  std::size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

  // Makes room for at least `count` elements. Growing frees the old memory
  // first (its contents are lost): this is for scratch space reused across
  // calls, grown on demand and never shrunk.
  void ensure(std::size_t count) {
    if (count <= size_) return;
    release();
    allocate(count);
  }

  // Host -> device into elements [0, host.size()).
  void upload(std::span<const T> host) {
    check_fits(host.size(), "upload");
    if (!host.empty()) LLM_CUDA_CHECK(cudaMemcpy(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice));
  }
  void upload_async(std::span<const T> host, cudaStream_t stream) {
    check_fits(host.size(), "upload_async");
    if (!host.empty())
      LLM_CUDA_CHECK(cudaMemcpyAsync(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream));
  }
  // Device elements [0, host.size()) -> host.
  void download(std::span<T> host) const {
    check_fits(host.size(), "download");
    if (!host.empty()) LLM_CUDA_CHECK(cudaMemcpy(host.data(), data_, host.size_bytes(), cudaMemcpyDeviceToHost));
  }
  void download_async(std::span<T> host, cudaStream_t stream) const {
    check_fits(host.size(), "download_async");
    if (!host.empty())
      LLM_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, host.size_bytes(), cudaMemcpyDeviceToHost, stream));
  }
  // Every byte zero (0.0f for floats).
  void zero(cudaStream_t stream = nullptr) {
    if (size_ > 0) LLM_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes(), stream));
  }

 private:
  void allocate(std::size_t count) {
    if (count == 0) return;  // cudaMalloc(0) is legal but pointless
    void* p = nullptr;
    LLM_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
    size_ = count;
  }
  void release() noexcept {
    // A destructor must not throw; cudaFree only fails when the context is
    // already broken (or destroyed at program exit), and then there is nothing
    // left to free.
    if (data_ != nullptr) static_cast<void>(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
  }
  void check_fits(std::size_t count, const char* what) const {
    if (count > size_)
      throw std::length_error(std::string("DeviceBuffer::") + what + ": " + std::to_string(count) +
                              " elements do not fit in a buffer of " + std::to_string(size_));
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// PinnedBuffer<T>: an array of T in page-locked ("pinned") host memory that
// frees itself. The GPU's copy engine reads and writes pinned memory directly,
// so a cudaMemcpyAsync from or to it really is asynchronous and needs no
// staging copy through a driver buffer; a copy from pageable memory may be
// staged and block the host. CudaModel keeps the plan it uploads and the
// logits it downloads in pinned buffers: one copy each way per forward.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }  // elements
  // Room for at least `count` elements; growing loses the contents.
  void ensure(std::size_t count) {
    if (count <= size_) return;
    release();
    void* p = nullptr;
    LLM_CUDA_CHECK(cudaMallocHost(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
    size_ = count;
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) static_cast<void>(cudaFreeHost(data_));
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace llm::cuda
