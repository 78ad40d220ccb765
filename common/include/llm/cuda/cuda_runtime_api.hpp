#pragma once
// What the CPU side of the course knows about CUDA. Every function here exists
// in every build: without CUDA they report "built without CUDA", so step code
// has no #ifdefs.
#include <cstddef>
#include <memory>
#include <string>

#include "llm/harness/device_info.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace llm::cuda {

bool built_with_cuda();

// Why a CUDA device is or is not usable. The first three say that no GPU can
// be there for this process; the last three that one is there and this build
// cannot use it (the GPU tests skip on the first kind and fail on the second:
// tests/test_support.hpp).
enum class DeviceKind {
  Usable,
  BuiltWithoutCuda,  // this build has no CUDA code
  NoDriver,          // no NVIDIA driver installed (cudaDriverGetVersion reports 0)
  NoDevice,          // a driver, but no device visible (none, or CUDA_VISIBLE_DEVICES hides them all)
  DriverTooOld,      // the installed driver is older than this build's CUDA runtime
  NoKernelImage,     // the build's kernels are not compiled for this GPU's architecture
  DeviceFailed,      // the device is there but failed (context creation, properties, ...)
};

// True for the kinds where no GPU can be present: nothing to test, nothing broken.
constexpr bool no_gpu_present(DeviceKind kind) {
  return kind == DeviceKind::BuiltWithoutCuda || kind == DeviceKind::NoDriver || kind == DeviceKind::NoDevice;
}

struct DeviceStatus {
  bool usable = false;
  DeviceKind kind = DeviceKind::BuiltWithoutCuda;
  // Why not, in a few words ("built without CUDA", "no NVIDIA driver found",
  // ...); empty when usable. It never starts with "no usable CUDA device":
  // unusable_message() adds that phrase, once.
  std::string reason;
};

// "no usable CUDA device: <reason>": the one place that writes the phrase.
inline std::string unusable_message(const DeviceStatus& status) {
  return status.usable ? std::string("CUDA device usable") : "no usable CUDA device: " + status.reason;
}

// A CUDA version as CUDA encodes it (1000 * major + 10 * minor) in words:
// 13000 -> "13.0". No CUDA calls: defined in every build.
std::string cuda_version_string(int version);

// The status when cudaGetDeviceCount fails with `cuda_error` (a cudaError_t
// value), from what else is known: the installed driver's CUDA version
// (cudaDriverGetVersion; 0 when no driver is installed), this build's runtime
// version, and $CUDA_VISIBLE_DEVICES (nullptr when unset). Error 35 with no
// driver is NoDriver, 35 with one is DriverTooOld, 100 is NoDevice, anything
// else DeviceFailed. No CUDA calls: defined in every build, tested on the CPU.
DeviceStatus status_from_device_count_error(int cuda_error, int driver_version, int runtime_version,
                                            const char* cuda_visible_devices);

// Never throws. Errors from the CUDA runtime become a status (kind and
// reason), never a crash: on a machine with the toolkit but no driver
// cudaGetDeviceCount fails with 35 ("driver version is insufficient"), which
// is reported as NoDriver when no driver is installed at all.
DeviceStatus device_status();

// Fills the gpu_* and cuda_* fields of `info` when a device is usable.
void fill_device_info(DeviceInfo& info);

// Streaming multiprocessors of the current GPU (read once): what a kernel
// that splits its work to fill the GPU (split-KV decode) sizes its grid by.
// Throws DeviceError when no device is usable.
int sm_count();

// Compute capability of the current GPU as 75, 80, 90 (read once): which
// tensor-core instructions the card has (step 02's mma rows, step 06's fp16
// mma). Throws DeviceError when no device is usable.
int compute_capability();

// The GPU's practical memory bandwidth ceiling, measured: a device-to-device
// copy of `bytes` (1 GiB by default, far beyond any L2), median of 10 timed
// copies after 3 warm-ups, counting bytes read plus bytes written (GB/s,
// 1e9). Memory-bound kernels are judged as a fraction of this number rather
// than of the datasheet's, which no kernel reaches. Throws DeviceError when
// no device is usable.
double measure_copy_bandwidth_gbps(std::size_t bytes = std::size_t{1} << 30);

// The element type of the CUDA model's weight matrices (--dtype). fp32 is
// the reference; fp16 and bf16 halve the bytes every decode token reads.
enum class WeightDtype { Float32, Float16, BFloat16 };
std::string to_string(WeightDtype dtype);  // "fp32", "fp16", "bf16"
// "fp32" | "fp16" | "bf16"; throws InputError for anything else.
WeightDtype parse_weight_dtype(const std::string& name);

// The GEMV's largest row bucket (speculative decoding verifies up to k + 1
// <= 9 rows, step 07 batches a few sequences): the most rows
// CudaRunOptions::max_gemv_rows may send to it, and a HalfCudaLinear's own
// default. Beyond, cuBLAS.
inline constexpr int kMaxGemvRows = 16;
// The model's default (CudaRunOptions::max_gemv_rows, --max-gemv-rows): only
// a product of one row, the decode token's, runs the GEMV; two rows or more
// run cuBLAS. Measured on TinyLlama's products (chapter 01, section 5.6),
// the GEMV reads the weights at cuBLAS's speed for one row, but its time
// grows with its rows (on the CUDA cores every weight costs one fmaf per
// row), where cuBLAS's barely moves: a verify pass (step 04) or a batch
// (step 07) of a few rows is cheaper through cuBLAS (whose path folds the
// norms, SwiGLU and adds too, into the kernel that rounds its input and into
// cuBLAS's own epilogue; half_linear.hpp). The price: a row's logits in a
// batch are no longer the bits of the same row alone (cuBLAS sums in
// another order), so greedy tokens may part at a near-tie; --max-gemv-rows
// 16 keeps every forward of up to 16 rows on the GEMV, whose bits do not
// depend on the rows beside.
inline constexpr int kDefaultMaxGemvRows = 1;

// Which kernel multiplies 1..max_gemv_rows rows by fp16/bf16 weights
// (--gemv). Both read every weight once whatever the row count; they differ
// in where the multiply-adds run: the CUDA cores' fmaf (16 per weight at 16
// rows), or the tensor cores' mma.sync (one instruction per 16 x 16 weights
// and 8 rows). fp32 weights always go through cuBLAS.
enum class HalfGemvKernel { CudaCores, TensorCores };
std::string to_string(HalfGemvKernel kernel);  // "cuda-cores", "tensor-cores"
// "cuda-cores" | "tensor-cores"; throws InputError for anything else.
HalfGemvKernel parse_half_gemv_kernel(const std::string& name);

// How the half-precision GEMV requests its weights and spreads them over
// its blocks. Each switch is on by default and off only to measure what it
// buys (its before row); the loads give the same bits either way
// (half_linear.cu has both), the split the same sums in another order.
struct HalfGemvLoads {
  // Each block asks L2 for its first weights before it waits for the kernel
  // before it (programmatic_launch.cuh; --no-gemv-prefetch).
  bool prefetch_first_weights = true;
  // The CUDA-core kernel requests a lane's next batch of weights before it
  // multiplies the current one, at 1..4 rows (--no-gemv-pipelining).
  bool pipelined = true;
  // The columns split so that the blocks fill whole waves of the GPU
  // (gemv_column_split.hpp; --no-gemv-wave-fit).
  bool whole_wave_split = true;
};

// How the CUDA model runs (every step's --dtype and --no-graphs).
struct CudaRunOptions {
  WeightDtype dtype = WeightDtype::Float32;
  // Replay a captured CUDA graph for decode forwards (one per batch-size and
  // context bucket) instead of launching every kernel from the host.
  bool graphs = true;
  // Fused launches (cuda_model.hpp's CudaFusions, all of them): one QKV
  // product, one gate/up product, residual add + RMSNorm, RoPE + K/V append,
  // the norms, SwiGLU and residual adds folded into half-precision
  // products ...
  bool fusions = true;
  // ... that one unless this is false (its before row) ...
  bool fold_norms = true;
  // ... and split-KV decode attention's merge done by the last split block
  // to finish when this is true (--merge-folding). Off by default: one
  // launch a layer fewer past 64 keys, but measured slower than the merge
  // kernel it replaces (docs/01_kv_cache.md, section 5.8).
  bool fold_merge = false;
  // ... and RoPE with the K/V append done by the QKV product on its outputs
  // (fp32 caches), unless this is false (the kernel after the product: its
  // before row).
  bool fold_rope = true;
  // Programmatic dependent launch on sm_90 and later: a kernel of the
  // forward may start while the one before it finishes (false: the before
  // row; cuda_model.hpp's CudaModelOptions::programmatic_launches).
  bool programmatic_launches = true;
  // The half-precision products' kernel for 1..max_gemv_rows rows (fp16 and
  // bf16 only).
  HalfGemvKernel gemv = HalfGemvKernel::CudaCores;
  // The half-precision products of up to this many rows run the GEMV
  // (`gemv`); more rows run cuBLAS. 1..kMaxGemvRows; the default and why:
  // kDefaultMaxGemvRows. Both paths fold the norms, SwiGLU and residual adds
  // (fold_norms): the GEMV into its launch, cuBLAS's path into the kernel
  // that rounds its input and into cuBLAS's epilogue.
  int max_gemv_rows = kDefaultMaxGemvRows;
  // Each GEMV block asks L2 for its first weights before it waits for the
  // kernel before it (programmatic_launch.cuh); false: the before row of
  // that prefetch (--no-gemv-prefetch). The same bits either way.
  bool gemv_prefetch = true;
  // The CUDA-core GEMV requests its next batch of weights before it
  // multiplies the current one (1..4 rows); false: the before row of that
  // pipelining (--no-gemv-pipelining). The same bits either way.
  bool gemv_pipelining = true;
  // The GEMVs (half and step 06's int4) split their columns so that their
  // blocks fill whole waves of the GPU; false: about a wave's worth of
  // blocks rounded up, the before row (--no-gemv-wave-fit), which can leave
  // a second wave of a few blocks. The same sums in another order.
  bool gemv_wave_fit = true;
  // Each GEMV asks L2 for the next product's first weights once its own are
  // read (CudaModelOptions::prefetch_next_product). Off by default: an opt-in
  // that measured slower (--gemv-prefetch-next). The same bits either way.
  bool gemv_prefetch_next = false;
};

// The transformer on the GPU: own kernels for embedding, RMSNorm, RoPE,
// attention and SwiGLU, cuBLAS (fp32) or a half-precision GEMV/GEMM (fp16,
// bf16) for the products. Throws DeviceError when CUDA is not built or no
// device is usable.
std::unique_ptr<Model> make_cuda_model(const ModelWeights& weights, const CudaRunOptions& options = {});

}  // namespace llm::cuda
