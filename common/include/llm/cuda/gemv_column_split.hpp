#pragma once
// How the decode GEMV (common/cuda/cuda_core_gemv.cuh) splits a product's
// input columns over its blocks: host arithmetic only, no CUDA types, so
// that it is tested without a GPU.
//
// The GEMV's grid is (output blocks, k_splits): each block multiplies the
// weights of one block of outputs over one slice of whole steps of columns,
// and the last block of each output block to finish adds the slices'
// partial sums. A decode product is a few MB: on 132 SMs each block streams
// only a few steps, so how the grid meets the GPU decides its time:
//
//   wave       the blocks the GPU holds at once: resident blocks per SM x SMs
//              (the GEMV's launch bounds guarantee at least 2 per SM; the
//              default kernels' registers, near that cap of 128, allow no
//              more, so the model counts 2)
//   waves      ceil(blocks / wave): a grid of one wave and a few blocks runs
//              those few after all the others, on an otherwise idle GPU, for
//              as long as a whole wave takes: a block's time is its steps
//              times the load latency, whatever the other SMs do
//
// So the split is chosen for the least (waves x (steps per block + 1)) plus
// one step for the slices' add when there are slices: the "+ 1" is a block's
// fixed work (its share of x staged, the folded norm's sums, its barriers),
// about a step's worth; more, smaller slices than fill a wave only add
// blocks and partial sums. Ties go to fewer waves (no blocks left for a
// second wave), then to more slices (more blocks in flight in the same
// waves hide more latency).
//
// The split depends on the shape and the GPU only, never on the row count:
// a row's sums are added in the same order alone or among 16 (the GEMV's
// bitwise reproducibility).
#include <algorithm>

namespace llm::cuda {

struct ColumnSplit {
  int steps_per_split = 1;  // steps of columns per slice (the last slice may have fewer)
  int k_splits = 1;         // gridDim.y: slices, none empty
};

// a / b rounded up (a >= 0, b > 0): whole steps, slices, waves.
constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The split of `total_steps` steps into about `wanted_splits` slices of
// whole steps, none empty (at most 65535: gridDim.y's limit).
constexpr ColumnSplit column_split_into(int wanted_splits, int total_steps) {
  if (total_steps <= 1) return {};  // one step (or none): nothing to split
  const int splits = std::clamp(wanted_splits, 1, std::min(total_steps, 65535));
  ColumnSplit split;
  split.steps_per_split = ceil_div(total_steps, splits);
  split.k_splits = ceil_div(total_steps, split.steps_per_split);
  return split;
}

// The modelled time of a split in steps (above): waves x (steps per block +
// 1 fixed), plus 1 for the slices' add.
constexpr long long split_waves(int output_blocks, const ColumnSplit& split, int wave_blocks) {
  const long long blocks = static_cast<long long>(output_blocks) * split.k_splits;
  return (blocks + wave_blocks - 1) / wave_blocks;
}
constexpr long long modelled_split_steps(int output_blocks, const ColumnSplit& split, int wave_blocks) {
  return split_waves(output_blocks, split, wave_blocks) * (split.steps_per_split + 1) + (split.k_splits > 1 ? 1 : 0);
}

// The split with the least modelled time for a grid of `output_blocks`
// output blocks over `total_steps` steps on a GPU that holds `wave_blocks`
// blocks at once (all three at least 1). Candidates: 1 up to 4 waves' worth
// of slices per output block (never more than the steps).
constexpr ColumnSplit column_split_for_whole_waves(int output_blocks, int total_steps, int wave_blocks) {
  if (output_blocks < 1 || wave_blocks < 1) return {};
  const int most_splits = std::min(total_steps, 4 * ceil_div(wave_blocks, output_blocks));
  ColumnSplit best = column_split_into(1, total_steps);
  for (int wanted = 2; wanted <= most_splits; ++wanted) {
    const ColumnSplit candidate = column_split_into(wanted, total_steps);
    const long long time = modelled_split_steps(output_blocks, candidate, wave_blocks);
    const long long best_time = modelled_split_steps(output_blocks, best, wave_blocks);
    const long long waves = split_waves(output_blocks, candidate, wave_blocks);
    const long long best_waves = split_waves(output_blocks, best, wave_blocks);
    // Ties: fewer waves, then more slices (candidates come in growing slices).
    if (time < best_time || (time == best_time && waves <= best_waves)) best = candidate;
  }
  return best;
}

// The split before the waves were counted: about `wave_blocks` blocks,
// rounded up, which can leave a second wave of a few blocks (the before row,
// --no-gemv-wave-fit).
constexpr ColumnSplit column_split_filling_a_wave(int output_blocks, int total_steps, int wave_blocks) {
  if (output_blocks < 1 || wave_blocks < 1) return {};
  return column_split_into(ceil_div(wave_blocks, output_blocks), total_steps);
}

}  // namespace llm::cuda
