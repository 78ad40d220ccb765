#include "step06_quantization/quant_format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"

namespace step06 {

namespace {

constexpr int kNf4DefaultBlock = 64;  // QLoRA's block size

// The group size after "-g" in a name; InputError unless a multiple of 32 in [32, 1024].
int parse_group_size(std::string_view name, std::string_view digits) {
  int group = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), group);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty())
    throw llm::InputError(fmt::format("quantization format '{}': '{}' is not a group size", name, digits));
  if (group < 32 || group > 1024 || group % 32 != 0)
    throw llm::InputError(fmt::format(
        "quantization format '{}': group size {} must be a multiple of 32 between 32 and 1024 (a group is whole "
        "16-byte packs of 32 4-bit codes, what the kernels unpack at once)",
        name, group));
  return group;
}

int code_min(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return -127;
    case QuantScheme::Int4Symmetric: return 1;  // q - 8 in [-7, 7]
    default: return 0;
  }
}
int code_max(QuantScheme scheme) { return scheme == QuantScheme::Int8PerChannel ? 127 : 15; }

constexpr std::string_view kInt8ActivationsSuffix = "-a8";

std::string weights_name(QuantScheme scheme, int group_size) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return "int8";
    case QuantScheme::Int4Asymmetric: return fmt::format("int4-g{}", group_size);
    case QuantScheme::Int4Symmetric: return fmt::format("int4sym-g{}", group_size);
    case QuantScheme::NF4:
      return group_size == kNf4DefaultBlock ? std::string("nf4") : fmt::format("nf4-g{}", group_size);
  }
  return "unknown";
}

// The weights part of a name ("int4-g64" of "int4-g64-a8").
QuantFormat parse_weights(std::string_view full_name, std::string_view name) {
  const auto group_after = [&](std::string_view prefix) {
    return parse_group_size(full_name, name.substr(prefix.size()));
  };
  if (name == "int8") return {QuantScheme::Int8PerChannel, 0};
  if (name == "nf4") return {QuantScheme::NF4, kNf4DefaultBlock};
  if (name.starts_with("nf4-g")) return {QuantScheme::NF4, group_after("nf4-g")};
  if (name.starts_with("int4sym-g")) return {QuantScheme::Int4Symmetric, group_after("int4sym-g")};
  if (name.starts_with("int4-g")) return {QuantScheme::Int4Asymmetric, group_after("int4-g")};
  throw llm::InputError(
      fmt::format("unsupported quantization format '{}' (supported: int8, int4-gN, int4sym-gN, nf4, nf4-gN; N a "
                  "multiple of 32; '-a8' after any but nf4 for int8 activations)",
                  full_name));
}

}  // namespace

std::string QuantFormat::name() const {
  const std::string weights = weights_name(scheme, group_size);
  return int8_activations() ? weights + std::string(kInt8ActivationsSuffix) : weights;
}

QuantFormat QuantFormat::parse(std::string_view name) {
  if (!name.ends_with(kInt8ActivationsSuffix)) return parse_weights(name, name);
  QuantFormat format = parse_weights(name, name.substr(0, name.size() - kInt8ActivationsSuffix.size()));
  if (format.scheme == QuantScheme::NF4)
    throw llm::InputError(fmt::format(
        "quantization format '{}': NF4's levels are not integers, so its products cannot run as integer dot "
        "products; int8 activations go with int8, int4-gN and int4sym-gN",
        name));
  format.activations = ActivationFormat::Int8Blocks;
  return format;
}

GroupParams choose_group_params(QuantScheme scheme, std::span<const float> values) {
  float lo = 0.0f, hi = 0.0f, absmax = 0.0f;
  for (float v : values) {
    lo = std::min(lo, v);  // min and max include 0, so 0 is always representable
    hi = std::max(hi, v);
    absmax = std::max(absmax, std::fabs(v));
  }
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return {absmax / 127.0f, 0.0f};
    case QuantScheme::Int4Symmetric: return {absmax / 7.0f, 0.0f};
    case QuantScheme::NF4: return {absmax, 0.0f};
    case QuantScheme::Int4Asymmetric: {
      // BEGIN EXERCISE ex06.2
      // 16 equal steps from lo to hi; the zero point is the code that stands
      // for 0.0, so exact zeros (padding, pruned weights) stay exact.
      const float scale = (hi - lo) / 15.0f;
      if (scale == 0.0f) return {0.0f, 0.0f};
      return {scale, std::clamp(std::round(-lo / scale), 0.0f, 15.0f)};
      // END EXERCISE ex06.2
    }
  }
  return {};
}

int quantize_to_code(QuantScheme scheme, float weight, const GroupParams& params) {
  if (scheme == QuantScheme::NF4) {
    if (params.scale == 0.0f) return 7;  // kNf4Levels[7] == 0
    // The nearest of the 16 levels (they are sorted: the first one past the
    // midpoint between neighbours).
    const float normalized = weight / params.scale;
    int code = 0;
    while (code < 15 && normalized > 0.5f * (kNf4Levels[code] + kNf4Levels[code + 1])) ++code;
    return code;
  }
  if (scheme == QuantScheme::Int4Asymmetric) {
    // BEGIN EXERCISE ex06.2
    // The zero point's code stands for 0.0: a weight is that code plus its
    // number of steps, rounded, then clamped to the 16 codes (a weight past
    // the group's range, as GPTQ's updated ones can be, gets the extreme
    // code). An all-zero group (scale 0) stores its zero point everywhere.
    if (params.scale == 0.0f) return static_cast<int>(params.zero);
    const float code = std::round(weight / params.scale) + params.zero;
    return static_cast<int>(std::clamp(code, 0.0f, 15.0f));
    // END EXERCISE ex06.2
  }
  if (params.scale == 0.0f) return scheme == QuantScheme::Int4Symmetric ? 8 : static_cast<int>(params.zero);
  float code = std::round(weight / params.scale);
  if (scheme == QuantScheme::Int4Symmetric) code += 8.0f;
  return static_cast<int>(std::clamp(code, static_cast<float>(code_min(scheme)), static_cast<float>(code_max(scheme))));
}

float code_value(QuantScheme scheme, int code, const GroupParams& params) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return static_cast<float>(code) * params.scale;
    case QuantScheme::Int4Asymmetric: return (static_cast<float>(code) - params.zero) * params.scale;
    case QuantScheme::Int4Symmetric: return static_cast<float>(code - 8) * params.scale;
    case QuantScheme::NF4: return kNf4Levels[static_cast<std::size_t>(code & 15)] * params.scale;
  }
  return 0.0f;
}

std::size_t QuantizedMatrix::bytes() const {
  return packed.size() + scales.size() * sizeof(float) + zeros.size() + input_scales.size() * sizeof(float);
}

double QuantizedMatrix::bytes_per_weight() const {
  return static_cast<double>(bytes()) / (static_cast<double>(out_features) * in_features);
}

int QuantizedMatrix::code(int row, int column) const {
  const std::size_t row_start = static_cast<std::size_t>(row) * bytes_per_row();
  if (format.bits() == 8) return static_cast<std::int8_t>(packed[row_start + column]);
  // BEGIN EXERCISE ex06.1
  // Two codes per byte: column 2j in the low nibble of byte j, 2j + 1 in the high one.
  const std::uint8_t byte = packed[row_start + column / 2];
  return column % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
  // END EXERCISE ex06.1
}

const GroupParams QuantizedMatrix::params(int row, int group) const {
  const std::size_t index = static_cast<std::size_t>(row) * groups_per_row + group;
  return {scales[index], zeros.empty() ? 0.0f : static_cast<float>(zeros[index])};
}

void check_layer_fits(const QuantFormat& format, int out_features, int in_features) {
  if (out_features <= 0 || in_features <= 0)
    throw llm::InputError(fmt::format("quantize: a [{}, {}] layer has no weights", out_features, in_features));
  if (format.group_size != 0 && in_features < format.group_size)
    throw llm::InputError(fmt::format(
        "quantize {}: the layer has {} input columns, fewer than one group of {} (layer too small for the group; "
        "pick a smaller group)",
        format.name(), in_features, format.group_size));
}

void check_gpu_quantized_matrix(const QuantizedMatrix& matrix, const std::string& product) {
  const QuantFormat& format = matrix.format;
  const auto fail = [&](const std::string& what) {
    throw llm::InputError(fmt::format("{}: the {} matrix [{}, {}] {}", product, format.name(), matrix.out_features,
                                      matrix.in_features, what));
  };
  if (matrix.out_features <= 0 || matrix.in_features <= 0) fail("has no weights");
  const int group_columns = format.group_columns(matrix.in_features);
  const int groups_per_row = (matrix.in_features + group_columns - 1) / group_columns;
  const int padded_in = groups_per_row * group_columns;
  if (matrix.group_columns != group_columns || matrix.groups_per_row != groups_per_row ||
      matrix.padded_in != padded_in)
    fail(fmt::format("has groups of {} columns, {} a row, padded to {} columns; expected groups of {} columns, {} a "
                     "row, padded to {}",
                     matrix.group_columns, matrix.groups_per_row, matrix.padded_in, group_columns, groups_per_row,
                     padded_in));
  constexpr int kCodesPerLoad = 32;  // 4-bit codes in a GPU kernel's 16-byte load, inside one group
  if (format.bits() == 4 && group_columns % kCodesPerLoad != 0)
    fail(fmt::format("has groups of {} columns; expected whole 32-column vectors of 4-bit codes", group_columns));
  const auto out = static_cast<std::size_t>(matrix.out_features);
  const std::size_t code_bytes = out * matrix.bytes_per_row();
  const std::size_t groups = out * static_cast<std::size_t>(groups_per_row);
  const std::size_t zero_points = format.has_zero_points() ? groups : 0;
  const auto in = static_cast<std::size_t>(matrix.in_features);
  if (matrix.packed.size() != code_bytes || matrix.scales.size() != groups || matrix.zeros.size() != zero_points ||
      (!matrix.input_scales.empty() && matrix.input_scales.size() != in))
    fail(fmt::format("has {} code bytes, {} scales, {} zero points and {} input scales; expected {}, {}, {} and 0 "
                     "or {}",
                     matrix.packed.size(), matrix.scales.size(), matrix.zeros.size(), matrix.input_scales.size(),
                     code_bytes, groups, zero_points, in));
  for (std::size_t i = 0; i < matrix.scales.size(); ++i)
    if (const float scale = matrix.scales[i]; !std::isfinite(scale) || scale < 0.0f)
      fail(fmt::format("has group scale {} (scale {}); expected finite scales >= 0", scale, i));
  for (std::size_t i = 0; i < matrix.input_scales.size(); ++i)
    if (const float scale = matrix.input_scales[i]; !std::isfinite(scale) || scale == 0.0f)
      fail(fmt::format("has input scale {} (column {}); expected finite, non-zero input scales", scale, i));
}

QuantizedMatrix pack(const QuantFormat& format, int out_features, int in_features, std::span<const int> codes,
                     std::span<const GroupParams> params) {
  check_layer_fits(format, out_features, in_features);
  QuantizedMatrix matrix;
  matrix.format = format;
  matrix.out_features = out_features;
  matrix.in_features = in_features;
  matrix.group_columns = format.group_columns(in_features);
  matrix.groups_per_row = (in_features + matrix.group_columns - 1) / matrix.group_columns;
  matrix.padded_in = matrix.groups_per_row * matrix.group_columns;
  const std::size_t n_groups = static_cast<std::size_t>(out_features) * matrix.groups_per_row;
  if (codes.size() != static_cast<std::size_t>(out_features) * in_features || params.size() != n_groups)
    throw llm::InputError(fmt::format("pack {}: {} codes and {} group parameters do not fit a [{}, {}] layer "
                                      "({} groups)",
                                      format.name(), codes.size(), params.size(), out_features, in_features,
                                      n_groups));
  // Padding columns get the code that reads back as 0: int8's 0, the zero
  // point of int4 asymmetric (the code that stands for 0.0), int4
  // symmetric's 8, NF4's level 0.0.
  const auto padding_code = [&](const GroupParams& p) {
    switch (format.scheme) {
      case QuantScheme::Int8PerChannel: return 0;
      case QuantScheme::Int4Asymmetric: return static_cast<int>(p.zero);
      default: return quantize_to_code(format.scheme, 0.0f, p);
    }
  };
  // matrix.packed starts all zero: a 4-bit code is OR-ed into its half of a byte.
  matrix.packed.assign(static_cast<std::size_t>(out_features) * matrix.bytes_per_row(), 0);
  for (int row = 0; row < out_features; ++row) {
    std::uint8_t* row_bytes = matrix.packed.data() + static_cast<std::size_t>(row) * matrix.bytes_per_row();
    for (int column = 0; column < matrix.padded_in; ++column) {
      const std::size_t group = static_cast<std::size_t>(row) * matrix.groups_per_row + column / matrix.group_columns;
      const GroupParams& p = params[group];
      const int code = column < in_features ? codes[static_cast<std::size_t>(row) * in_features + column]
                                            : padding_code(p);
      if (code < code_min(format.scheme) || code > code_max(format.scheme))
        throw llm::InputError(fmt::format("pack {}: code {} at ({}, {}) is outside [{}, {}]", format.name(), code, row,
                                          column, code_min(format.scheme), code_max(format.scheme)));
      if (format.bits() == 8) {
        row_bytes[column] = static_cast<std::uint8_t>(static_cast<std::int8_t>(code));
      } else {
        // BEGIN EXERCISE ex06.1
        // Byte column / 2 of the row: an even column's code in its low
        // nibble, an odd column's in its high nibble (the layout every
        // kernel reads, and code() reads back).
        row_bytes[column / 2] |= static_cast<std::uint8_t>(code << (4 * (column % 2)));
        // END EXERCISE ex06.1
      }
    }
  }
  matrix.scales.resize(n_groups);
  if (format.has_zero_points()) matrix.zeros.resize(n_groups);
  for (std::size_t g = 0; g < n_groups; ++g) {
    if (!std::isfinite(params[g].scale) || params[g].scale < 0.0f)
      throw llm::InputError(fmt::format("pack {}: group {} has scale {}", format.name(), g, params[g].scale));
    matrix.scales[g] = params[g].scale;
    if (format.has_zero_points()) matrix.zeros[g] = static_cast<std::uint8_t>(params[g].zero);
  }
  return matrix;
}

QuantizedMatrix stack_rows(std::span<const QuantizedMatrix* const> matrices) {
  if (matrices.empty()) throw llm::InputError("stack_rows: no matrices");
  const QuantizedMatrix& first = *matrices.front();
  QuantizedMatrix stacked;
  stacked.format = first.format;
  stacked.in_features = first.in_features;
  stacked.group_columns = first.group_columns;
  stacked.groups_per_row = first.groups_per_row;
  stacked.padded_in = first.padded_in;
  stacked.input_scales = first.input_scales;
  for (const QuantizedMatrix* matrix : matrices) {
    if (matrix->format != first.format || matrix->in_features != first.in_features ||
        matrix->input_scales != first.input_scales)
      throw llm::InputError(fmt::format("stack_rows: a {} [{}, {}] matrix{} cannot go under a {} [{}, {}] one{}",
                                        matrix->format.name(), matrix->out_features, matrix->in_features,
                                        matrix->input_scales.empty() ? "" : " with input scales",
                                        first.format.name(), first.out_features, first.in_features,
                                        first.input_scales.empty() ? "" : " with input scales"));
    stacked.out_features += matrix->out_features;
    stacked.packed.insert(stacked.packed.end(), matrix->packed.begin(), matrix->packed.end());
    stacked.scales.insert(stacked.scales.end(), matrix->scales.begin(), matrix->scales.end());
    stacked.zeros.insert(stacked.zeros.end(), matrix->zeros.begin(), matrix->zeros.end());
  }
  return stacked;
}

std::vector<int> unpack_codes(const QuantizedMatrix& matrix) {
  std::vector<int> codes(static_cast<std::size_t>(matrix.out_features) * matrix.in_features);
  for (int row = 0; row < matrix.out_features; ++row)
    for (int column = 0; column < matrix.in_features; ++column)
      codes[static_cast<std::size_t>(row) * matrix.in_features + column] = matrix.code(row, column);
  return codes;
}

std::vector<float> dequantize(const QuantizedMatrix& matrix) {
  std::vector<float> weight(static_cast<std::size_t>(matrix.out_features) * matrix.in_features);
  for (int row = 0; row < matrix.out_features; ++row) {
    for (int column = 0; column < matrix.in_features; ++column) {
      const GroupParams p = matrix.params(row, column / matrix.group_columns);
      float value = code_value(matrix.format.scheme, matrix.code(row, column), p);
      if (!matrix.input_scales.empty()) value /= matrix.input_scales[static_cast<std::size_t>(column)];
      weight[static_cast<std::size_t>(row) * matrix.in_features + column] = value;
    }
  }
  return weight;
}

}  // namespace step06
