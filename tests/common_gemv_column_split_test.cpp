// The decode GEMV's column split (llm/cuda/gemv_column_split.hpp): host
// arithmetic, checked without a GPU. On an H200's or H100's 132 SMs at 2
// resident blocks per SM, TinyLlama's products before and after the split
// was fitted to whole waves, every split's slices (whole, none empty), and
// the fit never modelled slower than the old choice.
#include <gtest/gtest.h>

#include <string>

#include "llm/cuda/gemv_column_split.hpp"

namespace {

using llm::cuda::column_split_filling_a_wave;
using llm::cuda::column_split_for_whole_waves;
using llm::cuda::ColumnSplit;
using llm::cuda::modelled_split_steps;

constexpr int kWave = 2 * 132;  // blocks a 132-SM GPU holds at once, 2 per SM

// A product's grid: output blocks of 64 outputs, steps of 64 half columns.
struct ProductShape {
  std::string name;
  int output_blocks;
  int total_steps;
  int old_k_splits;    // column_split_filling_a_wave
  int fitted_k_splits;  // column_split_for_whole_waves
};

// TinyLlama-1.1B's decode products (dim 2048, hidden 5632, KV width 256),
// fp16 (steps of 64 columns): the QKV product's 7 slices of 40 output blocks
// are 280 blocks, a wave and 16; 6 slices are 240, one wave. Down's 9 are
// 288; 8 are 256. Gate-up's 2 slices of 176 are 352 blocks of 16 steps in
// two waves; 3 are 528 blocks of 11 steps in two. wo and the classifier keep
// their split. Step 06's int4 GEMV (steps of 256 columns) keeps its splits
// but gate-up's: 2 slices of 4 steps in two waves become one of 8 steps in
// one (the same modelled time as 3 slices in two waves: the tie goes to the
// fewer waves).
const ProductShape kTinyLlamaProducts[] = {
    {"fp16 qkv [2560, 2048]", 40, 32, 7, 6},
    {"fp16 wo [2048, 2048]", 32, 32, 8, 8},
    {"fp16 gate_up [11264, 2048]", 176, 32, 2, 3},
    {"fp16 down [2048, 5632]", 32, 88, 9, 8},
    {"fp16 classifier [32000, 2048]", 500, 32, 1, 1},
    {"int4 qkv [2560, 2048]", 40, 8, 4, 4},
    {"int4 wo [2048, 2048]", 32, 8, 8, 8},
    {"int4 gate_up [11264, 2048]", 176, 8, 2, 1},
    {"int4 down [2048, 5632]", 32, 22, 8, 8},
    {"int4 classifier [32000, 2048]", 500, 8, 1, 1},
};

// Every slice holds whole steps and none is empty.
void expect_whole_slices(const ColumnSplit& split, int total_steps) {
  EXPECT_GE(split.k_splits, 1);
  EXPECT_GE(split.steps_per_split, 1);
  EXPECT_GE(split.k_splits * split.steps_per_split, total_steps) << "a step left out";
  EXPECT_LT((split.k_splits - 1) * split.steps_per_split, total_steps) << "an empty last slice";
}

TEST(GemvColumnSplit, TinyLlamasProductsFitOneOrTwoWholeWaves) {
  for (const ProductShape& shape : kTinyLlamaProducts) {
    SCOPED_TRACE(shape.name);
    const ColumnSplit old_split = column_split_filling_a_wave(shape.output_blocks, shape.total_steps, kWave);
    const ColumnSplit fitted = column_split_for_whole_waves(shape.output_blocks, shape.total_steps, kWave);
    EXPECT_EQ(old_split.k_splits, shape.old_k_splits);
    EXPECT_EQ(fitted.k_splits, shape.fitted_k_splits);
    expect_whole_slices(fitted, shape.total_steps);
    EXPECT_LE(modelled_split_steps(shape.output_blocks, fitted, kWave),
              modelled_split_steps(shape.output_blocks, old_split, kWave));
  }
  // The QKV product: one wave of 6 steps per block, not two of 5.
  const ColumnSplit qkv = column_split_for_whole_waves(40, 32, kWave);
  EXPECT_EQ(qkv.steps_per_split, 6);
  EXPECT_LE(40 * qkv.k_splits, kWave);
}

// Small products still split when a split shortens them (the tiny preset's
// and the tests' shapes: 1-3 output blocks, 2-88 steps): one step per block
// there, as before, so the slices' add keeps its tests.
TEST(GemvColumnSplit, SmallProductsSplitIntoSingleSteps) {
  for (const int output_blocks : {1, 2, 3})
    for (const int total_steps : {2, 3, 4, 88}) {
      SCOPED_TRACE(std::to_string(output_blocks) + " output blocks, " + std::to_string(total_steps) + " steps");
      const ColumnSplit fitted = column_split_for_whole_waves(output_blocks, total_steps, kWave);
      EXPECT_EQ(fitted.k_splits, total_steps);
      EXPECT_EQ(fitted.k_splits, column_split_filling_a_wave(output_blocks, total_steps, kWave).k_splits);
    }
  EXPECT_EQ(column_split_for_whole_waves(5, 1, kWave).k_splits, 1);  // one step: nothing to split
  // Nothing to split either where a caller passes nothing (never in the GEMVs).
  EXPECT_EQ(column_split_for_whole_waves(5, 0, kWave).k_splits, 1);
  EXPECT_EQ(column_split_for_whole_waves(0, 32, kWave).k_splits, 1);
  EXPECT_EQ(column_split_filling_a_wave(0, 32, kWave).k_splits, 1);
}

// Over a sweep of shapes and GPU sizes: whole slices, and never more
// modelled time than the old choice (the old one is among the candidates).
TEST(GemvColumnSplit, NeverModelledSlowerThanTheOldSplit) {
  for (const int wave : {2 * 46, 2 * 108, 2 * 132, 2 * 170})
    for (int output_blocks = 1; output_blocks <= 600; output_blocks += 7)
      for (const int total_steps : {1, 2, 5, 8, 22, 32, 64, 88, 172, 500}) {
        const ColumnSplit fitted = column_split_for_whole_waves(output_blocks, total_steps, wave);
        const ColumnSplit old_split = column_split_filling_a_wave(output_blocks, total_steps, wave);
        expect_whole_slices(fitted, total_steps);
        ASSERT_LE(modelled_split_steps(output_blocks, fitted, wave),
                  modelled_split_steps(output_blocks, old_split, wave))
            << output_blocks << " output blocks, " << total_steps << " steps, waves of " << wave;
      }
}

}  // namespace
