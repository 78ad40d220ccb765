#pragma once
// The next product's first weights, asked of L2 by the product before it:
// which 128-byte lines they are. Arithmetic only, no CUDA types (the kernel
// side is cuda_core_gemv.cuh's prefetch_next_product_lines), so that it is
// tested without a GPU.
//
// A decode token is a chain of products, each a few MB on TinyLlama's dims
// (8-46 MB in fp16, a quarter of that in int4). Each one's blocks start by
// waiting a whole HBM round trip for their first weights, and each one ends
// in a tail that reads almost nothing from HBM: its slowest blocks, the
// slices' add, the launch of the next. Programmatic dependent launch
// (programmatic_launch.cuh) was meant to overlap the two, but the next
// product's blocks only start where the one before has left an SM's slots
// free, and a GEMV's grid takes nearly every slot its registers allow.
//
// So a product can do it instead: once a thread's own loads are done, it
// asks L2 for a share of the lines the next product's blocks read first (the
// first batch of every slice of every weight row), the grid's last blocks
// first (in a grid of two waves, those of the second). Those bytes should
// then travel during this product's tail and the launch between the two, and
// the next product's first loads find them in L2. A prefetch only: nothing
// waits for it, no register holds it, no result changes (the same bits with
// it or without), and the lines only ever lie inside the next product's
// weights.
//
// How many: one batch per slice of each row is what each block of the next
// product requests before anything else (its first batch, loaded before it
// waits for the kernel before it). On TinyLlama's fp16 products that is 7 to
// 17 MB (chapter 01, section 5.13, has each product's), the bytes HBM moves
// in a few microseconds: about the length of the tail it fills. L2 holds it
// (50 MB on an H100, 60 MB on an H200).
//
// Measured on an H200, the model's token and a chain of products alone are
// both slower with it (chapter 01, section 5.14): the tail's HBM is not as
// idle as this reasoning assumes. So it is an opt-in (--gemv-prefetch-next).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "llm/host_device.hpp"

namespace llm::cuda {

inline constexpr int kL2LineBytes = 128;

// Lines of a row-major weight matrix: for each of `rows` rows, a run of bytes
// at the start of each of `slices` slices of its columns.
//   row r, slice s:  bytes [r * row_stride + s * slice_stride, + run) of base,
//                    run = min(run_bytes, row_bytes - s * slice_stride)
//                    (run_bytes is at most a slice: a run never reaches into
//                    the next slice, whose own run asks for those bytes; the
//                    last slice may be shorter than a run)
// Each run is given lines_per_run line numbers, the most lines a run can
// touch; a run that touches fewer leaves the rest empty (line_address gives
// null). Numbers go run by run, slice after slice within a row, then row
// after row, so consecutive threads ask for neighbouring lines. Every line a
// run touches is asked for once.
struct FirstWeightLines {
  const unsigned char* base = nullptr;  // row 0, column 0 of the weights; null: no lines
  std::size_t row_stride = 0;           // bytes from one row to the next
  std::size_t row_bytes = 0;            // bytes of a row the product reads (<= row_stride)
  std::size_t slice_stride = 0;         // bytes from one slice's first column to the next's
  std::size_t run_bytes = 0;            // bytes read first in each slice (a block's first batch)
  int rows = 0;
  int slices = 0;
  // Line numbers per run: the run's 128-byte lines, one more when runs do not
  // start on a line (a run then may touch a line more than its length).
  int lines_per_run = 0;

  LLM_HOST_DEVICE int lines() const { return base == nullptr ? 0 : rows * slices * lines_per_run; }

  // Where line number `line` (0 .. lines()) is asked for: an address on the
  // run's line `line % lines_per_run` (the run's first byte on its first
  // line, the line's first byte after), or null where the run touches fewer
  // lines (nothing to ask for).
  LLM_HOST_DEVICE const unsigned char* line_address(int line) const {
    const int in_run = line % lines_per_run;
    const int run = line / lines_per_run;
    const int slice = run % slices;
    const int row = run / slices;
    const std::size_t run_start = static_cast<std::size_t>(slice) * slice_stride;
    const std::size_t to_row_end = row_bytes - run_start;
    const std::size_t run_length = run_bytes < to_row_end ? run_bytes : to_row_end;
    const unsigned char* first = base + static_cast<std::size_t>(row) * row_stride + run_start;
    // The run's first byte's place in its line, and the lines the run touches.
    const std::size_t into_line = reinterpret_cast<std::uintptr_t>(first) % kL2LineBytes;
    const std::size_t touched = (into_line + run_length + kL2LineBytes - 1) / kL2LineBytes;
    if (static_cast<std::size_t>(in_run) >= touched) return nullptr;
    return in_run == 0 ? first : first + (static_cast<std::size_t>(in_run) * kL2LineBytes - into_line);
  }
};

// The lines of a GEMV's first batches: `rows` weight rows of `row_bytes`
// bytes read, `row_stride` bytes apart, whose columns are split into
// `slices` slices `slice_stride` bytes apart (the last may be shorter), each
// slice's block reading `batch_bytes` of every row first (at most its
// slice). Empty (no lines) when there are no weights, and for a shape that
// is not one: rows or slices below 1, slices that start past the row, runs
// of no bytes, or more lines than an int counts.
inline FirstWeightLines first_weight_lines(const void* base, int rows, std::size_t row_stride, std::size_t row_bytes,
                                           int slices, std::size_t slice_stride, std::size_t batch_bytes) {
  if (base == nullptr || rows < 1 || slices < 1 || batch_bytes == 0 || row_bytes == 0 || row_bytes > row_stride)
    return {};
  if (slices == 1) slice_stride = row_bytes;  // one slice: the whole row
  if (slice_stride == 0 || static_cast<std::size_t>(slices - 1) * slice_stride >= row_bytes) return {};
  FirstWeightLines lines;
  lines.base = static_cast<const unsigned char*>(base);
  lines.row_stride = row_stride;
  lines.row_bytes = row_bytes;
  lines.slice_stride = slice_stride;
  lines.run_bytes = std::min({batch_bytes, slice_stride, row_bytes});
  lines.rows = rows;
  lines.slices = slices;
  const bool runs_start_on_lines = reinterpret_cast<std::uintptr_t>(base) % kL2LineBytes == 0 &&
                                   row_stride % kL2LineBytes == 0 && slice_stride % kL2LineBytes == 0;
  const std::size_t lines_per_run = (lines.run_bytes + kL2LineBytes - 1) / kL2LineBytes + (runs_start_on_lines ? 0 : 1);
  // Line numbers are ints.
  if (lines_per_run * static_cast<std::size_t>(slices) * static_cast<std::size_t>(rows) >
      static_cast<std::size_t>(std::numeric_limits<int>::max()))
    return {};
  lines.lines_per_run = static_cast<int>(lines_per_run);
  return lines;
}

}  // namespace llm::cuda
