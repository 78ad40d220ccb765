// The quantized product on the CPU (cpu_quantized_linear.hpp):
//   y[rows, out_features] = x[rows, in_features] . W~^T,   W~ = dequantize(matrix),
// computed from the packed codes; no dequantized copy of W is ever written.
//
// This file: the two portable kernels (plain C++, the references to read
// first): fp32 x with one weight at a time, exactly as dequantize() defines
// it, and int8 x (int8_activations.hpp) with integer dot products per block
// of 32; then the prepared inputs and the loop of tiles the SIMD kernels
// share, and the run-time pick. The tuned kernels follow in
// cpu_quantized_linear_avx2.cpp (8 floats per register) and
// cpu_quantized_linear_avx512.cpp (16), and for int8 x in
// cpu_quantized_linear_a8_avx2.cpp and cpu_quantized_linear_a8_avx512.cpp
// (VNNI), compiled with per-function target attributes: one binary carries
// them all and picks from what the CPU reports, never from the build's -march.
// Why the SIMD kernels are fast (instructions per weight, register tiles,
// blocks of codes kept in L1): docs/06_quantization.md, section 6.2.
#include "step06_quantization/cpu_quantized_linear.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "llm/errors.hpp"
#include "step06_quantization/cpu_quantized_linear_kernels.hpp"
#include "step06_quantization/int8_activations.hpp"

namespace step06 {

using cpu_kernels::kBlockColumns;

namespace {

// Rows of x per pass over W: up to this many rows, every weight is read from
// memory once; beyond, once per pass.
constexpr int kRowsPerPass = 16;
// Bytes of codes per block of output features: the block stays in L1 (32-48
// KB) beside the prepared x while every row tile runs over it.
constexpr std::size_t kCodeBytesPerOutputBlock = 8 * 1024;

bool is_four_bit(QuantScheme scheme) { return scheme != QuantScheme::Int8PerChannel; }

// Throws InputError unless the matrix's sizes are consistent (what every
// kernel below relies on to stay inside its buffers).
void check_matrix(const QuantizedMatrix& m) {
  const bool four_bit = is_four_bit(m.format.scheme);
  const std::size_t out = static_cast<std::size_t>(std::max(m.out_features, 0));
  const std::size_t groups = out * static_cast<std::size_t>(std::max(m.groups_per_row, 0));
  const bool consistent =
      m.out_features > 0 && m.in_features > 0 && m.group_columns > 0 && m.groups_per_row > 0 &&
      m.padded_in == m.groups_per_row * m.group_columns && m.padded_in >= m.in_features &&
      m.padded_in - m.group_columns < m.in_features && (!four_bit || m.group_columns % kBlockColumns == 0) &&
      m.packed.size() == out * m.bytes_per_row() && m.scales.size() == groups &&
      m.zeros.size() == (m.format.has_zero_points() ? groups : 0) &&
      (m.input_scales.empty() || m.input_scales.size() == static_cast<std::size_t>(m.in_features));
  if (!consistent)
    throw llm::InputError(fmt::format(
        "quantized product: the {} matrix [{}, {}] is inconsistent (group {}, {} groups per row, padded to {}; {} "
        "code bytes, {} scales, {} zero points, {} input scales)",
        m.format.name(), m.out_features, m.in_features, m.group_columns, m.groups_per_row, m.padded_in,
        m.packed.size(), m.scales.size(), m.zeros.size(), m.input_scales.size()));
  if (m.format.int8_activations() && m.format.scheme == QuantScheme::NF4)
    throw llm::InputError("quantized product: NF4 weights with int8 activations (NF4's levels are not integers)");
  // The AVX-512 kernels index a 16-row table with the zero point. (A scan of
  // out * groups bytes: done once per QuantizedLinear, once per call of the
  // free function.)
  const auto zero_out_of_range = std::find_if(m.zeros.begin(), m.zeros.end(), [](std::uint8_t z) { return z > 15; });
  if (zero_out_of_range != m.zeros.end())
    throw llm::InputError(fmt::format("quantized product: the {} matrix has zero point {} (group {}), outside [0, 15]",
                                      m.format.name(), *zero_out_of_range, zero_out_of_range - m.zeros.begin()));
}

// ---------------------------------------------------------------------------
// The prepared input.

// The 4-bit kernels' order of x. A byte of 4-bit codes holds column 2j in its
// low nibble and 2j + 1 in its high one, so one 16-byte unit of 32 columns
// splits into a vector of its even columns (the low nibbles) and one of its
// odd columns (the high nibbles). x is stored the same way, block by block:
// [x0 x2 ... x30 | x1 x3 ... x31], so both vectors multiply plain contiguous
// loads of x.
enum class InputOrder { Natural, EvenOdd };

// prepared [rows, stride]: x [rows, in] divided column by column by the input
// scales (if any), each row zero-padded from in to stride, columns in `order`.
// (Run once per call: for a small layer at one row it is a visible part of
// the call, so the loops are the plain ones a compiler vectorizes.)
void prepare_input(const QuantizedMatrix& m, const float* x, int rows, int stride, InputOrder order,
                   std::vector<float>& prepared) {
  const int in = m.in_features;
  prepared.resize(static_cast<std::size_t>(rows) * stride);
  for (int r = 0; r < rows; ++r) {
    const float* x_row = x + static_cast<std::size_t>(r) * in;
    float* row = prepared.data() + static_cast<std::size_t>(r) * stride;
    if (m.input_scales.empty()) {
      std::copy(x_row, x_row + in, row);
    } else {
      for (int column = 0; column < in; ++column) row[column] = x_row[column] / m.input_scales[column];
    }
    std::fill(row + in, row + stride, 0.0f);
    if (order == InputOrder::EvenOdd) {
      // Each 32-column block to [evens | odds], through a copy of the block.
      for (int block = 0; block < stride; block += kBlockColumns) {
        float natural[kBlockColumns];
        std::copy(row + block, row + block + kBlockColumns, natural);
        for (int j = 0; j < kBlockColumns / 2; ++j) {
          row[block + j] = natural[2 * j];
          row[block + kBlockColumns / 2 + j] = natural[2 * j + 1];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The portable kernel: the reference, in plain C++. y[r, o] is the sum over
// output o's groups of the sum over the group's columns of w~ * x[r, column],
// with every w~ exactly as dequantize() computes it: a 4-bit code stands for
// one of 16 values in its group, computed once per group with code_value()
// and looked up per weight; an int8 weight is its code times the row's scale.
// Output features outer: a row of codes (a few hundred bytes) comes from
// memory once and stays in L1 for every row of x.

// x: prepared [rows, in_features] (natural order, input scales divided out).
void matmul_portable(const QuantizedMatrix& m, const float* x, int rows, float* y) {
  const bool four_bit = is_four_bit(m.format.scheme);
  for (int o = 0; o < m.out_features; ++o) {
    const std::uint8_t* codes = m.packed.data() + static_cast<std::size_t>(o) * m.bytes_per_row();  // row o
    for (int r = 0; r < rows; ++r) y[static_cast<std::size_t>(r) * m.out_features + o] = 0.0f;
    for (int g = 0; g < m.groups_per_row; ++g) {
      const GroupParams params = m.params(o, g);
      float values[16] = {};  // 4-bit: values[code] = the weight the code stands for in this group
      if (four_bit)
        for (int code = 0; code < 16; ++code) values[code] = code_value(m.format.scheme, code, params);
      const int first = g * m.group_columns;
      const int end = std::min(m.in_features, first + m.group_columns);
      for (int r = 0; r < rows; ++r) {
        const float* x_row = x + static_cast<std::size_t>(r) * m.in_features;
        float group_sum = 0.0f;
        for (int column = first; column < end; ++column) {
          // Byte j of a 4-bit row: column 2j in the low nibble, 2j + 1 in the high one.
          const float weight =
              four_bit ? values[column % 2 == 0 ? codes[column / 2] & 0x0F : codes[column / 2] >> 4]
                       : static_cast<float>(static_cast<std::int8_t>(codes[column])) * params.scale;
          group_sum += weight * x_row[column];
        }
        y[static_cast<std::size_t>(r) * m.out_features + o] += group_sum;
      }
    }
  }
}

// The integer weight of (row o, column) as the integer products use it: the
// int8 code, or the 4-bit code minus its group's zero point (8 for the
// symmetric scheme). w~ = integer weight * group scale.
int integer_weight(const QuantizedMatrix& m, const std::uint8_t* row_codes, int o, int column) {
  if (!is_four_bit(m.format.scheme)) return static_cast<std::int8_t>(row_codes[column]);
  const int code = column % 2 == 0 ? row_codes[column / 2] & 0x0F : row_codes[column / 2] >> 4;
  if (m.format.scheme == QuantScheme::Int4Symmetric) return code - 8;
  return code - m.zeros[static_cast<std::size_t>(o) * m.groups_per_row + column / m.group_columns];
}

// The portable kernel with int8 activations: the reference for the integer
// products. x is int8 codes with one scale per 32-column block, the weights
// are integers with one scale per group, so for output o and row r
//   y = sum over groups g of  scale_w[o, g] * sum over blocks b of g of
//         scale_x[r, b] * (sum over the block's columns j of w[o, j] * code_x[r, j])
// The innermost sum is exact in int32 (32 products of at most 127 * 127):
// it is what the SIMD kernels' integer dot-product instructions compute. Only
// the two scales per block are floating-point work, not one multiply per
// weight. (A group is whole blocks: 4-bit groups are multiples of 32 columns,
// int8's group is the whole row.)
//
// Kept scalar: GCC 12 at -O3 -march=native on a CPU with VNNI vectorizes the
// signed 8-bit dot product below into vpdpbusd, which reads one of its
// operands as unsigned bytes, and the results are wrong (a reference must not
// depend on that).
#if defined(__GNUC__) && !defined(__clang__)
#define STEP06_SCALAR_REFERENCE __attribute__((optimize("no-tree-vectorize")))
#else
#define STEP06_SCALAR_REFERENCE
#endif
STEP06_SCALAR_REFERENCE void matmul_int8_activations_portable(const QuantizedMatrix& m, const Int8Activations& x,
                                                              float* y) {
  for (int o = 0; o < m.out_features; ++o) {
    const std::uint8_t* row_codes = m.packed.data() + static_cast<std::size_t>(o) * m.bytes_per_row();
    for (int r = 0; r < x.rows; ++r) {
      const std::int8_t* x_codes = x.codes.data() + static_cast<std::size_t>(r) * x.codes_per_row;
      const float* x_scales = x.scales.data() + static_cast<std::size_t>(r) * x.blocks_per_row;
      float total = 0.0f;
      for (int g = 0; g < m.groups_per_row; ++g) {
        const int first = g * m.group_columns;
        const int end = std::min(m.in_features, first + m.group_columns);
        float group_sum = 0.0f;
        for (int block = first; block < end; block += kActivationBlockColumns) {
          std::int32_t dot = 0;
          for (int column = block; column < std::min(end, block + kActivationBlockColumns); ++column)
            dot += integer_weight(m, row_codes, o, column) * x_codes[column];
          group_sum += x_scales[block / kActivationBlockColumns] * static_cast<float>(dot);
        }
        total += m.scales[static_cast<std::size_t>(o) * m.groups_per_row + g] * group_sum;
      }
      y[static_cast<std::size_t>(r) * m.out_features + o] = total;
    }
  }
}

#if STEP06_X86_KERNELS

// ---------------------------------------------------------------------------
// The loop that hands the SIMD kernels their tiles.

using cpu_kernels::Product;
using cpu_kernels::TileKernel;

int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// The loop nest around the tile kernels (kernels[n - 1] does n rows):
//   passes of 16 rows of x        (their prepared x, <= 16 * padded_in floats, stays in L1/L2)
//     blocks of output features   (~8 KB of codes: read from memory once, then from L1)
//       tiles of rows             (one kernel call: the tile's accumulators live in registers)
template <class ProductType, class Kernel>
void run_tiles(const ProductType& product, int rows, std::span<const Kernel> kernels) {
  const QuantizedMatrix& m = *product.matrix;
  const int tile_rows = static_cast<int>(kernels.size());
  for (int pass = 0; pass < rows; pass += kRowsPerPass) {
    const int pass_end = std::min(rows, pass + kRowsPerPass);
    // With one tile the codes are read once anyway: no blocks (a block's last
    // few outputs run one at a time, slower). Else blocks of whole groups of 8
    // outputs (the kernels do 2-4 at once).
    const int block_outputs =
        pass_end - pass <= tile_rows
            ? m.out_features
            : static_cast<int>(std::max<std::size_t>(8, kCodeBytesPerOutputBlock / m.bytes_per_row() / 8 * 8));
    for (int out_begin = 0; out_begin < m.out_features; out_begin += block_outputs) {
      const int out_end = std::min(m.out_features, out_begin + block_outputs);
      // The pass's rows in tiles as even as possible (5 rows: 3 + 2, not 4 + 1):
      // a tile of one row decodes every weight for one row's worth of FMAs.
      const int pass_rows = pass_end - pass;
      const int tiles = (pass_rows + tile_rows - 1) / tile_rows;
      for (int tile = 0, first_row = pass; tile < tiles; ++tile) {
        const int n = pass_rows / tiles + (tile < pass_rows % tiles ? 1 : 0);
        kernels[static_cast<std::size_t>(n - 1)](product, out_begin, out_end, first_row);
        first_row += n;
      }
    }
  }
}

#endif  // STEP06_X86_KERNELS

// What the CPU reports (CPUID, and XGETBV: the OS saves the wide registers).
bool cpu_runs_avx2() {
#if STEP06_X86_KERNELS
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}
bool cpu_runs_avx512() {
#if STEP06_X86_KERNELS
  __builtin_cpu_init();
  return cpu_runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}
// The int8-activation kernels on AVX-512 are built on vpdpbusd (VNNI) and
// byte-masked 256-bit loads (VL). (Ice Lake and later, Zen 4 and later.)
bool cpu_runs_avx512_vnni() {
#if STEP06_X86_KERNELS
  __builtin_cpu_init();
  return cpu_runs_avx512() && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

void run_product(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level);

void check_level(SimdLevel level, ActivationFormat activations) {
  if (!simd_supported(level, activations))
    throw llm::InputError(fmt::format(
        "quantized product: this CPU cannot run the {} kernels{} (it runs up to {})", simd_name(level),
        activations == ActivationFormat::Int8Blocks ? " for int8 activations (AVX-512 there needs VNNI)" : "",
        simd_name(detected_simd(activations))));
}

}  // namespace

std::string simd_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Portable: return "portable";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
  }
  return fmt::format("unknown SIMD level {}", static_cast<int>(level));
}

SimdLevel detected_simd(ActivationFormat activations) {
  static const SimdLevel detected_fp32 = cpu_runs_avx512() ? SimdLevel::Avx512
                                         : cpu_runs_avx2() ? SimdLevel::Avx2
                                                           : SimdLevel::Portable;
  static const SimdLevel detected_int8 = cpu_runs_avx512_vnni() ? SimdLevel::Avx512
                                         : cpu_runs_avx2()      ? SimdLevel::Avx2
                                                                : SimdLevel::Portable;
  return activations == ActivationFormat::Int8Blocks ? detected_int8 : detected_fp32;
}

bool simd_supported(SimdLevel level, ActivationFormat activations) {
  const SimdLevel detected = detected_simd(activations);
  switch (level) {
    case SimdLevel::Portable: return true;
    case SimdLevel::Avx2: return detected != SimdLevel::Portable;
    case SimdLevel::Avx512: return detected == SimdLevel::Avx512;
  }
  return false;  // not a level
}

void quantized_matmul(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level) {
  check_level(level, matrix.format.activations);
  check_matrix(matrix);
  run_product(matrix, x, rows, y, level);
}

QuantizedLinear::QuantizedLinear(QuantizedMatrix matrix)
    : QuantizedLinear(std::move(matrix), SimdLevel::Portable) {
  level_ = detected_simd(matrix_.format.activations);
}

QuantizedLinear::QuantizedLinear(QuantizedMatrix matrix, SimdLevel level) : matrix_(std::move(matrix)), level_(level) {
  check_level(level_, matrix_.format.activations);
  check_matrix(matrix_);
}

// The layer's matrix and level were checked once, when it was built.
void QuantizedLinear::forward(const float* x, int rows, float* y) const { run_product(matrix_, x, rows, y, level_); }

namespace {

#if STEP06_X86_KERNELS

// ---------------------------------------------------------------------------
// The prepared int8 input of the SIMD kernels.

// The int8 codes of x in the order each SIMD kernel multiplies them with the
// weights' bytes (an integer dot product sums neighbouring bytes, so x must
// sit where the matching weights sit):
//   Natural              int8 weights: byte j of a row is column j
//   EvenOddPerBlock      4-bit weights on AVX2: a 16-byte unit's low nibbles
//                        (even columns) then its high nibbles (odd), one
//                        block of 32: [x0 x2 .. x30 | x1 x3 .. x31]
//   EvenOddPerBlockPair  4-bit weights on AVX-512: two units at once, all low
//                        nibbles then all high: [evens of block b | evens of
//                        b + 1 | odds of b | odds of b + 1]
enum class CodeOrder { Natural, EvenOddPerBlock, EvenOddPerBlockPair };

// Column of x stored at position `i` of a prepared row in `order`.
int column_at(CodeOrder order, int i) {
  constexpr int kHalf = kActivationBlockColumns / 2;
  switch (order) {
    case CodeOrder::Natural: return i;
    case CodeOrder::EvenOddPerBlock: {
      const int block = i / kActivationBlockColumns, within = i % kActivationBlockColumns;
      return block * kActivationBlockColumns + (within < kHalf ? 2 * within : 2 * (within - kHalf) + 1);
    }
    case CodeOrder::EvenOddPerBlockPair: {
      const int pair = i / (2 * kActivationBlockColumns), within = i % (2 * kActivationBlockColumns);
      const int quarter = within / kHalf, position = within % kHalf;  // quarters: evens b, evens b+1, odds b, odds b+1
      const int block = 2 * pair + quarter % 2;
      return block * kActivationBlockColumns + 2 * position + quarter / 2;
    }
  }
  return i;
}

// What the int8 kernels of `level` read, prepared from the quantized x.
struct PreparedInt8Input {
  std::vector<std::int8_t> codes;  // AVX2: [rows, stride] in the level's CodeOrder
  std::vector<float> scales;       // AVX2: [rows, blocks] one scale per block (0 for padding)
  std::vector<cpu_kernels::Int8PairOfBlocks> pairs;  // AVX-512: [rows, pairs] (Int8Product::x_pairs)
  std::vector<float> zero_point_terms;                // Int8Product::zero_point_terms
};

void prepare_int8_input(const QuantizedMatrix& m, const Int8Activations& x, SimdLevel level,
                        PreparedInt8Input& prepared, cpu_kernels::Int8Product& product) {
  const bool four_bit = is_four_bit(m.format.scheme);
  const bool avx512 = level == SimdLevel::Avx512;
  // A vector of codes is 32 bytes (AVX2) or 64 (AVX-512); a row is whole vectors.
  const int vector_columns = avx512 ? 2 * kActivationBlockColumns : kActivationBlockColumns;
  const int real_columns = four_bit ? m.padded_in : m.in_features;
  const int stride = round_up(real_columns, vector_columns);
  const int blocks = stride / kActivationBlockColumns;  // blocks per prepared row, padding included
  const CodeOrder order = !four_bit ? CodeOrder::Natural
                          : avx512  ? CodeOrder::EvenOddPerBlockPair
                                    : CodeOrder::EvenOddPerBlock;
  // Code i of a prepared row r (0 past the real columns), and block b's scale (0 for padding blocks).
  const auto code_at = [&x, order](int r, int i) -> std::int8_t {
    const int column = column_at(order, i);
    return column < x.in_features ? x.codes[static_cast<std::size_t>(r) * x.codes_per_row + column] : 0;
  };
  const auto block_scale = [&x](int r, int b) {
    return b < x.blocks_per_row ? x.scales[static_cast<std::size_t>(r) * x.blocks_per_row + b] : 0.0f;
  };
  product.matrix = &m;
  if (avx512) {
    // The weights' offsets. vpdpbusd multiplies unsigned bytes (the weights)
    // by signed ones (x). The AVX-512 kernels read an int8 weight w as the
    // unsigned w + 128 and a symmetric int4 weight as its code q = w + 8; each
    // lane's dot product then starts from -offset * (the sum of its 4 x codes),
    // which takes the offset back out exactly, in int32, once per row of x
    // instead of once per output. (An int4 zero point differs per group and
    // output: zero_point_terms below.)
    const int offset = m.format.scheme == QuantScheme::Int8PerChannel  ? 128
                       : m.format.scheme == QuantScheme::Int4Symmetric ? 8
                                                                       : 0;
    const int pairs = blocks / 2;
    prepared.pairs.resize(static_cast<std::size_t>(x.rows) * pairs);
    for (int r = 0; r < x.rows; ++r)
      for (int pair = 0; pair < pairs; ++pair) {
        cpu_kernels::Int8PairOfBlocks& record = prepared.pairs[static_cast<std::size_t>(r) * pairs + pair];
        for (int i = 0; i < 2 * kActivationBlockColumns; ++i)
          record.codes[i] = code_at(r, pair * 2 * kActivationBlockColumns + i);
        for (int lane = 0; lane < 16; ++lane) {
          // vpdpbusd lane k sums bytes 4k .. 4k + 3: in the natural order lanes
          // 0-7 are block b, 8-15 block b + 1; in the pair order lanes 0-3 and
          // 8-11 are block b, 4-7 and 12-15 block b + 1.
          const bool second_block = four_bit ? lane % 8 >= 4 : lane >= 8;
          record.lane_scales[lane] = block_scale(r, 2 * pair + (second_block ? 1 : 0));
          const std::int8_t* four = record.codes + 4 * lane;
          record.lane_offsets[lane] = -offset * (four[0] + four[1] + four[2] + four[3]);
        }
      }
    product.x_pairs = prepared.pairs.data();
    product.pairs_per_row = pairs;
  } else {
    prepared.codes.resize(static_cast<std::size_t>(x.rows) * stride);
    prepared.scales.resize(static_cast<std::size_t>(x.rows) * blocks);
    for (int r = 0; r < x.rows; ++r) {
      for (int i = 0; i < stride; ++i) prepared.codes[static_cast<std::size_t>(r) * stride + i] = code_at(r, i);
      for (int b = 0; b < blocks; ++b) prepared.scales[static_cast<std::size_t>(r) * blocks + b] = block_scale(r, b);
    }
    product.x_codes = prepared.codes.data();
    product.x_stride = stride;
    product.x_scales = prepared.scales.data();
    product.scales_stride = blocks;
  }
  // Zero points of int4 (and, on AVX2, the symmetric scheme's 8, its int8
  // kernel needs none, see there): taken out at the end of each output, from
  // the sum of x per weight group (scales applied).
  const bool zero_points_at_the_end =
      m.format.scheme == QuantScheme::Int4Asymmetric || (!avx512 && m.format.scheme == QuantScheme::Int4Symmetric);
  prepared.zero_point_terms.clear();
  if (zero_points_at_the_end) {
    prepared.zero_point_terms.assign(static_cast<std::size_t>(x.rows) * m.groups_per_row, 0.0f);
    const int blocks_per_group = m.group_columns / kActivationBlockColumns;
    for (int r = 0; r < x.rows; ++r)
      for (int b = 0; b < x.blocks_per_row; ++b) {
        const std::size_t block = static_cast<std::size_t>(r) * x.blocks_per_row + b;
        prepared.zero_point_terms[static_cast<std::size_t>(r) * m.groups_per_row + b / blocks_per_group] +=
            x.scales[block] * static_cast<float>(x.code_sums[block]);
      }
  }
  product.zero_point_terms = prepared.zero_point_terms.empty() ? nullptr : prepared.zero_point_terms.data();
}

#endif  // STEP06_X86_KERNELS

// The product with int8 activations: x rounded to int8 blocks once, then the
// integer kernels of `level`.
void run_int8_product(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level) {
  thread_local Int8Activations activations;  // scratch reused across calls
  quantize_activations(x, rows, matrix.in_features, matrix.input_scales, activations);
  if (level == SimdLevel::Portable) {
    matmul_int8_activations_portable(matrix, activations, y);
    return;
  }
#if STEP06_X86_KERNELS
  thread_local PreparedInt8Input prepared;
  cpu_kernels::Int8Product product;
  prepare_int8_input(matrix, activations, level, prepared, product);
  product.y = y;
  run_tiles(product, rows,
            level == SimdLevel::Avx512 ? cpu_kernels::a8_avx512_tile_kernels(matrix.format.scheme)
                                       : cpu_kernels::a8_avx2_tile_kernels(matrix.format.scheme));
#endif
}

// The product, for a checked matrix and a level this CPU runs.
void run_product(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level) {
  if (rows < 0) throw llm::InputError(fmt::format("quantized product: {} rows", rows));
  if (rows == 0) return;
  if (matrix.format.int8_activations()) {
    run_int8_product(matrix, x, rows, y, level);
    return;
  }
  // Scratch reused across calls (one thread per model, as everywhere in the course).
  thread_local std::vector<float> prepared;    // [rows, stride]
  thread_local std::vector<float> group_sums;  // [rows, groups_per_row]
  if (level == SimdLevel::Portable) {
    prepare_input(matrix, x, rows, matrix.in_features, InputOrder::Natural, prepared);
    matmul_portable(matrix, prepared.data(), rows, y);
    return;
  }
#if STEP06_X86_KERNELS
  const bool four_bit = is_four_bit(matrix.format.scheme);
  Product product;
  product.matrix = &matrix;
  product.x_stride = four_bit ? matrix.padded_in : round_up(matrix.in_features, kBlockColumns);
  prepare_input(matrix, x, rows, product.x_stride, four_bit ? InputOrder::EvenOdd : InputOrder::Natural, prepared);
  product.x = prepared.data();
  product.y = y;
  const bool needs_group_sums = level == SimdLevel::Avx2 && (matrix.format.scheme == QuantScheme::Int4Asymmetric ||
                                                             matrix.format.scheme == QuantScheme::Int4Symmetric);
  if (needs_group_sums) {
    // The sum of x over each group, per row: a group is whole 32-column
    // blocks, and the even/odd order only moves columns within a block.
    group_sums.assign(static_cast<std::size_t>(rows) * matrix.groups_per_row, 0.0f);
    for (int r = 0; r < rows; ++r)
      for (int g = 0; g < matrix.groups_per_row; ++g) {
        const float* group_x = product.x + static_cast<std::size_t>(r) * product.x_stride + g * matrix.group_columns;
        float sum = 0.0f;
        for (int i = 0; i < matrix.group_columns; ++i) sum += group_x[i];
        group_sums[static_cast<std::size_t>(r) * matrix.groups_per_row + g] = sum;
      }
    product.group_sums = group_sums.data();
  }
  run_tiles(product, rows,
            level == SimdLevel::Avx512 ? cpu_kernels::avx512_tile_kernels(matrix.format.scheme)
                                       : cpu_kernels::avx2_tile_kernels(matrix.format.scheme));
#endif
}

}  // namespace

}  // namespace step06
