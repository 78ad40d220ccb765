#include "step06_quantization/measure/weight_formats.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"

namespace step06 {

const std::vector<llm::Variant<WeightFormat>>& weight_formats() {
  using llm::Backend;
  // Group sizes: 32 is the finest (most scales, best quality), 128 the
  // common choice for 7B-class models (GPTQ/AWQ checkpoints ship g128).
  static const std::vector<llm::Variant<WeightFormat>> table = {
      {kFp32VariantId, "fp32", "the baseline: 4 bytes a weight", Backend::Any, std::nullopt},
      {1, "int8", "int8 per output channel, symmetric absmax: ~1 byte a weight", Backend::Any,
       QuantFormat::parse("int8")},
      {2, "int4-g32", "int4, groups of 32, scale + zero point: ~0.66 bytes a weight", Backend::Any,
       QuantFormat::parse("int4-g32")},
      {3, "int4-g64", "int4, groups of 64, scale + zero point: ~0.58 bytes a weight", Backend::Any,
       QuantFormat::parse("int4-g64")},
      {4, "int4-g128", "int4, groups of 128, scale + zero point: ~0.54 bytes a weight", Backend::Any,
       QuantFormat::parse("int4-g128")},
      {5, "int4sym-g64", "int4 symmetric (no zero point), groups of 64", Backend::Any,
       QuantFormat::parse("int4sym-g64")},
      {6, "nf4", "4-bit NormalFloat levels, blocks of 64, absmax scale", Backend::Any, QuantFormat::parse("nf4")},
      {7, "int4sym-g32", "int4 symmetric, groups of 32: llama.cpp's Q4_0 layout with an fp32 scale", Backend::Any,
       QuantFormat::parse("int4sym-g32")},
      // Int8 activations (W8A8, W4A8): the same weights, x rounded to int8
      // blocks of 32, integer dot products. CPU only.
      {8, "int8-a8", "int8 weights x int8 activations (blocks of 32): llama.cpp's Q8_0 x Q8_0 product",
       Backend::Cpu, QuantFormat::parse("int8-a8")},
      {9, "int4sym-g32-a8", "int4sym-g32 weights x int8 activations: llama.cpp's Q4_0 x Q8_0 product",
       Backend::Cpu, QuantFormat::parse("int4sym-g32-a8")},
      {10, "int4-g64-a8", "int4-g64 weights (zero points) x int8 activations", Backend::Cpu,
       QuantFormat::parse("int4-g64-a8")},
      {kCublasFp16VariantId, "cublas-fp16", "CUDA kernel table only: cuBLAS GEMM, fp16 weights, fp32 accumulation",
       Backend::Cuda, std::nullopt},
      {kFp16ModelVariantId, "fp16", "CUDA model table only: the fp32 weights in fp16, 2 bytes a weight",
       Backend::Cuda, std::nullopt},
  };
  return table;
}

const llm::Variant<WeightFormat>& weight_format(int id) {
  for (const auto& row : weight_formats())
    if (row.id == id) return row;
  throw llm::InputError(fmt::format("no weight format with id {} (--list shows them)", id));
}

std::string format_name(const WeightFormat& format) { return format ? format->name() : std::string("fp32"); }

int variant_id_of(const WeightFormat& format) {
  // The CUDA-only rows store no format of their own (nullopt, as fp32's row).
  for (const auto& row : weight_formats())
    if (row.fn == format && row.backend != llm::Backend::Cuda) return row.id;
  return kCustomFormatVariantId;
}

}  // namespace step06
