// The lines a product asks L2 for on behalf of the next product
// (llm/cuda/weight_prefetch.hpp): host arithmetic, checked without a GPU.
// Against a byte-by-byte account of what the next product's blocks read
// first (block of slice s: its first batch of every row, cut at the slice's
// end), on TinyLlama's decode products in fp16 and int4 with the column
// splits the GEMVs choose on 132 SMs (gemv_column_split.hpp), on rows that
// do not start on a 128-byte line, and on slices shorter than a batch: every
// line those bytes touch is asked for (exactly once where the runs start on
// lines, as every real model's do), and no address lies outside them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llm/cuda/gemv_column_split.hpp"
#include "llm/cuda/weight_prefetch.hpp"

namespace {

using llm::cuda::column_split_for_whole_waves;
using llm::cuda::ColumnSplit;
using llm::cuda::first_weight_lines;
using llm::cuda::FirstWeightLines;
using llm::cuda::kL2LineBytes;

// A GEMV's weights as the next product's blocks read them: rows of
// `row_bytes` bytes `row_stride` apart, slices `slice_stride` bytes apart,
// each block reading `batch_bytes` of each of its rows first.
struct ProductShape {
  std::string name;
  int rows;
  std::size_t row_stride;
  std::size_t row_bytes;
  int slices;
  std::size_t slice_stride;
  std::size_t batch_bytes;
};

// A decode product of TinyLlama-1.1B (dim 2048, hidden 5632, KV width 256)
// as the model's GEMV reads it on 132 SMs: output blocks of 64 rows, steps
// of 128 bytes of a row (64 fp16 columns, 256 int4 ones), the column split
// the GEMV chooses for a wave of 2 blocks per SM, and a block's first batch
// of 4 steps (fp16) or 2 (int4).
ProductShape tinyllama_product(const std::string& name, int out, int in, bool int4) {
  constexpr std::size_t kStepBytes = 128;
  const std::size_t row_bytes = int4 ? static_cast<std::size_t>(in) / 2 : static_cast<std::size_t>(in) * 2;
  const int total_steps = static_cast<int>((row_bytes + kStepBytes - 1) / kStepBytes);
  const ColumnSplit split = column_split_for_whole_waves((out + 63) / 64, total_steps, 2 * 132);
  return {std::string(int4 ? "int4 " : "fp16 ") + name + " [" + std::to_string(out) + ", " + std::to_string(in) +
              "], " + std::to_string(split.k_splits) + " slices of " + std::to_string(split.steps_per_split) +
              " steps",
          out,
          row_bytes,
          row_bytes,
          split.k_splits,
          split.steps_per_split * kStepBytes,
          (int4 ? 2 : 4) * kStepBytes};
}

std::vector<ProductShape> tinyllama_products() {
  std::vector<ProductShape> products;
  for (const bool int4 : {false, true}) {
    products.push_back(tinyllama_product("qkv", 2560, 2048, int4));
    products.push_back(tinyllama_product("wo", 2048, 2048, int4));
    products.push_back(tinyllama_product("gate_up", 11264, 2048, int4));
    products.push_back(tinyllama_product("down", 2048, 5632, int4));
    products.push_back(tinyllama_product("classifier", 32000, 2048, int4));
  }
  return products;
}

// Shapes the model's real widths never have, which the arithmetic must still
// get right: rows that do not start on a line (in = 2056 columns of fp16:
// 4112 bytes), a last slice shorter than a batch, one row of a single short
// slice, and slices shorter than a batch (int4, 1 step each).
const ProductShape kAwkwardProducts[] = {
    {"fp16 [7, 2056], rows off the lines, 6 slices of 6 steps (the last of 136 columns)", 7, 4112, 4112, 6, 6 * 128,
     512},
    {"fp16 [3, 1000], slices of 5 steps, the last of 40 columns", 3, 2000, 2000, 4, 5 * 128, 512},
    {"fp16 [1, 24], one slice shorter than a batch", 1, 48, 48, 1, 48, 512},
    {"int4 [5, 96], rows of 48 bytes", 5, 48, 48, 1, 48, 256},
    {"int4 [9, 2304], 9 slices of 1 step", 9, 1152, 1152, 9, 128, 256},
};

// Rows checked byte by byte: the first ones of each shape (line numbers go
// row by row, so they are the first numbers). Every row has the same runs.
constexpr int kCheckedRows = 64;

// Storage for a shape's first kCheckedRows rows whose first byte sits
// `misalignment` bytes after a 128-byte line (cudaMalloc's buffers start on
// one: misalignment 0). Offsets below are from that first byte.
struct Weights {
  std::vector<unsigned char> storage;
  const unsigned char* base = nullptr;
  std::size_t bytes = 0;  // of the checked rows
  Weights(const ProductShape& shape, std::size_t misalignment)
      : storage(static_cast<std::size_t>(std::min(shape.rows, kCheckedRows)) * shape.row_stride + 2 * kL2LineBytes),
        bytes(static_cast<std::size_t>(std::min(shape.rows, kCheckedRows)) * shape.row_stride) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t to_line = (kL2LineBytes - address % kL2LineBytes) % kL2LineBytes;
    base = storage.data() + to_line + misalignment;
  }
  // Line number of the byte at `offset`, counted from the first byte's line.
  std::size_t line_of(std::size_t offset) const {
    return (reinterpret_cast<std::uintptr_t>(base) % kL2LineBytes + offset) / kL2LineBytes;
  }
};

// Every line the blocks' first bytes touch is asked for (once, where the
// runs start on lines), every address asked for is such a byte, and a run's
// unused numbers are null.
void expect_the_first_batches(const ProductShape& shape, std::size_t misalignment) {
  SCOPED_TRACE(shape.name + ", base " + std::to_string(misalignment) + " bytes after a line");
  const Weights weights(shape, misalignment);
  const FirstWeightLines lines = first_weight_lines(weights.base, shape.rows, shape.row_stride, shape.row_bytes,
                                                    shape.slices, shape.slice_stride, shape.batch_bytes);
  ASSERT_GT(lines.lines_per_run, 0);
  ASSERT_EQ(lines.lines(), shape.rows * shape.slices * lines.lines_per_run);
  const int checked_rows = std::min(shape.rows, kCheckedRows);
  // What the blocks read first, byte by byte: the block of slice s reads its
  // first batch of each row, up to its slice's end and the row's end.
  std::vector<char> read_first(weights.bytes, 0);
  std::vector<char> line_read_first(weights.line_of(weights.bytes) + 1, 0);
  for (int row = 0; row < checked_rows; ++row)
    for (int slice = 0; slice < shape.slices; ++slice) {
      const std::size_t row_start = static_cast<std::size_t>(row) * shape.row_stride;
      const std::size_t slice_start = static_cast<std::size_t>(slice) * shape.slice_stride;
      const std::size_t slice_end = std::min(slice_start + shape.slice_stride, shape.row_bytes);
      const std::size_t batch_end = std::min(slice_start + shape.batch_bytes, slice_end);
      for (std::size_t byte = slice_start; byte < batch_end; ++byte) {
        read_first[row_start + byte] = 1;
        line_read_first[weights.line_of(row_start + byte)] = 1;
      }
    }
  std::vector<int> times_asked(line_read_first.size(), 0);
  for (int line = 0; line < checked_rows * shape.slices * lines.lines_per_run; ++line) {
    const unsigned char* address = lines.line_address(line);
    if (address == nullptr) continue;  // the run touches fewer lines
    ASSERT_GE(address, weights.base) << "line " << line;
    const auto offset = static_cast<std::size_t>(address - weights.base);
    ASSERT_LT(offset, weights.bytes) << "line " << line << " asks for a byte past the rows";
    ASSERT_TRUE(read_first[offset]) << "line " << line << " asks for a byte no block reads first";
    ++times_asked[weights.line_of(offset)];
  }
  // Runs that start on lines never share one; off the lines, a row's last
  // run and the next row's first may (each asks for it once).
  const bool on_lines = misalignment == 0 && shape.row_stride % kL2LineBytes == 0 &&
                        (shape.slices == 1 || shape.slice_stride % kL2LineBytes == 0);
  for (std::size_t line = 0; line < line_read_first.size(); ++line) {
    if (line_read_first[line]) EXPECT_GE(times_asked[line], 1) << "line " << line << " is read first, never asked for";
    if (on_lines) EXPECT_LE(times_asked[line], 1) << "line " << line << " asked for twice";
  }
}

TEST(WeightPrefetch, TinyLlamasProductsAskForEachFirstBatchLineOnce) {
  for (const ProductShape& shape : tinyllama_products()) expect_the_first_batches(shape, 0);
}

TEST(WeightPrefetch, RowsOffTheLinesAndShortSlicesAreCoveredAndNeverLeft) {
  for (const ProductShape& shape : kAwkwardProducts)
    for (const std::size_t misalignment : {std::size_t{0}, std::size_t{16}, std::size_t{112}})
      expect_the_first_batches(shape, misalignment);
  for (const ProductShape& shape : tinyllama_products()) expect_the_first_batches(shape, 16);
}

// The fp16 QKV product's numbers, as chapter 01 (section 5.13) gives them:
// 6 slices of 6 steps; 4 line numbers a run, all used but in the last
// slice, whose 2 steps are 2 lines: 22 lines of each of the 2560 rows.
TEST(WeightPrefetch, TheQkvProductsLinesAreTwentyTwoARow) {
  const ProductShape qkv = tinyllama_product("qkv", 2560, 2048, false);
  ASSERT_EQ(qkv.slices, 6);
  ASSERT_EQ(qkv.slice_stride, std::size_t{6 * 128});
  const Weights weights(qkv, 0);
  const FirstWeightLines lines = first_weight_lines(weights.base, qkv.rows, qkv.row_stride, qkv.row_bytes,
                                                    qkv.slices, qkv.slice_stride, qkv.batch_bytes);
  EXPECT_EQ(lines.lines_per_run, 4);
  int asked = 0;
  for (int line = 0; line < qkv.slices * lines.lines_per_run; ++line) asked += lines.line_address(line) != nullptr;
  EXPECT_EQ(asked, 22);
  // Rows off the lines: a run of 4 lines may touch 5.
  EXPECT_EQ(first_weight_lines(weights.base, 7, 4112, 4112, 6, 768, 512).lines_per_run, 5);
}

TEST(WeightPrefetch, NoWeightsOrNoShapeMeansNoLines) {
  const unsigned char byte = 0;
  EXPECT_EQ(first_weight_lines(nullptr, 4, 128, 128, 1, 128, 128).lines(), 0);
  EXPECT_EQ(FirstWeightLines{}.lines(), 0);
  EXPECT_EQ(first_weight_lines(&byte, 0, 128, 128, 1, 128, 128).lines(), 0);    // no rows
  EXPECT_EQ(first_weight_lines(&byte, 4, 128, 128, 0, 128, 128).lines(), 0);    // no slices
  EXPECT_EQ(first_weight_lines(&byte, 4, 128, 128, 1, 128, 0).lines(), 0);      // runs of no bytes
  EXPECT_EQ(first_weight_lines(&byte, 4, 128, 256, 1, 128, 128).lines(), 0);    // rows longer than their stride
  EXPECT_EQ(first_weight_lines(&byte, 4, 1024, 1024, 9, 128, 128).lines(), 0);  // a slice past the row
  EXPECT_EQ(first_weight_lines(&byte, 4, 1024, 1024, 2, 0, 128).lines(), 0);    // slices that do not advance
}

}  // namespace
