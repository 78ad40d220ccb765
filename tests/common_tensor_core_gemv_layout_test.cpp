// The tensor-core GEMV's operand mapping (llm/cuda/tensor_core_gemv_layout.hpp),
// checked on the CPU: every lane's registers for one step of 64 columns are
// built the way the kernel builds them (half_linear.cu), then read back
// through the PTX ISA's definition of the mma.m16n8k16 fragments, written
// out here on its own, and multiplied. The result must be the plain product
// of the weights and x over the step's 64 columns, and each accumulator
// must land on the output and row the kernel stores it to. Integer values,
// so "equal" is exact.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>

#include "llm/cuda/tensor_core_gemv_layout.hpp"

namespace llm {
namespace {

namespace layout = cuda::tensor_core_gemv;

constexpr int kLanes = 32;
constexpr int kOutputs = 16;  // the mma's M: a warp's outputs
constexpr int kRows = 8;      // the mma's N: one n-tile of x rows
constexpr int kColumns = layout::kStepColumns;

// A 32-bit register as its two 16-bit elements, by the elements' (row,
// column) in the step: what the kernel put there.
struct Element {
  int row = -1;     // weight output row (A) or x row (B)
  int column = -1;  // physical column in the step
};
using Register = std::array<Element, 2>;  // [low half, high half]

// Word w of lane t's vector h of a row: elements 2w and 2w + 1 of the 8
// contiguous columns the vector holds.
Register word_of(int row, int t, int h, int w) {
  const int first = layout::vector_first_column(t, h) + 2 * w;
  return {Element{row, first}, Element{row, first + 1}};
}

struct LaneRegisters {
  std::array<Register, 4> a;  // A fragment
  std::array<Register, 2> b;  // B fragment
};

// What lane (g, t) hands mma j of the step (the kernel's inner loop).
LaneRegisters kernel_registers(int lane, int j) {
  const int g = lane / 4, t = lane % 4;
  const int vector = layout::mma_vector(j), low = layout::mma_low_word(j);
  LaneRegisters regs;
  regs.a = {word_of(g, t, vector, low), word_of(g + 8, t, vector, low), word_of(g, t, vector, low + 1),
            word_of(g + 8, t, vector, low + 1)};
  regs.b = {word_of(g, t, vector, low), word_of(g, t, vector, low + 1)};  // x row g of the n-tile
  return regs;
}

// The PTX ISA's fragments for .f16/.bf16 mma.m16n8k16, lane = 4 g + t, the
// first element of a pair in the low half of its register:
//   A (row-major 16 x 16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9)
//   B (16 x 8):            b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   D (16 x 8):            d0 = (g, 2t), d1 = (g, 2t+1), d2 = (g+8, 2t), d3 = (g+8, 2t+1)
// The logical A and B one mma multiplies: which physical element sits at
// each (m, k) and (k, n).
struct LogicalTile {
  std::array<std::array<Element, 16>, kOutputs> a{};  // [m][k]
  std::array<std::array<Element, kRows>, 16> b{};     // [k][n]
};
LogicalTile logical_tile(int j) {
  LogicalTile tile;
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const LaneRegisters regs = kernel_registers(lane, j);
    for (int e = 0; e < 2; ++e) {
      tile.a[g][2 * t + e] = regs.a[0][e];
      tile.a[g + 8][2 * t + e] = regs.a[1][e];
      tile.a[g][2 * t + 8 + e] = regs.a[2][e];
      tile.a[g + 8][2 * t + 8 + e] = regs.a[3][e];
      tile.b[2 * t + e][g] = regs.b[0][e];
      tile.b[2 * t + 8 + e][g] = regs.b[1][e];
    }
  }
  return tile;
}
// d_i of lane (g, t) in D's (m, n), per the table above.
std::array<int, 2> ptx_accumulator_position(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  static constexpr std::array<std::array<int, 2>, 4> kOffsets = {{{0, 0}, {0, 1}, {8, 0}, {8, 1}}};
  return {g + kOffsets[i][0], 2 * t + kOffsets[i][1]};
}

// Small integers, different per element, so a misplaced element changes the sum.
std::int64_t weight_value(int output, int column) { return (output * 131 + column * 17) % 23 - 11; }
std::int64_t x_value(int row, int column) { return (row * 37 + column * 29) % 19 - 9; }

TEST(TensorCoreGemvLayout, EachMmaPairsTheWeightsAndXAtTheSameColumns) {
  std::set<int> columns_used;
  for (int j = 0; j < layout::kMmasPerStep; ++j) {
    SCOPED_TRACE("mma " + std::to_string(j));
    const LogicalTile tile = logical_tile(j);
    for (int k = 0; k < 16; ++k) {
      const int column = tile.a[0][k].column;
      // One physical column per logical k: the same for every output row of
      // A and every x row of B.
      for (int m = 0; m < kOutputs; ++m) {
        EXPECT_EQ(tile.a[m][k].row, m) << "A row " << m;
        EXPECT_EQ(tile.a[m][k].column, column) << "A (" << m << ", " << k << ")";
      }
      for (int n = 0; n < kRows; ++n) {
        EXPECT_EQ(tile.b[k][n].row, n) << "B column " << n;
        EXPECT_EQ(tile.b[k][n].column, column) << "B (" << k << ", " << n << ")";
      }
      EXPECT_TRUE(columns_used.insert(column).second) << "column " << column << " used twice";
    }
  }
  EXPECT_EQ(static_cast<int>(columns_used.size()), kColumns);  // 0..63, each once
  EXPECT_EQ(*columns_used.begin(), 0);
  EXPECT_EQ(*columns_used.rbegin(), kColumns - 1);
}

TEST(TensorCoreGemvLayout, FourMmasGiveThePlainProductAtTheKernelsOutputs) {
  // D = sum over the four mmas of A_j B_j, with the values the elements hold.
  std::array<std::array<std::int64_t, kRows>, kOutputs> d{};
  for (int j = 0; j < layout::kMmasPerStep; ++j) {
    const LogicalTile tile = logical_tile(j);
    for (int m = 0; m < kOutputs; ++m)
      for (int n = 0; n < kRows; ++n)
        for (int k = 0; k < 16; ++k)
          d[m][n] += weight_value(tile.a[m][k].row, tile.a[m][k].column) *
                     x_value(tile.b[k][n].row, tile.b[k][n].column);
  }
  // Each lane's accumulator i, at the output and row the kernel stores it
  // to, holds the plain product over the 64 columns.
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      const auto [m, n] = ptx_accumulator_position(lane, i);
      const int output = layout::accumulator_output(lane / 4, i);
      const int row = layout::accumulator_row(lane % 4, i);
      EXPECT_EQ(output, m) << "lane " << lane << ", accumulator " << i;
      EXPECT_EQ(row, n) << "lane " << lane << ", accumulator " << i;
      std::int64_t want = 0;
      for (int c = 0; c < kColumns; ++c) want += weight_value(output, c) * x_value(row, c);
      EXPECT_EQ(d[m][n], want) << "output " << output << ", row " << row;
    }
}

// The loads the mapping asks for are the wide, contiguous ones the kernel
// is built around: each lane's vector starts on an 8-column (16-byte)
// boundary, and the 4 lanes of a group cover a half-step's 32 columns.
TEST(TensorCoreGemvLayout, ALanesVectorsAreWholeAlignedSixteenByteLoads) {
  for (int h = 0; h < 2; ++h) {
    std::set<int> covered;
    for (int t = 0; t < 4; ++t) {
      const int first = layout::vector_first_column(t, h);
      EXPECT_EQ(first % layout::kHalvesPerVector, 0);
      for (int e = 0; e < layout::kHalvesPerVector; ++e) covered.insert(first + e);
    }
    EXPECT_EQ(static_cast<int>(covered.size()), kColumns / 2);
    EXPECT_EQ(*covered.begin(), h * kColumns / 2);
    EXPECT_EQ(*covered.rbegin(), (h + 1) * kColumns / 2 - 1);
  }
}

}  // namespace
}  // namespace llm
