#pragma once
// Part 1: the quantized products alone. For each matrix shape (this model's
// FFN, the `small` preset's, Llama-2-7B's), each format and each batch of
// 1/4/16 rows: time, GB/s of the weight bytes read, % of the measured memory
// bandwidth, speedup over fp32 (CPU: Eigen) or cuBLAS fp16 (CUDA), and the
// error against the fp32 product of the dequantized weights.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/cpu_cache_flush.hpp"
#include "step06_quantization/quant_format.hpp"

namespace step06 {

struct KernelShape {
  std::string model;   // "this model", "small", "llama2-7b"
  std::string matrix;  // "w1/w3 (gate, up)", "w2 (down)", "classifier"
  int out_features = 0;
  int in_features = 0;
};
// The FFN matrices of this model, of the small preset and of Llama-2-7B
// (the last two only with include_llama_2_7b: 1.4 GB of fp32 weights and
// their quantized copies), and the small preset's
// classifier (the largest matrix of stories15M's dims).
std::vector<KernelShape> kernel_shapes(const llm::ModelConfig& this_model, bool include_llama_2_7b);

struct KernelTableOptions {
  std::vector<QuantFormat> formats;  // the quantized formats to run (fp32 / cuBLAS fp16, the baselines, always run)
  std::vector<int> batches = {1, 4, 16};
  int repeats = 5;
  bool flush_caches = true;  // CPU: evict the caches before every timed run (weights come from DRAM, as in decode)
  // The upper bound of the CPU's host buffers: the cache flush and the
  // bandwidth probe's (llm::kDefaultRunFlushLimit in a default run).
  std::size_t buffer_limit_bytes = llm::kFullRunFlushLimit;
  bool cpu = true;
  bool cuda = false;
  std::uint64_t seed = 42;
};

struct KernelCell {
  std::string device;  // "cpu" or "cuda"
  KernelShape shape;
  int variant_id = 0;
  std::string format;  // the row's name ("fp32", "int4-g128", "cublas-fp16")
  int rows = 1;
  std::string skipped;     // why the cell did not run ("layer too small for the group"), else empty
  double time_ms = 0.0;    // median
  double baseline_ms = 0.0;  // the same device's baseline at the same shape and rows (fp32 / cuBLAS fp16)
  double weight_bytes = 0.0;  // bytes the product reads for its weights (codes + scales)
  double gb_per_s = 0.0;      // weight_bytes / time
  double bytes_per_weight = 0.0;
  llm::CompareResult check;   // vs the fp32 product of the dequantized weights
  // CUDA quantized cells: time_ms and check are the persistent pipelined
  // kernel's (the default); these are the one-shot split-K kernel's on the
  // same x, timed in the same call (0 and unchecked in every other cell).
  double one_shot_ms = 0.0;
  llm::CompareResult one_shot_check;
  // CUDA int4 cells of 1..4 rows: the int4 decode GEMV on the same x (fp32
  // in and out), timed in the same call; 0 and unchecked elsewhere.
  double int4_gemv_ms = 0.0;
  llm::CompareResult int4_gemv_check;
};

struct KernelTable {
  std::vector<KernelCell> cells;
  double cpu_read_gbps = 0.0;   // measured, one thread
  std::string cpu_simd;         // the SIMD level the CPU kernels ran with
};

KernelTable run_kernel_table(const std::vector<KernelShape>& shapes, const KernelTableOptions& options);

}  // namespace step06
