#pragma once
// The step's variant table: how the weights are stored. id 0 is the fp32
// baseline; every other row is a quantized format (quant_format.hpp), but for
// the two CUDA-only baselines: id 90, the library row of the CUDA kernel table
// (cuBLAS with fp16 weights), and id 91, the CUDA model table's fp16 model.
// --variant picks rows; --list prints them.
#include <optional>
#include <string>
#include <vector>

#include "llm/harness/variant.hpp"
#include "step06_quantization/quant_format.hpp"

namespace step06 {

// The "function" of a row is its format (nullopt: fp32, no quantization).
using WeightFormat = std::optional<QuantFormat>;

inline constexpr int kFp32VariantId = 0;
inline constexpr int kCublasFp16VariantId = 90;
inline constexpr int kFp16ModelVariantId = 91;

const std::vector<llm::Variant<WeightFormat>>& weight_formats();
// The row with `id` (InputError when there is none).
const llm::Variant<WeightFormat>& weight_format(int id);

// Why a format is skipped on a GPU: int8 activations are CPU kernels only.
inline constexpr const char* kInt8ActivationsCpuOnly =
    "int8 activations: CPU kernels only (the GPU's are W8A16 / W4A16)";

// "fp32" or the format's name.
std::string format_name(const WeightFormat& format);
// The table's id of a format, or kCustomFormatVariantId for one picked with
// --formats that the table does not list (int4-g256, nf4-g32, ...).
inline constexpr int kCustomFormatVariantId = 80;
int variant_id_of(const WeightFormat& format);

}  // namespace step06
