// The lines a product asks L2 for on behalf of the next product
// (llm/cuda/weight_prefetch.hpp): host arithmetic, checked without a GPU.
// Against a byte-by-byte count of what the next product's blocks read first
// (the first batch of every slice of every row), on TinyLlama's decode
// shapes in fp16 and int4, on rows that do not start on a 128-byte line,
// and on last slices shorter than a batch: every such line is asked for,
// and no address lies outside those bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llm/cuda/weight_prefetch.hpp"

namespace {

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

// TinyLlama-1.1B's decode products as the model's GEMVs split them on 132
// SMs (common_gemv_column_split_test pins the splits): fp16 rows of 2 bytes
// a column, slices of whole 64-column steps (128 bytes), a block's first
// batch 4 steps (512 bytes); int4 rows of half a byte a column, steps of 256
// columns (128 bytes), a first batch of 2 steps (256 bytes).
const ProductShape kTinyLlamaProducts[] = {
    {"fp16 qkv [2560, 2048], 6 slices of 6 steps", 2560, 4096, 4096, 6, 6 * 128, 512},
    {"fp16 wo [2048, 2048], 8 slices of 4 steps", 2048, 4096, 4096, 8, 4 * 128, 512},
    {"fp16 gate_up [11264, 2048], 3 slices of 11 steps", 11264, 4096, 4096, 3, 11 * 128, 512},
    {"fp16 down [2048, 5632], 8 slices of 11 steps", 2048, 11264, 11264, 8, 11 * 128, 512},
    {"fp16 classifier [32000, 2048], no split", 32000, 4096, 4096, 1, 4096, 512},
    {"int4 qkv [2560, 2048], 4 slices of 2 steps", 2560, 1024, 1024, 4, 2 * 128, 256},
    {"int4 down [2048, 5632], 8 slices of 3 steps", 2048, 2816, 2816, 8, 3 * 128, 256},
};

// Shapes the model's real widths never have, which the arithmetic must still
// get right: rows that do not start on a line (in = 2056 columns of fp16:
// 4112 bytes), slices of 5 steps whose last one is shorter than a batch, one
// row, and a single short slice.
const ProductShape kAwkwardProducts[] = {
    {"fp16 [7, 2056], rows off the lines, 6 slices of 6 steps (the last of 136 columns)", 7, 4112, 4112, 6, 6 * 128, 512},
    {"fp16 [3, 1000], slices of 5 steps, the last of 40 columns", 3, 2000, 2000, 4, 5 * 128, 512},
    {"fp16 [1, 24], one slice shorter than a batch", 1, 48, 48, 1, 48, 512},
    {"int4 [5, 96], rows of 48 bytes", 5, 48, 48, 1, 48, 256},
};

// Rows checked byte by byte: the first ones of each shape (lines are
// numbered row by row, so they are the first lines). Every row has the same
// runs; the count of all of them is checked on its own.
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
  // Line number of the byte at `offset` (its address / 128, from the first
  // byte's line).
  std::size_t line_of(std::size_t offset) const {
    return (reinterpret_cast<std::uintptr_t>(base) % kL2LineBytes + offset) / kL2LineBytes;
  }
};

// Every line read first is asked for; every address asked for is a byte read
// first; and, when the runs start on lines and abut or leave gaps of whole
// lines, each line exactly once.
void expect_the_first_batches(const ProductShape& shape, std::size_t misalignment) {
  SCOPED_TRACE(shape.name + ", base " + std::to_string(misalignment) + " bytes after a line");
  const Weights weights(shape, misalignment);
  const FirstWeightLines lines = first_weight_lines(weights.base, shape.rows, shape.row_stride, shape.row_bytes,
                                                    shape.slices, shape.slice_stride, shape.batch_bytes);
  ASSERT_GT(lines.lines_per_run, 0);
  ASSERT_EQ(lines.lines(), shape.rows * shape.slices * lines.lines_per_run);
  const int checked_rows = std::min(shape.rows, kCheckedRows);
  // What the blocks read first, byte by byte, and its lines.
  std::vector<char> read_first(weights.bytes, 0);
  std::vector<char> line_read_first(weights.line_of(weights.bytes) + 1, 0);
  for (int row = 0; row < checked_rows; ++row)
    for (int slice = 0; slice < shape.slices; ++slice) {
      const std::size_t start = static_cast<std::size_t>(row) * shape.row_stride +
                                static_cast<std::size_t>(slice) * shape.slice_stride;
      const std::size_t end = std::min(start + shape.batch_bytes,
                                       static_cast<std::size_t>(row) * shape.row_stride + shape.row_bytes);
      for (std::size_t offset = start; offset < end; ++offset) {
        read_first[offset] = 1;
        line_read_first[weights.line_of(offset)] = 1;
      }
    }
  std::vector<int> times_asked(line_read_first.size(), 0);
  for (int line = 0; line < checked_rows * shape.slices * lines.lines_per_run; ++line) {
    const unsigned char* address = lines.line_address(line);
    ASSERT_GE(address, weights.base) << "line " << line;
    const auto offset = static_cast<std::size_t>(address - weights.base);
    ASSERT_LT(offset, weights.bytes) << "line " << line << " asks for a byte past the rows";
    ASSERT_TRUE(read_first[offset]) << "line " << line << " asks for a byte no block reads first";
    ++times_asked[weights.line_of(offset)];
  }
  const bool once_each = misalignment == 0 && shape.row_stride % kL2LineBytes == 0 &&
                         shape.slice_stride % kL2LineBytes == 0 && shape.batch_bytes % kL2LineBytes == 0 &&
                         shape.batch_bytes <= shape.slice_stride && shape.row_bytes % shape.slice_stride == 0;
  for (std::size_t line = 0; line < line_read_first.size(); ++line) {
    if (line_read_first[line]) EXPECT_GE(times_asked[line], 1) << "line " << line << " is read first, never asked for";
    if (once_each) EXPECT_LE(times_asked[line], 1) << "line " << line << " asked for twice";
  }
}

TEST(WeightPrefetch, TinyLlamasProductsAskForEachFirstBatchLineOnce) {
  for (const ProductShape& shape : kTinyLlamaProducts) expect_the_first_batches(shape, 0);
  // The fp16 QKV product: 6 slices of 4 lines for each of its 2560 rows,
  // 7.5 MiB of its 10 MiB.
  const Weights weights(kTinyLlamaProducts[0], 0);
  const FirstWeightLines qkv = first_weight_lines(weights.base, 2560, 4096, 4096, 6, 768, 512);
  EXPECT_EQ(qkv.lines_per_run, 4);
  EXPECT_EQ(qkv.lines(), 2560 * 6 * 4);
  // Rows off the lines: a run of 4 lines may touch 5.
  EXPECT_EQ(first_weight_lines(weights.base, 7, 4112, 4112, 6, 768, 512).lines_per_run, 5);
}

TEST(WeightPrefetch, RowsOffTheLinesAndShortSlicesAreCoveredAndNeverLeft) {
  for (const ProductShape& shape : kAwkwardProducts)
    for (const std::size_t misalignment : {std::size_t{0}, std::size_t{16}, std::size_t{112}})
      expect_the_first_batches(shape, misalignment);
  for (const ProductShape& shape : kTinyLlamaProducts) expect_the_first_batches(shape, 16);
}

TEST(WeightPrefetch, NoWeightsOrNoShapeMeansNoLines) {
  const unsigned char byte = 0;
  EXPECT_EQ(first_weight_lines(nullptr, 4, 128, 128, 1, 128, 128).lines(), 0);
  EXPECT_EQ(FirstWeightLines{}.lines(), 0);
  EXPECT_EQ(first_weight_lines(&byte, 0, 128, 128, 1, 128, 128).lines(), 0);     // no rows
  EXPECT_EQ(first_weight_lines(&byte, 4, 128, 128, 0, 128, 128).lines(), 0);     // no slices
  EXPECT_EQ(first_weight_lines(&byte, 4, 128, 128, 1, 128, 0).lines(), 0);       // runs of no bytes
  EXPECT_EQ(first_weight_lines(&byte, 4, 128, 256, 1, 128, 128).lines(), 0);     // rows longer than their stride
  EXPECT_EQ(first_weight_lines(&byte, 4, 1024, 1024, 9, 128, 128).lines(), 0);   // a slice past the row
}

}  // namespace
