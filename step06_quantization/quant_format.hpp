#pragma once
// Quantized weight formats: how a matrix of fp32 weights is stored in 8 or 4
// bits. A format is data (codes, scales, zero points and their layout); an
// algorithm (RTN, GPTQ, AWQ: quant_algorithms.hpp) chooses the values.
//
// Every format cuts each row of W [out_features, in_features] into groups of
// `group_size` consecutive input columns; each group has its own scale (and,
// for int4 asymmetric, a zero point). A weight is stored as a small integer
// code and read back as
//   int8 per channel   w = q * scale                q in [-127, 127], one group = the whole row
//   int4 asymmetric    w = (q - zero) * scale       q, zero in [0, 15]
//   int4 symmetric     w = (q - 8) * scale          q in [1, 15] (q - 8 in [-7, 7])
//   NF4                w = kNf4Levels[q] * scale    q in [0, 15], scale = absmax of the group
//
// in_features need not be a multiple of the group: the last group of a row is
// shorter, and its storage is padded with zero codes (a padded weight reads
// back as 0, so it adds nothing to a product).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llm/huge_page_allocator.hpp"

namespace step06 {

enum class QuantScheme : std::uint8_t { Int8PerChannel, Int4Asymmetric, Int4Symmetric, NF4 };

// What the product does with its input x (the activations):
//   Fp32        x stays fp32 and every weight is dequantized to fp32 in
//               registers, then multiplied in fp32 (W8A32 / W4A32: the
//               product costs instructions per weight, see section 6.2)
//   Int8Blocks  x is rounded to int8 once per product, in blocks of 32
//               columns with an fp32 scale each (int8_activations.hpp), and
//               the product multiplies integers with integer dot-product
//               instructions (W8A8 / W4A8): the weights stay integers
// The weights are stored the same way in both; the name says which product
// runs ("int8" and "int8-a8" are the same bytes).
enum class ActivationFormat : std::uint8_t { Fp32, Int8Blocks };

// The 16 levels of NF4 (QLoRA, Dettmers et al. 2023): quantiles of a standard
// normal distribution, scaled to [-1, 1], with an exact 0. Weights of trained
// layers are close to normal, so equal-probability levels waste fewer codes
// than equally spaced ones.
inline constexpr std::array<float, 16> kNf4Levels = {
    -1.0f,          -0.6961928f,  -0.52507305f, -0.3949175f, -0.28444138f, -0.18477343f,
    -0.09105004f,   0.0f,         0.0795803f,   0.1609302f,  0.2461123f,   0.33791524f,
    0.44070983f,    0.562617f,    0.72295684f,  1.0f};

struct QuantFormat {
  QuantScheme scheme = QuantScheme::Int8PerChannel;
  int group_size = 0;  // input columns per scale; 0 for int8 per channel (the whole row)
  ActivationFormat activations = ActivationFormat::Fp32;

  // "int8", "int4-g128" (asymmetric), "int4sym-g64", "nf4" (group 64); with
  // int8 activations "-a8" follows ("int8-a8", "int4sym-g32-a8").
  std::string name() const;
  int bits() const { return scheme == QuantScheme::Int8PerChannel ? 8 : 4; }
  bool has_zero_points() const { return scheme == QuantScheme::Int4Asymmetric; }
  bool int8_activations() const { return activations == ActivationFormat::Int8Blocks; }
  // Columns per group of a row of `in_features` (the row itself for int8).
  int group_columns(int in_features) const { return group_size == 0 ? in_features : group_size; }

  // Parses a name as name() prints it. Throws llm::InputError for an unknown
  // format ("supported: int8, int4-gN, int4sym-gN, nf4"), a group size that
  // is not a multiple of 32 between 32 and 1024 (a group is whole 16-byte packs
  // of 32 codes: what the SIMD and CUDA kernels unpack at once), or NF4 with
  // int8 activations (its levels are not integers: no integer dot product).
  static QuantFormat parse(std::string_view name);
  auto operator<=>(const QuantFormat&) const = default;
};

// One group's parameters: w = (code - zero) * scale for int4 asymmetric, and
// as the table above says for the other schemes (zero unused there).
struct GroupParams {
  float scale = 0.0f;
  float zero = 0.0f;  // an integer in [0, 15] (int4 asymmetric only)
};

// Round to nearest, the building block of every algorithm:
// the parameters that cover `values` (one group of one row) with the
// scheme's codes (absmax / 127, absmax / 7, (max - min) / 15 with the zero
// point that puts min on a code, absmax for NF4). An all-zero group gets
// scale 0 and reads back as zeros.
GroupParams choose_group_params(QuantScheme scheme, std::span<const float> values);
// The code nearest to `weight` under `params` (clamped to the scheme's range).
int quantize_to_code(QuantScheme scheme, float weight, const GroupParams& params);
// The value a code stands for.
float code_value(QuantScheme scheme, int code, const GroupParams& params);

// A quantized matrix W [out_features, in_features], as the kernels read it.
struct QuantizedMatrix {
  QuantFormat format;
  int out_features = 0;
  int in_features = 0;
  int group_columns = 0;    // columns per group (in_features for int8 per channel)
  int groups_per_row = 0;   // ceil(in_features / group_columns)
  int padded_in = 0;        // groups_per_row * group_columns: codes stored per row

  // The codes, row by row:
  //   int8: [out_features, padded_in] int8 values (two's complement bytes)
  //   4-bit: [out_features, padded_in / 2] bytes; byte j of a row holds
  //          column 2j in its low nibble and column 2j + 1 in its high nibble
  // Codes, scales and zero points are what a decode token streams through:
  // on huge pages, as the fp32 weights of llm::DenseLinear (with 4 KiB
  // pages a pass misses the TLB every 4 KiB and the CPU's prefetchers stop
  // at every page boundary; llm/huge_page_allocator.hpp).
  llm::HugePageVector<std::uint8_t> packed;
  llm::HugePageVector<float> scales;        // [out_features, groups_per_row]
  llm::HugePageVector<std::uint8_t> zeros;  // [out_features, groups_per_row] int4 asymmetric only, else empty
  // AWQ: the matrix stores Q(W diag(s)); the product divides x by s first:
  // y = Q(W diag(s)) (x / s). [in_features] or empty (no input scaling).
  std::vector<float> input_scales;

  std::size_t bytes_per_row() const { return format.bits() == 8 ? padded_in : padded_in / 2; }
  // Bytes a product reads: codes, scales, zero points, input scales.
  std::size_t bytes() const;
  // bytes() / (out_features * in_features) : 4 for fp32, about 1.0 for
  // int8, 0.5 + 5/64 = 0.578 for int4-g64 (an fp32 scale and a uint8 zero per 64).
  double bytes_per_weight() const;
  // Code of (row, column), 0 <= column < padded_in (as stored: the int8 value,
  // or the 4-bit code 0..15).
  int code(int row, int column) const;
  const GroupParams params(int row, int group) const;
};

// Packs codes [out_features, in_features] (row-major) and per-group
// parameters [out_features, groups_per_row] into a QuantizedMatrix. Throws
// llm::InputError when a size does not fit, a code is out of the scheme's
// range, or the layer has fewer input columns than one group ("layer too
// small for the group").
QuantizedMatrix pack(const QuantFormat& format, int out_features, int in_features, std::span<const int> codes,
                     std::span<const GroupParams> params);
// The codes back, [out_features, in_features] (padding dropped): unpack(pack(c)) == c.
std::vector<int> unpack_codes(const QuantizedMatrix& matrix);
// The fp32 matrix [out_features, in_features] the quantized one stands for,
// input scales folded in (column j divided by input_scales[j]), so that a
// product with it is what every kernel must reproduce.
std::vector<float> dequantize(const QuantizedMatrix& matrix);

// The matrices' rows one after another: [sum of out_features, in_features],
// the same codes, scales and zero points, so a product with the result is
// the products with each, side by side. How a model that runs the Q, K and V
// projections (or gate and up) as one product keeps them quantized. Throws
// llm::InputError for no matrices, or matrices of different formats, input
// widths or input scales (AWQ's s, which the stacked product divides x by
// once).
QuantizedMatrix stack_rows(std::span<const QuantizedMatrix* const> matrices);

// Throws llm::InputError unless `format` can quantize a [out, in] layer
// (in_features >= one group; a group size the format accepts).
void check_layer_fits(const QuantFormat& format, int out_features, int in_features);

// Throws llm::InputError, its message starting with `product`, unless
// `matrix` is consistent, as the GPU kernels read it without bounds checks
// (it may be built by hand, not by pack): positive sizes; the format's
// groups (4-bit: whole 32-column vectors, a 16-byte load each) with
// padded_in = groups_per_row * group_columns >= in_features; code bytes,
// scales and zero points of out_features rows of those; input scales none or
// in_features; scales finite and >= 0, input scales finite and not 0.
void check_gpu_quantized_matrix(const QuantizedMatrix& matrix, const std::string& product);

}  // namespace step06
