// The host side of step 06's W8A16 / W4A16 products on the GPU
// (cuda_quantized_kernels.hpp): the device copy of a QuantizedMatrix in the
// kernels' layout and their launch plans, the launches per 16 rows, the
// checks on what the API is handed, the CUDA model's quantized Linear hook,
// and the timing against cuBLAS fp16. The kernels: quantized_mma_launch.cuh
// (what this file sees of them), quantized_mma.cuh (what both share, and the
// overview), quantized_mma_persistent.cu (the model's),
// quantized_mma_one_shot.cu (the first version, kept to time against); the
// int4 decode GEMV: int4_decode_gemv.cu.
#include "step06_quantization/cuda_quantized_kernels.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

// common/cuda (a public include directory of llm_common in CUDA builds).
// Inside namespace step06 the model's types are spelled llm::cuda::...
#include "cuda_linear.hpp"
#include "cuda_model.hpp"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"
#include "llm/splitmix64.hpp"
#include "half_linear.hpp"  // HalfActivationScratch: the int4 decode GEMV's split scratch
#include "step06_quantization/cuda_weight_layout.hpp"
#include "step06_quantization/int4_decode_gemv.cuh"
#include "step06_quantization/quantized_layers.hpp"
#include "step06_quantization/quantized_mma_launch.cuh"  // the kernels' sizes, views, plan and launches

namespace step06 {
namespace {

using llm::cuda::DeviceBuffer;
// The kernels' sizes and the views a launch takes (quantized_mma_launch.cuh).
using quantized_mma::kBlockRows, quantized_mma::kMaxBatchRows, quantized_mma::kMaxGridY, quantized_mma::kMaxSteps,
    quantized_mma::kPartialValues, quantized_mma::kStepBytes, quantized_mma::kTileRows,
    quantized_mma::kWantedBlocksPerSm, quantized_mma::kWarpSize, quantized_mma::kWarps;
using quantized_mma::DeviceMatrixView, quantized_mma::PersistentPlan, quantized_mma::SplitKView,
    quantized_mma::XStaging;

// A message from its pieces. (Not fmt: its headers do not compile in nvcc's
// host pass, which is why step 05's .cu files build strings too.)
template <class... Pieces>
std::string text(const Pieces&... pieces) {
  std::ostringstream out;
  (out << ... << pieces);
  return out.str();
}

// What the API's InputErrors start with.
constexpr const char* kApiName = "step06 CUDA quantized matmul";

[[noreturn]] void input_error(const std::string& what) {
  throw llm::InputError(std::string(kApiName) + ": " + what);
}

// fp16 values on the host are their bits: std::vector<__half> does not
// compile under nvcc's C++20 front end (__half is not default-constructible
// there), and the bits are all a copy needs. Device pointers are cast back.
using Fp16Bits = std::uint16_t;
Fp16Bits fp16_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }
float fp16_value(Fp16Bits bits) { return __half2float(__ushort_as_half(bits)); }
const __half* as_half(const Fp16Bits* p) { return reinterpret_cast<const __half*>(p); }
__half* as_half(Fp16Bits* p) { return reinterpret_cast<__half*>(p); }

// Spans spelled out: nvcc's front end does not take std::span's range
// constructor from a std::vector.
template <class T>
std::span<const T> span_of(const std::vector<T>& v) {
  return {v.data(), v.size()};
}
template <class T>
std::span<T> span_of(std::vector<T>& v) {
  return {v.data(), v.size()};
}

// fp16 tensor-core MMAs need sm_75 (Turing) or later.
void check_compute_capability() {
  if (const int capability = llm::cuda::compute_capability(); capability < 75)
    throw llm::DeviceError(text("step06: the quantized kernels use fp16 tensor-core MMAs, which need compute "
                                "capability 7.5+ (this GPU: ", capability / 10, ".", capability % 10, ")"));
}

void require_device() {
  const llm::cuda::DeviceStatus status = llm::cuda::device_status();
  if (!status.usable) throw llm::DeviceError("step06: " + llm::cuda::unusable_message(status));
  check_compute_capability();
}

// Checks that a QuantizedMatrix is internally consistent (it comes from the
// user's side of the API, possibly built by hand): a wrong size here would be
// an out-of-bounds read on the GPU, where nothing checks. Then the tensor-core
// kernels' own limits.
void check_matrix(const QuantizedMatrix& q) {
  const QuantFormat& f = q.format;
  check_gpu_quantized_matrix(q, kApiName);  // quant_format.hpp: sizes and scales
  if (q.format.int8_activations())
    input_error(text(q.format.name(), ": int8 activations are CPU kernels only (the GPU kernels are W8A16 / W4A16)"));
  if (ceil_div(ceil_div(q.out_features, kTileRows), kWarps) > kMaxGridY)
    input_error(text(q.out_features, " output rows: more than the grid holds (",
                     static_cast<long long>(kMaxGridY) * kBlockRows, ")"));
  // The persistent kernel's RequestCursor offsets, up to the last row
  // block's 8 tiles, are ints.
  const long long steps = ceil_div(q.padded_in, kStepBytes * 8 / f.bits());
  const long long tiles = static_cast<long long>(ceil_div(ceil_div(q.out_features, kTileRows), kWarps)) * kWarps;
  if (tiles * steps * 2 * kWarpSize > std::numeric_limits<int>::max())
    input_error(text(f.name(), " [", q.out_features, ", ", q.in_features,
                     "]: more than 2^31 16-byte words of codes (32 GiB), which the kernels index with ints"));
}

// The device copy of a QuantizedMatrix in the kernels' layout
// (cuda_weight_layout.hpp), uploaded once, and the launch plans that go
// with it.
class DeviceQuantizedMatrix {
 public:
  explicit DeviceQuantizedMatrix(const QuantizedMatrix& q) : scheme_(q.format.scheme) {
    check_matrix(q);
    require_device();
    plan_launch(q);
    persistent_ = quantized_mma::plan_persistent(scheme_, view_);
    upload_codes(q);
    upload_scales(q);
    view_.codes = codes_.data();
    view_.scales = as_half(scales_.data());
    view_.zeros = zeros_.empty() ? nullptr : zeros_.data();
    view_.inverse_input_scales = inverse_input_scales_.empty() ? nullptr : inverse_input_scales_.data();
  }

 private:
  // The view's dims and the one-shot kernel's split-K plan (no device memory yet).
  void plan_launch(const QuantizedMatrix& q) {
    DeviceMatrixView& v = view_;
    const int columns_per_step = kStepBytes * 8 / q.format.bits();
    v.out_features = q.out_features;
    v.in_features = q.in_features;
    v.m_tiles = ceil_div(q.out_features, kTileRows);
    v.rows_padded = v.m_tiles * kTileRows;
    v.group_columns = q.group_columns;
    v.groups_per_row = q.groups_per_row;
    v.total_steps = ceil_div(q.padded_in, columns_per_step);
    v.code_words = v.m_tiles * v.total_steps * 2 * kWarpSize;
    v.m_blocks = ceil_div(v.m_tiles, kWarps);
    // Slices: at least enough that a block's steps fit in its registers, and
    // as many more as bring the grid to ~kWantedBlocksPerSm blocks per SM
    // (fewer blocks leave SMs, and their share of the memory bandwidth,
    // idle); then the steps spread evenly over that many slices.
    const int min_splits = ceil_div(v.total_steps, kMaxSteps);
    const int wanted_splits = ceil_div(kWantedBlocksPerSm * llm::cuda::sm_count(), v.m_blocks);
    const int splits = std::clamp(std::max(min_splits, wanted_splits), 1, v.total_steps);
    v.steps_per_block = ceil_div(v.total_steps, splits);
    v.k_splits = ceil_div(v.total_steps, v.steps_per_block);
  }

  // The codes in the kernels' tile-major layout (cuda_weight_layout.hpp), uploaded.
  void upload_codes(const QuantizedMatrix& q) {
    const std::vector<std::uint8_t> bytes = cuda_tile_major_codes(q);
    std::vector<uint4> codes(bytes.size() / sizeof(uint4));  // [m_tiles, total_steps, 2, 32] uint4
    if (codes.size() != static_cast<std::size_t>(view_.code_words))
      throw llm::DeviceError(text("step06: the tile-major codes hold ", codes.size(), " 16-byte words, the plan ",
                                  view_.code_words));
    std::memcpy(codes.data(), bytes.data(), bytes.size());
    codes_ = DeviceBuffer<uint4>(span_of(codes));
  }

  // The group scales (fp16, one power-of-two exponent for the matrix) and
  // zero points in the kernels' layout (cuda_weight_layout.hpp: [group, row],
  // so the 128 rows of a block's group are 256 contiguous bytes, each tile's
  // rows in pair order), and AWQ's inverse input scales, uploaded. fp16
  // halves the scales' bytes (int4-g64: 2 instead of 4 bytes per 32 bytes of
  // codes, what keeps W4A16 near 4x fewer bytes than fp16).
  void upload_scales(const QuantizedMatrix& q) {
    const CudaGroupTables tables = cuda_group_tables(q);
    view_.output_scale = tables.output_scale;
    std::vector<Fp16Bits> scales(tables.scales.size());
    for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = fp16_bits(tables.scales[i]);
    scales_ = DeviceBuffer<Fp16Bits>(span_of(scales));
    if (!tables.zeros.empty()) zeros_ = DeviceBuffer<unsigned char>(span_of(tables.zeros));
    if (!q.input_scales.empty()) {
      // 1 / s once here, a multiply per activation in the kernel.
      std::vector<float> inverse(q.input_scales.size());
      for (std::size_t i = 0; i < inverse.size(); ++i) inverse[i] = 1.0f / q.input_scales[i];
      inverse_input_scales_ = DeviceBuffer<float>(span_of(inverse));
    }
  }

 public:
  QuantScheme scheme() const { return scheme_; }
  const DeviceMatrixView& view() const { return view_; }
  const PersistentPlan& persistent_plan() const { return persistent_; }
  int out_features() const { return view_.out_features; }
  int in_features() const { return view_.in_features; }
  std::size_t bytes() const {
    return codes_.bytes() + scales_.bytes() + zeros_.bytes() + inverse_input_scales_.bytes();
  }
  // Split-K scratch a launch of either kernel needs (see SplitKView): the
  // one-shot kernel's only with more than one slice.
  std::size_t partial_floats() const {
    const std::size_t one_shot =
        view_.k_splits > 1 ? static_cast<std::size_t>(view_.k_splits) * kMaxBatchRows * view_.rows_padded : 0;
    const std::size_t persistent = static_cast<std::size_t>(persistent_.grid) * kWarps * kPartialValues * kWarpSize;
    return std::max(one_shot, persistent);
  }
  std::size_t counters() const { return static_cast<std::size_t>(view_.m_tiles); }  // >= m_blocks

 private:
  QuantScheme scheme_;
  DeviceMatrixView view_;
  PersistentPlan persistent_;
  DeviceBuffer<uint4> codes_;                  // [m_tiles, total_steps, 2, 32] uint4
  DeviceBuffer<Fp16Bits> scales_;              // [groups_per_row, rows_padded] fp16 (paired_row_slot)
  DeviceBuffer<unsigned char> zeros_;          // [groups_per_row, rows_padded] (paired_row_slot) or empty
  DeviceBuffer<float> inverse_input_scales_;   // [in_features] or empty
};

// Split-K scratch, shared by every quantized layer of a model: the layers run
// one after another on the model's stream, and each launch of either kernel
// leaves the counters at 0 (the one-shot kernel's atomicInc wraps, the
// persistent kernel's owners reset their flags), so one buffer serves them
// all. Not for two launches in flight at once on different streams.
class SplitKWorkspace {
 public:
  void ensure(std::size_t partial_floats, std::size_t counters) {
    partials_.ensure(partial_floats);
    if (counters > counters_.size()) {
      counters_.ensure(counters);
      counters_.zero();  // a fresh allocation holds garbage; the kernel needs 0 (legacy stream: ordered before any use)
    }
  }
  SplitKView view() { return {partials_.data(), counters_.data()}; }

 private:
  DeviceBuffer<float> partials_;     // SplitKView's partials, of the largest user
  DeviceBuffer<unsigned> counters_;  // SplitKView's counters, of the largest user
};


// y [rows, out] = x [rows, in] . W~^T, both device memory, queued on
// `stream`: one launch per 16 rows (each re-reads W: prefill is not what
// these kernels are for).
template <class Act>
void quantized_matmul(const DeviceQuantizedMatrix& w, const Act* x, int rows, Act* y, SplitKWorkspace& workspace,
                      CudaQuantizedKernel kernel, cudaStream_t stream) {
  const DeviceMatrixView& v = w.view();
  const SplitKView split_k = workspace.view();
  constexpr std::size_t kVectorBytes = 4 * sizeof(Act);  // one 4-activation load
  for (int row0 = 0; row0 < rows; row0 += kMaxBatchRows) {
    const int tile_rows = std::min(kMaxBatchRows, rows - row0);
    const Act* x_tile = x + static_cast<std::size_t>(row0) * v.in_features;
    Act* y_tile = y + static_cast<std::size_t>(row0) * v.out_features;
    const auto x_address = reinterpret_cast<std::uintptr_t>(x_tile);
    XStaging staging;
    staging.vector_x = v.in_features % 4 == 0 && x_address % kVectorBytes == 0;
    staging.async_x = std::is_same_v<Act, __half> && v.inverse_input_scales == nullptr && v.in_features % 8 == 0 &&
                      x_address % 16 == 0;
    if (kernel == CudaQuantizedKernel::OneShotSplitK) {
      quantized_mma::launch_one_shot(w.scheme(), v, x_tile, tile_rows, staging.vector_x, y_tile, split_k, stream);
    } else {
      quantized_mma::launch_persistent(w.scheme(), v, w.persistent_plan(), x_tile, tile_rows, staging, y_tile,
                                       split_k, stream);
    }
  }
}

void check_rows(const QuantizedMatrix& matrix, std::size_t x_size, int rows) {
  if (rows <= 0) input_error(text(rows, " rows: need at least one"));
  if (x_size != static_cast<std::size_t>(rows) * static_cast<std::size_t>(matrix.in_features))
    input_error(text("x has ", x_size, " values, not ", rows, " rows x ", matrix.in_features, " input columns"));
}

std::vector<Fp16Bits> floats_to_halves(std::span<const float> values) {
  std::vector<Fp16Bits> halves(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) halves[i] = fp16_bits(values[i]);
  return halves;
}

std::vector<float> halves_to_floats(std::span<const Fp16Bits> halves) {
  std::vector<float> values(halves.size());
  for (std::size_t i = 0; i < halves.size(); ++i) values[i] = fp16_value(halves[i]);
  return values;
}

// The kernel's activation type for a host element type: fp32 as is, fp16
// bits as __half.
template <class Host>
struct KernelActivation {
  using type = float;
};
template <>
struct KernelActivation<Fp16Bits> {
  using type = __half;
};

// y [rows, out] = x [rows, in] . W~^T on the int4 decode GEMV, both device
// memory, queued on `stream`: Int4DecodeGemv::kMaxRows rows per launch.
void int4_gemv_matmul(const Int4DecodeGemv& gemv, const float* x, int rows, float* y,
                      llm::cuda::HalfActivationScratch& scratch, cudaStream_t stream) {
  for (int row0 = 0; row0 < rows; row0 += Int4DecodeGemv::kMaxRows) {
    const int launch_rows = std::min(Int4DecodeGemv::kMaxRows, rows - row0);
    gemv.forward(x + static_cast<std::size_t>(row0) * gemv.in_features(), launch_rows,
                 y + static_cast<std::size_t>(row0) * gemv.out_features(), {}, scratch, stream);
  }
}

// The int4 decode GEMV's refusals: not an int4 scheme, or fp16 activations.
void check_int4_gemv_request(const QuantizedMatrix& matrix, bool fp16_activations) {
  if (!Int4DecodeGemv::supports(matrix.format))
    input_error(text("the int4 decode GEMV reads int4 groups, not ", matrix.format.name()));
  if (fp16_activations)
    input_error("the int4 decode GEMV takes fp32 activations (it rounds them to fp16 as it stages them)");
}

// Runs a kernel once on host data; y is poisoned with NaN first (0xFF
// bytes are a NaN in fp16 and fp32) so an output the kernel skips fails
// every check.
template <class Host>
std::vector<Host> run_once(const QuantizedMatrix& matrix, std::span<const Host> x_host, int rows,
                           CudaQuantizedKernel kernel, bool whole_wave_split = true) {
  using Act = typename KernelActivation<Host>::type;
  check_matrix(matrix);  // InputErrors before any device work
  const bool int4_gemv = kernel == CudaQuantizedKernel::Int4DecodeGemv;
  if (int4_gemv) check_int4_gemv_request(matrix, std::is_same_v<Host, Fp16Bits>);
  require_device();
  const DeviceBuffer<Host> x{x_host};
  DeviceBuffer<Host> y{static_cast<std::size_t>(rows) * matrix.out_features};
  LLM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
  if (int4_gemv) {
    if constexpr (std::is_same_v<Host, float>) {  // fp16 activations were refused above
      Int4DecodeGemv gemv(matrix);
      gemv.set_whole_wave_split(whole_wave_split);
      llm::cuda::HalfActivationScratch scratch;
      gemv.reserve(scratch, rows);
      int4_gemv_matmul(gemv, x.data(), rows, y.data(), scratch, nullptr);
      LLM_CUDA_CHECK(cudaDeviceSynchronize());  // faults inside the kernel surface here (before the scratch goes)
    }
  } else {
    const DeviceQuantizedMatrix w(matrix);
    SplitKWorkspace workspace;
    workspace.ensure(w.partial_floats(), w.counters());
    quantized_matmul(w, reinterpret_cast<const Act*>(x.data()), rows, reinterpret_cast<Act*>(y.data()), workspace,
                     kernel, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());  // faults inside the kernel surface here
  }
  std::vector<Host> y_host(y.size());
  y.download(span_of(y_host));
  return y_host;
}

// The model's Linear hook with quantized weights (fp32 activations in and
// out, rounded to fp16 by the kernels). Int4 layers with the decode GEMV
// run products of 1..4 rows on it, folding what the model gives them
// (ProductFusion); every other product runs the persistent kernel, which
// folds nothing.
class CudaQuantizedLinear final : public llm::cuda::CudaLinear {
 public:
  CudaQuantizedLinear(const QuantizedMatrix& matrix, std::shared_ptr<SplitKWorkspace> workspace,
                      std::shared_ptr<llm::cuda::HalfActivationScratch> gemv_scratch,
                      const CudaQuantizedModelOptions& options)
      : weights_(matrix), workspace_(std::move(workspace)), gemv_scratch_(std::move(gemv_scratch)) {
    workspace_->ensure(weights_.partial_floats(), weights_.counters());
    if (options.int4_decode_gemv && Int4DecodeGemv::supports(matrix.format)) {
      gemv_ = std::make_unique<Int4DecodeGemv>(matrix);
      gemv_->set_first_weights_prefetch(options.run.gemv_prefetch);
      gemv_->set_pipelined_weight_loads(options.run.gemv_pipelining);
      gemv_->set_whole_wave_split(options.run.gemv_wave_fit);
    }
  }
  void forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const override {
    if (rows <= 0) return;
    if (fuses(rows))
      gemv_->forward(x_dev, rows, y_dev, {}, *gemv_scratch_, stream);
    else
      quantized_matmul(weights_, x_dev, rows, y_dev, *workspace_, CudaQuantizedKernel::PersistentPipelined, stream);
  }
  void reserve_rows(int rows) override {
    if (gemv_ != nullptr) gemv_->reserve(*gemv_scratch_, rows);
  }
  int max_fused_rows() const override { return gemv_ != nullptr ? Int4DecodeGemv::kMaxRows : 0; }
  void forward_fused(const float* x_dev, int rows, float* y_dev, const llm::cuda::ProductFusion& fusion,
                     cudaStream_t stream) const override {
    check_fusion(rows, fusion);
    gemv_->forward(x_dev, rows, y_dev, fusion, *gemv_scratch_, stream);
  }
  int in_features() const override { return weights_.in_features(); }
  int out_features() const override { return weights_.out_features(); }
  // What a decode token's product reads: the GEMV's copy (QuantizedMatrix's
  // bytes: fp32 group scales) where it runs, else the persistent kernel's
  // (fp16 scales, padded tiles); never both.
  std::size_t weight_bytes() const override { return gemv_ != nullptr ? gemv_->weight_bytes() : weights_.bytes(); }
  // The decode GEMV's first weights and its prefetch of the next product's
  // (cuda_linear.hpp); none without the GEMV (the persistent kernel's tiles
  // are another layout, and it asks L2 for nothing).
  llm::cuda::FirstWeightLines first_weight_lines() const override {
    return gemv_ != nullptr ? gemv_->first_weight_lines() : llm::cuda::FirstWeightLines{};
  }
  void set_next_product_lines(const llm::cuda::FirstWeightLines& lines) override {
    if (gemv_ != nullptr) gemv_->set_next_product_lines(lines);
  }
  // dense_weight(): nullptr (the default). A quantized tied classifier has no
  // fp32 rows to lend, so the model keeps its own copy of the embedding.

 private:
  // The persistent kernel's tile-major copy (prefill, batches, and every
  // product of int8 and NF4) and, for int4 with the GEMV, a row-major copy
  // as QuantizedMatrix stores it: twice the device memory of an int4 layer.
  // One layout for both kernels is what a production kernel (Marlin's) has;
  // here each kernel keeps the layout that makes it short to read.
  DeviceQuantizedMatrix weights_;
  std::unique_ptr<Int4DecodeGemv> gemv_;  // null: no GEMV (not int4, or switched off)
  std::shared_ptr<SplitKWorkspace> workspace_;
  std::shared_ptr<llm::cuda::HalfActivationScratch> gemv_scratch_;
};

// The quantized matrix of the model's product at `site` of [out_features,
// in_features]: the site's own, or for a fused product (CudaFusions'
// qkv_product and gate_up_product: the model asks for the Query site with
// the Q, K and V rows stacked, the Gate site with gate and up) the sites'
// matrices stacked by rows. Null: the site is not quantized (fp32).
std::optional<QuantizedMatrix> quantized_matrix_for(const QuantizedLayers& layers, const llm::LinearSite& site,
                                                    int out_features, int in_features) {
  const auto find = [&layers](int layer, llm::LinearRole role) -> const QuantizedMatrix* {
    const auto found = layers.matrices.find(llm::LinearSite{layer, role});
    return found == layers.matrices.end() ? nullptr : &found->second;
  };
  const QuantizedMatrix* own = find(site.layer, site.role);
  if (own == nullptr) return std::nullopt;
  std::vector<const QuantizedMatrix*> parts = {own};
  if (own->out_features != out_features) {
    parts.clear();
    for (const llm::LinearSite& member : sites_reading_the_input_of(site))
      parts.push_back(find(member.layer, member.role));
  }
  int stacked_rows = 0;
  for (const QuantizedMatrix* part : parts) {
    if (part == nullptr)
      input_error(text(site.name(), ": a fused product of quantized and fp32 matrices (quantize every site it stacks)"));
    stacked_rows += part->out_features;
  }
  if (stacked_rows != out_features || own->in_features != in_features)
    input_error(text(site.name(), ": the quantized matrix is [", stacked_rows, ", ", own->in_features,
                     "], the model's is [", out_features, ", ", in_features, "]"));
  return parts.size() == 1 ? *own : stack_rows(std::span<const QuantizedMatrix* const>(parts.data(), parts.size()));
}

}  // namespace

std::vector<float> cuda_quantized_matmul(const QuantizedMatrix& matrix, std::span<const float> x, int rows,
                                         CudaQuantizedKernel kernel, bool whole_wave_split) {
  check_rows(matrix, x.size(), rows);
  return run_once<float>(matrix, x, rows, kernel, whole_wave_split);
}

std::vector<float> cuda_quantized_matmul_fp16(const QuantizedMatrix& matrix, std::span<const float> x, int rows,
                                              CudaQuantizedKernel kernel) {
  check_rows(matrix, x.size(), rows);
  const std::vector<Fp16Bits> x_half = floats_to_halves(x);
  return halves_to_floats(span_of(run_once<Fp16Bits>(matrix, span_of(x_half), rows, kernel)));
}

namespace {

// y [rows, out] = x [rows, in] . weight [out, in]^T on the host, each sum in
// double (4 chains: the adds overlap): the reference the kernel is checked on.
std::vector<float> host_reference_product(const std::vector<float>& weight, const std::vector<float>& x_float,
                                          int rows, int in, int out) {
  std::vector<float> reference(static_cast<std::size_t>(rows) * out);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x_float.data() + static_cast<std::size_t>(r) * in;
    for (int o = 0; o < out; ++o) {
      const float* wo = weight.data() + static_cast<std::size_t>(o) * in;
      double sum[4] = {0.0, 0.0, 0.0, 0.0};  // 4 chains: the adds overlap
      int i = 0;
      for (; i + 4 <= in; i += 4)
        for (int j = 0; j < 4; ++j) sum[j] += static_cast<double>(xr[i + j]) * wo[i + j];
      for (; i < in; ++i) sum[0] += static_cast<double>(xr[i]) * wo[i];
      reference[static_cast<std::size_t>(r) * out + o] = static_cast<float>((sum[0] + sum[1]) + (sum[2] + sum[3]));
    }
  }
  return reference;
}

// The baseline: cuBLAS on the same matrix dequantized to fp16, weight [out,
// in] (fp32 on the host), x [rows, in] fp16 on the device; the median time.
double time_cublas_fp16(const std::vector<float>& weight, const DeviceBuffer<Fp16Bits>& x, int rows, int in, int out,
                        int warmup_runs, int repeats) {
  const DeviceBuffer<Fp16Bits> weight_dev{span_of(floats_to_halves(span_of(weight)))};
  DeviceBuffer<Fp16Bits> y_cublas{static_cast<std::size_t>(rows) * out};
  const llm::cuda::CublasHandle cublas;
  LLM_CUBLAS_CHECK(cublasSetStream(cublas.get(), nullptr));  // the legacy stream time_cuda's events are on
  const float alpha = 1.0f, beta = 0.0f;
  const auto run_cublas = [&] {
    // Y [rows, out] = X W^T, row-major, as DenseCudaLinear::forward explains:
    // in column-major terms C [out, rows] = op(A) [out, in] . B [in, rows],
    // with A = W's memory read transposed (lda = in), B = X's memory (ldb =
    // in), C = Y's memory (ldc = out). CUBLAS_COMPUTE_32F: fp16 inputs on the
    // tensor cores with fp32 accumulation, the same arithmetic as the
    // quantized kernel, so the comparison is of bytes moved, not of
    // precision (CUBLAS_COMPUTE_16F would accumulate in fp16).
    LLM_CUBLAS_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/out, /*n=*/rows, /*k=*/in, &alpha,
                                  weight_dev.data(), CUDA_R_16F, /*lda=*/in, x.data(), CUDA_R_16F, /*ldb=*/in, &beta,
                                  y_cublas.data(), CUDA_R_16F, /*ldc=*/out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  return llm::cuda::time_cuda(run_cublas, warmup_runs, repeats, /*flush_l2=*/true).median_ms;
}

}  // namespace

CudaMatmulTiming time_cuda_quantized_matmul(const QuantizedMatrix& matrix, int rows, int repeats, std::uint64_t seed) {
  if (rows <= 0) input_error(text(rows, " rows: need at least one"));
  if (repeats < 1) input_error(text(repeats, " timed runs: need at least one"));
  constexpr int kWarmupRuns = 3;
  const int in = matrix.in_features, out = matrix.out_features;
  const DeviceQuantizedMatrix w(matrix);
  SplitKWorkspace workspace;
  workspace.ensure(w.partial_floats(), w.counters());

  // x: uniform in [-1, 1), rounded to fp16 here, so the kernel, cuBLAS and
  // the reference all see the same numbers.
  llm::SplitMix64 rng(seed);
  std::vector<Fp16Bits> x_host(static_cast<std::size_t>(rows) * in);
  for (Fp16Bits& v : x_host) v = fp16_bits(static_cast<float>(2.0 * rng.uniform() - 1.0));
  const DeviceBuffer<Fp16Bits> x{span_of(x_host)};
  DeviceBuffer<Fp16Bits> y{static_cast<std::size_t>(rows) * out};

  // The checks: one run of each kernel into a NaN-poisoned y against the
  // fp32 product of dequantize(matrix) with the same fp16 x, accumulated in
  // double on the host. fp16 tolerance (1e-3 absolute + 1e-2 relative): y is
  // rounded to fp16 (relative 2^-11) and each group's scale was stored as
  // fp16 (relative 2^-12 per group, so |error| <= 2^-12 sum over groups
  // |partial|, about 1e-4 of |y| for 4096 columns of random data);
  // accumulation is fp32.
  const std::vector<float> weight = dequantize(matrix);  // [out, in]
  const std::vector<float> reference = host_reference_product(weight, halves_to_floats(span_of(x_host)), rows, in, out);
  const auto check = [&](CudaQuantizedKernel kernel) {
    LLM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
    quantized_matmul(w, as_half(x.data()), rows, as_half(y.data()), workspace, kernel, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<Fp16Bits> y_host(y.size());
    y.download(span_of(y_host));
    return llm::compare(span_of(halves_to_floats(span_of(y_host))), span_of(reference),
                        llm::tolerance_for(llm::DType::F16));
  };
  const auto median_ms = [&](CudaQuantizedKernel kernel) {
    const auto run = [&] {
      quantized_matmul(w, as_half(x.data()), rows, as_half(y.data()), workspace, kernel, nullptr);
    };
    return llm::cuda::time_cuda(run, kWarmupRuns, repeats, /*flush_l2=*/true).median_ms;
  };
  CudaMatmulTiming timing;
  timing.check = check(CudaQuantizedKernel::PersistentPipelined);
  timing.one_shot_check = check(CudaQuantizedKernel::OneShotSplitK);
  timing.quantized_ms = median_ms(CudaQuantizedKernel::PersistentPipelined);
  timing.one_shot_ms = median_ms(CudaQuantizedKernel::OneShotSplitK);
  timing.cublas_fp16_ms = time_cublas_fp16(weight, x, rows, in, out, kWarmupRuns, repeats);
  if (Int4DecodeGemv::supports(matrix.format) && rows <= Int4DecodeGemv::kMaxRows) {
    // The decode GEMV reads x as the model hands it over, fp32 (the same
    // fp16 values), and writes y in fp32.
    const std::vector<float> x_float = halves_to_floats(span_of(x_host));
    timing.int4_gemv_check =
        llm::compare(span_of(run_once<float>(matrix, span_of(x_float), rows, CudaQuantizedKernel::Int4DecodeGemv)),
                     span_of(reference), llm::tolerance_for(llm::DType::F16));
    const Int4DecodeGemv gemv(matrix);
    llm::cuda::HalfActivationScratch scratch;
    gemv.reserve(scratch, rows);
    const DeviceBuffer<float> x_dev{span_of(x_float)};
    DeviceBuffer<float> y_dev{static_cast<std::size_t>(rows) * out};
    const auto run = [&] { gemv.forward(x_dev.data(), rows, y_dev.data(), {}, scratch, nullptr); };
    timing.int4_gemv_ms = llm::cuda::time_cuda(run, kWarmupRuns, repeats, /*flush_l2=*/true).median_ms;
  }
  return timing;
}

std::unique_ptr<llm::Model> make_cuda_quantized_model(const llm::ModelWeights& weights, const QuantizedLayers& layers,
                                                      const CudaQuantizedModelOptions& options) {
  require_device();
  auto workspace = std::make_shared<SplitKWorkspace>();
  auto gemv_scratch = std::make_shared<llm::cuda::HalfActivationScratch>();
  llm::cuda::CudaModelOptions model_options = llm::cuda::cuda_model_options(options.run);
  // Called only while the model is built: `layers` need not outlive it (every
  // quantized layer uploads its own device copy).
  model_options.linear_factory = [&layers, &options, workspace, gemv_scratch](
                                     const std::vector<float>& weight, int out_features, int in_features,
                                     const llm::LinearSite& site,
                                     cublasHandle_t cublas) -> std::unique_ptr<llm::cuda::CudaLinear> {
    const std::optional<QuantizedMatrix> matrix = quantized_matrix_for(layers, site, out_features, in_features);
    if (!matrix) return std::make_unique<llm::cuda::DenseCudaLinear>(weight, out_features, in_features, cublas);
    return std::make_unique<CudaQuantizedLinear>(*matrix, workspace, gemv_scratch, options);
  };
  return std::make_unique<llm::cuda::CudaModel>(weights, std::move(model_options));
}

}  // namespace step06
