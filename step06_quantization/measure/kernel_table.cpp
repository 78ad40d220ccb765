#include "step06_quantization/measure/kernel_table.hpp"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <span>

#include "llm/config.hpp"
#include "llm/errors.hpp"
#include "llm/harness/timer.hpp"
#include "llm/linear.hpp"
#include "llm/harness/cpu_cache_flush.hpp"
#include "step06_quantization/measure/cpu_bandwidth.hpp"
#include "step06_quantization/cpu_quantized_linear.hpp"
#include "step06_quantization/cuda_quantized_kernels.hpp"
#include "step06_quantization/int8_activations.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/measure/weight_formats.hpp"

namespace step06 {

namespace {

// Normal weights with std 1/sqrt(in) (the presets' init): what RTN meets in a
// trained layer, minus the outliers.
std::vector<float> random_matrix(int rows, int columns, std::uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(columns)));
  std::vector<float> values(static_cast<std::size_t>(rows) * columns);  // [rows, columns]
  for (float& value : values) value = normal(generator);
  return values;
}

// Median time of `product` over `repeats` runs after one warm-up, each after
// a cache flush when `flusher` is given (its time not counted).
llm::TimingStats time_product(const std::function<void()>& product, int repeats, llm::CpuCacheFlusher* flusher) {
  product();  // warm-up: page faults, scratch buffers
  std::vector<double> samples_ms;
  for (int run = 0; run < repeats; ++run) samples_ms.push_back(llm::time_one_run(product, flusher));
  return llm::TimingStats::from_samples(samples_ms);
}

KernelCell new_cell(const std::string& device, const KernelShape& shape, int variant_id, const std::string& format,
                    int rows) {
  KernelCell cell;
  cell.device = device;
  cell.shape = shape;
  cell.variant_id = variant_id;
  cell.format = format;
  cell.rows = rows;
  return cell;
}

// fp32 accumulation in a different order (SIMD lanes, groups) than Eigen's:
// a few ulps per add over up to 11008 terms of O(1/sqrt(in)) products.
constexpr llm::Tolerance kKernelTolerance = {1e-4, 1e-4};

// x [rows, in_features] as the int8-activation kernels see it: each value
// replaced by its int8 block code times the block's scale.
std::vector<float> rounded_to_int8_blocks(const std::vector<float>& x, int rows, int in_features) {
  Int8Activations activations;
  quantize_activations(x.data(), rows, in_features, {}, activations);
  std::vector<float> rounded(x.size());
  for (int r = 0; r < rows; ++r)
    for (int column = 0; column < in_features; ++column)
      rounded[static_cast<std::size_t>(r) * in_features + column] = activations.value(r, column);
  return rounded;
}

void run_cpu_shape(const KernelShape& shape, const std::vector<float>& weight, const KernelTableOptions& options,
                   llm::CpuCacheFlusher* flusher, std::vector<KernelCell>& cells) {
  const llm::DenseLinear fp32(weight, shape.out_features, shape.in_features);
  std::vector<double> fp32_ms;  // [batches]
  for (const int rows : options.batches) {
    const std::vector<float> x = random_matrix(rows, shape.in_features, options.seed + rows);  // [rows, in]
    std::vector<float> y(static_cast<std::size_t>(rows) * shape.out_features);                // [rows, out]
    const llm::TimingStats time = time_product([&] { fp32.forward(x.data(), rows, y.data()); }, options.repeats,
                                               flusher);
    fp32_ms.push_back(time.median_ms);
    KernelCell cell = new_cell("cpu", shape, kFp32VariantId, "fp32", rows);
    cell.time_ms = cell.baseline_ms = time.median_ms;
    cell.weight_bytes = static_cast<double>(fp32.weight_bytes());
    cell.bytes_per_weight = 4.0;
    cell.check = llm::compare(y, y, kKernelTolerance);  // the baseline is its own reference
    cells.push_back(cell);
  }
  for (const QuantFormat& format : options.formats) {
    const int id = variant_id_of(format);
    KernelCell skipped = new_cell("cpu", shape, id, format.name(), 0);
    if (format.group_size > shape.in_features) {
      skipped.skipped = fmt::format("{} input columns: fewer than one group", shape.in_features);
      cells.push_back(skipped);
      continue;
    }
    const QuantizedMatrix matrix = quantize_rtn({weight, shape.out_features, shape.in_features}, format);
    const QuantizedLinear quantized(matrix);
    const llm::DenseLinear reference(dequantize(matrix), shape.out_features, shape.in_features);
    for (std::size_t b = 0; b < options.batches.size(); ++b) {
      const int rows = options.batches[b];
      const std::vector<float> x = random_matrix(rows, shape.in_features, options.seed + 1000 + rows);
      std::vector<float> y(static_cast<std::size_t>(rows) * shape.out_features, NAN);  // poisoned
      std::vector<float> y_reference(y.size());
      // With int8 activations the kernel multiplies x rounded to int8 blocks:
      // the reference is the product with those rounded values (the
      // rounding's effect on the model is part 3's measure, not an error).
      reference.forward(format.int8_activations() ? rounded_to_int8_blocks(x, rows, shape.in_features).data()
                                                  : x.data(),
                        rows, y_reference.data());
      const llm::TimingStats time =
          time_product([&] { quantized.forward(x.data(), rows, y.data()); }, options.repeats, flusher);
      KernelCell cell = new_cell("cpu", shape, id, format.name(), rows);
      cell.time_ms = time.median_ms;
      cell.baseline_ms = fp32_ms[b];
      cell.weight_bytes = static_cast<double>(matrix.bytes());
      cell.bytes_per_weight = matrix.bytes_per_weight();
      cell.check = llm::compare(y, y_reference, kKernelTolerance);
      cells.push_back(cell);
    }
  }
}

void run_cuda_shape(const KernelShape& shape, const std::vector<float>& weight, const KernelTableOptions& options,
                    std::vector<KernelCell>& cells) {
  bool cublas_rows_added = false;
  for (const QuantFormat& format : options.formats) {
    const int id = variant_id_of(format);
    if (format.group_size > shape.in_features || format.int8_activations()) {
      KernelCell skipped = new_cell("cuda", shape, id, format.name(), 0);
      skipped.skipped = format.int8_activations()
                            ? std::string(kInt8ActivationsCpuOnly)
                            : fmt::format("{} input columns: fewer than one group", shape.in_features);
      cells.push_back(skipped);
      continue;
    }
    const QuantizedMatrix matrix = quantize_rtn({weight, shape.out_features, shape.in_features}, format);
    for (const int rows : options.batches) {
      const CudaMatmulTiming timing = time_cuda_quantized_matmul(matrix, rows, options.repeats, options.seed + rows);
      if (!cublas_rows_added) {  // the library row, once per batch (each format's run times it again: same shape)
        KernelCell library = new_cell("cuda", shape, kCublasFp16VariantId, "cublas-fp16", rows);
        library.time_ms = library.baseline_ms = timing.cublas_fp16_ms;
        library.weight_bytes = 2.0 * shape.out_features * shape.in_features;
        library.bytes_per_weight = 2.0;
        library.check.ok = true;  // cuBLAS is the reference library; checked by the step's CUDA tests
        cells.push_back(library);
      }
      KernelCell cell = new_cell("cuda", shape, id, format.name(), rows);
      cell.time_ms = timing.quantized_ms;
      cell.baseline_ms = timing.cublas_fp16_ms;
      cell.weight_bytes = static_cast<double>(matrix.bytes());
      cell.bytes_per_weight = matrix.bytes_per_weight();
      cell.check = timing.check;
      cell.one_shot_ms = timing.one_shot_ms;  // the kernel before the persistent one, same run
      cell.one_shot_check = timing.one_shot_check;
      cell.int4_gemv_ms = timing.int4_gemv_ms;  // the decode kernel (int4, 1..4 rows), same run
      cell.int4_gemv_check = timing.int4_gemv_check;
      cells.push_back(cell);
    }
    cublas_rows_added = true;
  }
}

}  // namespace

std::vector<KernelShape> kernel_shapes(const llm::ModelConfig& this_model, bool include_llama_2_7b) {
  const llm::ModelConfig small = llm::find_preset("small").config;
  std::vector<KernelShape> shapes = {
      {"this model", "w1/w3 (gate, up)", this_model.hidden_dim, this_model.dim},
      {"this model", "w2 (down)", this_model.dim, this_model.hidden_dim},
      {"small", "w1/w3 (gate, up)", small.hidden_dim, small.dim},
      {"small", "classifier", small.vocab_size, small.dim},
  };
  if (include_llama_2_7b) {
    const llm::ModelConfig llama = llm::find_preset("llama2-7b").config;
    shapes.push_back({"llama2-7b", "w1/w3 (gate, up)", llama.hidden_dim, llama.dim});
    shapes.push_back({"llama2-7b", "w2 (down)", llama.dim, llama.hidden_dim});
  }
  return shapes;
}

KernelTable run_kernel_table(const std::vector<KernelShape>& shapes, const KernelTableOptions& options) {
  KernelTable table;
  std::unique_ptr<llm::CpuCacheFlusher> flusher;
  if (options.cpu) {
    table.cpu_read_gbps = measure_cpu_read_bandwidth_gbps(options.repeats, options.buffer_limit_bytes);
    table.cpu_simd = simd_name(detected_simd());
    if (options.flush_caches) flusher = std::make_unique<llm::CpuCacheFlusher>(0, options.buffer_limit_bytes);
  }
  for (std::size_t s = 0; s < shapes.size(); ++s) {
    const KernelShape& shape = shapes[s];
    const std::vector<float> weight = random_matrix(shape.out_features, shape.in_features, options.seed + 7919 * s);
    if (options.cpu) run_cpu_shape(shape, weight, options, flusher.get(), table.cells);
    if (options.cuda) run_cuda_shape(shape, weight, options, table.cells);
  }
  for (KernelCell& cell : table.cells)
    if (cell.skipped.empty()) cell.gb_per_s = cell.weight_bytes / (cell.time_ms * 1e-3) / 1e9;
  return table;
}

}  // namespace step06
