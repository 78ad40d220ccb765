// The CUDA model's split-KV decode attention (common/cuda/split_kv_decode_attention.cu)
// against the CPU reference (cpu::reference_decode_attention), on fresh random
// caches: head_dim 1..256, MHA, GQA groups 2..8, MQA (groups 8 and 12, more
// heads than one block takes), lengths across the tile and split boundaries
// (1, 2, 15..17, 31..33, 63..65, 127..129, 1000, 4097), mixed batches whose queries write rows in
// another order, contiguous and paged (block size 16, shuffled table) views,
// fp32 and int8 elements. Also: the split is piecewise constant per
// power-of-two bucket and covers max_length, the workspace covers the
// splits, a max_length of the same bucket gives the same bits, a captured
// CUDA graph replayed with new lengths computes what an eager call does (the
// kernels read the lengths from device memory), and the splits merged by a
// merge kernel (the before row) give the bits of the merge in the last
// split block (the default, which every other test runs), whose tickets
// every call leaves at zero.
//
// Rows of the caches no query may read (past a sequence's length, spare
// blocks) hold NaN, and output rows no query writes hold a sentinel: a kernel
// that reads or writes out of its range fails the comparison. The workspace
// of the splits' partial results holds NaN before every launch and graph
// replay: a merge that reads a partial before its split wrote it fails too.
//
// Every test skips with the reason where no GPU can be present (always in a
// CPU-only build) and fails where one is present but unusable
// (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llm/attention.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/kv_cache.hpp"
#include "test_support.hpp"
#if defined(LLM_WITH_CUDA)
#include <cuda_runtime.h>

#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "split_kv_decode_attention.cuh"
#endif

namespace llm {
namespace {

struct ShapeCase {
  std::string name;
  AttentionShape shape;
};

std::vector<ShapeCase> shape_cases() {
  return {
      {"hd1_q4_kv2", {4, 2, 1}},        // the smallest head
      {"hd8_q8_kv4", {8, 4, 8}},        // the tiny preset: group 2
      {"hd16_q6_kv2", {6, 2, 16}},      // group 3 (a block of 4 heads, one unused)
      {"hd48_q6_kv2", {6, 2, 48}},      // a head that is not a multiple of 32
      {"hd64_q8_kv8", {8, 8, 64}},      // MHA (group 1)
      {"hd64_q16_kv4", {16, 4, 64}},    // group 4
      {"hd100_q4_kv1", {4, 1, 100}},    // MQA, 100 dims (lanes past 100 idle)
      {"hd128_q32_kv4", {32, 4, 128}},  // group 8
      {"hd128_q12_kv1", {12, 1, 128}},  // MQA, group 12: a chunk of 8 heads and one of 4
      {"hd256_q16_kv1", {16, 1, 256}},  // MQA at the largest head: two chunks of 8 heads
      {"hd256_q2_kv2", {2, 2, 256}},    // MHA at the largest head
  };
}

enum class Storage { Contiguous, Paged };

struct KernelCase {
  ShapeCase shape_case;
  Storage storage;
  KvElement element;
};

std::string kernel_case_name(const KernelCase& c) {
  return c.shape_case.name + (c.storage == Storage::Paged ? "_paged" : "_contiguous") +
         (c.element == KvElement::Int8 ? "_int8" : "_fp32");
}
// What GoogleTest prints for a parameter (instead of its bytes).
void PrintTo(const KernelCase& c, std::ostream* os) { *os << kernel_case_name(c); }

std::vector<KernelCase> kernel_cases() {
  std::vector<KernelCase> cases;
  for (const ShapeCase& shape_case : shape_cases())
    for (const Storage storage : {Storage::Contiguous, Storage::Paged})
      for (const KvElement element : {KvElement::Float32, KvElement::Int8})
        cases.push_back({shape_case, storage, element});
  return cases;
}

#if defined(LLM_WITH_CUDA)

constexpr int kPagedBlockSize = 16;  // step 05's block size
constexpr float kOutputSentinel = 12345.0f;  // output rows no query writes must keep it

// Who merges the splits' partial results (DecodeQueries::merge_tickets).
enum class Merge { InLastSplitBlock, MergeKernel };

// Fills the workspace of the splits' partial results (stats and outputs)
// with NaN bits, queued on `stream` before a launch. A merge that ran before
// every split had written its partials then reads NaN and fails the
// comparisons. Without it, it would mostly read the previous call's
// partials, the same as this call's: a buffer freed and allocated again
// (run()) usually gets the same address back, and a graph replays over the
// same workspace.
void poison_workspace(cuda::DeviceBuffer<float>& workspace, cudaStream_t stream) {
  LLM_CUDA_CHECK(cudaMemsetAsync(workspace.data(), 0xFF, workspace.size() * sizeof(float), stream));
}

// One decode batch with its caches in host and device memory: query i sees
// keys 0..lengths[i]-1 of its own sequence and reads and writes batch row
// rows[i]. The caches hold `filled[i]` >= lengths[i] positions, so the
// lengths can be changed later (set_lengths) without new K/V.
class DecodeProblem {
 public:
  DecodeProblem(const AttentionShape& shape, const std::vector<int>& filled, Storage storage, KvElement element,
                std::vector<int> rows, int batch_rows, unsigned seed, float query_range)
      : shape_(shape), rows_(std::move(rows)), lengths_(filled), filled_(filled) {
    const int n_queries = static_cast<int>(filled.size());
    const int kv_dim = shape.n_kv_heads * shape.head_dim;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);

    // The block table of every sequence, side by side. Contiguous: one block
    // of `capacity` rows per sequence, in reverse order (sequence i is block
    // n-1-i). Paged: blocks of 16 rows, the pool's blocks (3 spare) shuffled.
    const int max_filled = *std::max_element(filled.begin(), filled.end());
    int block_size = 0, n_blocks = 0;
    std::vector<int> first_entry;  // [n_queries] where each sequence's table starts
    if (storage == Storage::Contiguous) {
      block_size = max_filled + 3;  // a few rows past the longest sequence
      n_blocks = n_queries;
      for (int i = 0; i < n_queries; ++i) {
        first_entry.push_back(i);
        tables_.push_back(n_queries - 1 - i);
      }
    } else {
      block_size = kPagedBlockSize;
      for (int i = 0; i < n_queries; ++i) {
        first_entry.push_back(static_cast<int>(tables_.size()));
        for (int b = 0; b < (filled[static_cast<std::size_t>(i)] + block_size - 1) / block_size; ++b)
          tables_.push_back(0);
      }
      n_blocks = static_cast<int>(tables_.size()) + 3;
      std::vector<std::int32_t> pool_blocks(static_cast<std::size_t>(n_blocks));
      std::iota(pool_blocks.begin(), pool_blocks.end(), 0);
      std::shuffle(pool_blocks.begin(), pool_blocks.end(), rng);
      std::copy_n(pool_blocks.begin(), tables_.size(), tables_.begin());
    }

    // The pools, NaN (fp32) or NaN scales (int8) wherever no query may read.
    const std::size_t pool_rows = static_cast<std::size_t>(n_blocks) * block_size;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (element == KvElement::Float32) {
      keys_.assign(pool_rows * kv_dim, nan);
      values_.assign(pool_rows * kv_dim, nan);
    } else {
      keys_int8_.assign(pool_rows * kv_dim, std::int8_t{127});
      values_int8_.assign(pool_rows * kv_dim, std::int8_t{-127});
      key_scales_.assign(pool_rows * shape.n_kv_heads, nan);
      value_scales_.assign(pool_rows * shape.n_kv_heads, nan);
    }
    for (int i = 0; i < n_queries; ++i) {
      KvView view;
      view.keys = keys_.empty() ? nullptr : keys_.data();
      view.values = values_.empty() ? nullptr : values_.data();
      view.keys_int8 = keys_int8_.empty() ? nullptr : keys_int8_.data();
      view.values_int8 = values_int8_.empty() ? nullptr : values_int8_.data();
      view.key_scales = key_scales_.empty() ? nullptr : key_scales_.data();
      view.value_scales = value_scales_.empty() ? nullptr : value_scales_.data();
      view.block_table = tables_.data() + first_entry[static_cast<std::size_t>(i)];
      view.block_size = block_size;
      view.kv_dim = kv_dim;
      view.head_dim = shape.head_dim;
      view.element = element;
      host_views_.push_back(view);
    }
    // The valid rows, through the host's own writer (int8: the host's scales).
    std::vector<float> key(static_cast<std::size_t>(kv_dim)), value(static_cast<std::size_t>(kv_dim));
    for (int i = 0; i < n_queries; ++i) {
      for (int pos = 0; pos < filled[static_cast<std::size_t>(i)]; ++pos) {
        for (float& x : key) x = unit(rng);
        for (float& x : value) x = unit(rng);
        store_kv_row(host_views_[static_cast<std::size_t>(i)], pos, key.data(), value.data());
      }
    }
    q_.resize(static_cast<std::size_t>(batch_rows) * shape.n_heads * shape.head_dim);
    for (float& x : q_) x = query_range * unit(rng);

    // The same on the device: the views point at device copies of the pools
    // and tables, at the same offsets.
    d_keys_ = cuda::DeviceBuffer<float>(std::span<const float>(keys_));
    d_values_ = cuda::DeviceBuffer<float>(std::span<const float>(values_));
    d_keys_int8_ = cuda::DeviceBuffer<std::int8_t>(std::span<const std::int8_t>(keys_int8_));
    d_values_int8_ = cuda::DeviceBuffer<std::int8_t>(std::span<const std::int8_t>(values_int8_));
    d_key_scales_ = cuda::DeviceBuffer<float>(std::span<const float>(key_scales_));
    d_value_scales_ = cuda::DeviceBuffer<float>(std::span<const float>(value_scales_));
    d_tables_ = cuda::DeviceBuffer<std::int32_t>(std::span<const std::int32_t>(tables_));
    for (int i = 0; i < n_queries; ++i) {
      KvView view = host_views_[static_cast<std::size_t>(i)];
      view.keys = d_keys_.data();
      view.values = d_values_.data();
      view.keys_int8 = d_keys_int8_.data();
      view.values_int8 = d_values_int8_.data();
      view.key_scales = d_key_scales_.data();
      view.value_scales = d_value_scales_.data();
      view.block_table = d_tables_.data() + first_entry[static_cast<std::size_t>(i)];
      device_views_.push_back(view);
    }
    d_views_ = cuda::DeviceBuffer<KvView>(std::span<const KvView>(device_views_));
    d_lengths_ = cuda::DeviceBuffer<int>(std::span<const int>(lengths_));
    if (!rows_.empty()) d_rows_ = cuda::DeviceBuffer<int>(std::span<const int>(rows_));
    d_q_ = cuda::DeviceBuffer<float>(std::span<const float>(q_));
    d_out_ = cuda::DeviceBuffer<float>(q_.size());
    d_merge_tickets_ = cuda::DeviceBuffer<unsigned int>(cuda::kernels::split_kv_decode_merge_tickets(shape, n_queries));
    d_merge_tickets_.zero();  // what the kernel needs before its first call
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
  }

  int n_queries() const { return static_cast<int>(lengths_.size()); }
  int max_length() const { return *std::max_element(lengths_.begin(), lengths_.end()); }
  const std::vector<int>& lengths() const { return lengths_; }
  const float* device_q() const { return d_q_.data(); }
  float* device_out() { return d_out_.data(); }

  // New lengths (each at most the filled one), in host and device memory.
  void set_lengths(const std::vector<int>& lengths) {
    ASSERT_EQ(lengths.size(), filled_.size());
    for (std::size_t i = 0; i < lengths.size(); ++i) ASSERT_LE(lengths[i], filled_[i]);
    lengths_ = lengths;
    d_lengths_.upload(std::span<const int>(lengths_));
    LLM_CUDA_CHECK(cudaDeviceSynchronize());  // the (pageable) upload is done before any stream reads it
  }

  // The batch for the kernel; max_length 0: the longest length.
  cuda::kernels::DecodeQueries queries(int max_length = 0, Merge merge = Merge::InLastSplitBlock) {
    cuda::kernels::DecodeQueries queries;
    queries.merge_tickets = merge == Merge::InLastSplitBlock ? d_merge_tickets_.data() : nullptr;
    queries.views = d_views_.data();
    queries.lengths = d_lengths_.data();
    queries.rows = rows_.empty() ? nullptr : d_rows_.data();
    queries.views_host = device_views_.data();
    queries.lengths_host = lengths_.data();
    queries.rows_host = rows_.empty() ? nullptr : rows_.data();
    queries.n_queries = n_queries();
    queries.max_length = max_length > 0 ? max_length : this->max_length();
    return queries;
  }

  // Fills the device output with the sentinel (before a launch).
  void reset_output() {
    const std::vector<float> sentinel(q_.size(), kOutputSentinel);
    d_out_.upload(std::span<const float>(sentinel));
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The merge tickets as they are now (zero between calls).
  std::vector<unsigned int> merge_tickets() const {
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned int> tickets(d_merge_tickets_.size());
    d_merge_tickets_.download(std::span<unsigned int>(tickets));
    return tickets;
  }
  std::vector<float> download_output() const {
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> out(q_.size());
    d_out_.download(std::span<float>(out));
    return out;
  }

  // An eager call (default stream); max_length 0: the longest length.
  std::vector<float> run(int max_length = 0, Merge merge = Merge::InLastSplitBlock) {
    reset_output();
    const cuda::kernels::DecodeQueries batch = queries(max_length, merge);
    const std::size_t workspace_floats =
        cuda::kernels::split_kv_decode_workspace_floats(shape_, n_queries(), batch.max_length);
    cuda::DeviceBuffer<float> workspace(std::max<std::size_t>(1, workspace_floats));
    poison_workspace(workspace, nullptr);  // a new allocation: most likely the previous call's partials
    cuda::kernels::split_kv_decode_attention(shape_, d_q_.data(), batch, d_out_.data(), workspace.data(), nullptr);
    return download_output();
  }

  // The CPU reference at the current lengths, in the kernel's output layout:
  // row rows[i] holds query i's result, every other row the sentinel.
  std::vector<float> reference() const {
    const std::size_t row_floats = static_cast<std::size_t>(shape_.n_heads) * shape_.head_dim;
    std::vector<float> gathered_q(static_cast<std::size_t>(n_queries()) * row_floats);
    for (int i = 0; i < n_queries(); ++i)
      std::copy_n(q_.begin() + static_cast<std::ptrdiff_t>(batch_row(i) * row_floats), row_floats,
                  gathered_q.begin() + static_cast<std::ptrdiff_t>(i * row_floats));
    std::vector<float> gathered_out(gathered_q.size());
    cpu::reference_decode_attention(shape_, gathered_q.data(), host_views_, lengths_, gathered_out.data());
    std::vector<float> expected(q_.size(), kOutputSentinel);
    for (int i = 0; i < n_queries(); ++i)
      std::copy_n(gathered_out.begin() + static_cast<std::ptrdiff_t>(i * row_floats), row_floats,
                  expected.begin() + static_cast<std::ptrdiff_t>(batch_row(i) * row_floats));
    return expected;
  }

 private:
  std::size_t batch_row(int query) const {
    return static_cast<std::size_t>(rows_.empty() ? query : rows_[static_cast<std::size_t>(query)]);
  }

  AttentionShape shape_;
  std::vector<int> rows_;  // empty: query i is row i
  std::vector<int> lengths_;
  std::vector<int> filled_;
  std::vector<std::int32_t> tables_;
  std::vector<float> keys_, values_, key_scales_, value_scales_;
  std::vector<std::int8_t> keys_int8_, values_int8_;
  std::vector<KvView> host_views_;    // host pools
  std::vector<KvView> device_views_;  // device pools (the host copy of d_views_)
  std::vector<float> q_;
  cuda::DeviceBuffer<float> d_keys_, d_values_, d_key_scales_, d_value_scales_;
  cuda::DeviceBuffer<std::int8_t> d_keys_int8_, d_values_int8_;
  cuda::DeviceBuffer<std::int32_t> d_tables_;
  cuda::DeviceBuffer<KvView> d_views_;
  cuda::DeviceBuffer<int> d_lengths_, d_rows_;
  cuda::DeviceBuffer<float> d_q_, d_out_;
  cuda::DeviceBuffer<unsigned int> d_merge_tickets_;  // [split_kv_decode_merge_tickets(shape, n_queries)]
};

// fp32 sums in another order than the reference's (tiles, warps, splits,
// exp2 of pre-scaled scores): within compare()'s fp32 tolerance, 1e-5
// absolute + 1e-4 relative; a NaN or Inf anywhere fails.
void expect_matches_reference(const std::vector<float>& got, const std::vector<float>& expected,
                              const std::string& what) {
  const CompareResult result = compare(got, expected, tolerance_for(DType::F32));
  EXPECT_TRUE(result.ok) << what << ": " << result.summary() << " (worst element " << result.worst_index << ": got "
                         << got[result.worst_index] << ", expected " << expected[result.worst_index] << ")";
}

std::string lengths_text(const std::vector<int>& lengths) {
  std::string text;
  for (const int length : lengths) text += (text.empty() ? "" : ",") + std::to_string(length);
  return "lengths {" + text + "}";
}

#endif  // LLM_WITH_CUDA

// ---------------------------------------------------------------------------
// Against the CPU reference, per shape, storage and element.

class SplitKvDecode : public ::testing::TestWithParam<KernelCase> {};

// Every length alone (one query, row 0), across the tile boundaries (tiles
// of 16, 32 or 64 keys) and the split boundaries: one split up to 64 keys,
// 2 at 65, 4 at 129 (the short lengths: every boundary the kernel has, and
// few enough keys for compute-sanitizer's racecheck to finish), then 128
// splits at 4097 (the long ones).
void expect_single_queries_match(const KernelCase& c, std::initializer_list<int> lengths, unsigned seed) {
#if defined(LLM_WITH_CUDA)
  for (const int length : lengths) {
    DecodeProblem problem(c.shape_case.shape, {length}, c.storage, c.element, {}, 1, ++seed, 1.0f);
    expect_matches_reference(problem.run(), problem.reference(), "length " + std::to_string(length));
  }
#else
  static_cast<void>(c), static_cast<void>(lengths), static_cast<void>(seed);
#endif
}

TEST_P(SplitKvDecode, ShortSingleQueriesMatchReference) {
  LLM_REQUIRE_CUDA_DEVICE();
  expect_single_queries_match(GetParam(), {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129}, 1000);
}

TEST_P(SplitKvDecode, LongSingleQueriesMatchReference) {
  LLM_REQUIRE_CUDA_DEVICE();
  expect_single_queries_match(GetParam(), {1000, 4097}, 2000);
}

// A batch of mixed lengths (many splits empty for the short queries) whose
// queries write rows in another order, two rows left alone; queries 2.5x
// larger, so the softmax is peakier and the running max moves more.
TEST_P(SplitKvDecode, MixedBatchMatchesReference) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const KernelCase& c = GetParam();
  const std::vector<int> lengths = {2500, 1, 65, 1000, 2, 127, 64, 300};
  const std::vector<int> rows = {7, 2, 9, 0, 4, 1, 8, 5};  // batch rows 3 and 6 belong to no query
  DecodeProblem problem(c.shape_case.shape, lengths, c.storage, c.element, rows, 10, 77, 2.5f);
  expect_matches_reference(problem.run(), problem.reference(), lengths_text(lengths));
#endif
}

// The merge kernel (the before row) and the merge in the last split block
// of each (query, KV head, head chunk) compute the same expression in the
// same order: the same bits, on single queries of 2 and 4 splits and on
// the mixed batch (up to 64 splits, empty splits, rows in another order;
// MQA's two head chunks in the group-12 and head-256 cases). The tickets are zero after every call, so a second call takes
// the same path and gives the same bits again.
TEST_P(SplitKvDecode, MergeKernelGivesTheLastSplitBlocksBits) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const KernelCase& c = GetParam();
  const auto expect_same_bits = [](DecodeProblem& problem, const std::string& what) {
    const std::vector<float> in_last_block = problem.run(0, Merge::InLastSplitBlock);
    const std::vector<unsigned int> tickets = problem.merge_tickets();
    EXPECT_TRUE(std::all_of(tickets.begin(), tickets.end(), [](unsigned int t) { return t == 0; }))
        << what << ": a call left a merge ticket other than zero";
    const std::vector<float> again = problem.run(0, Merge::InLastSplitBlock);
    const std::vector<float> by_kernel = problem.run(0, Merge::MergeKernel);
    ASSERT_EQ(in_last_block.size(), by_kernel.size());
    EXPECT_EQ(std::memcmp(in_last_block.data(), again.data(), again.size() * sizeof(float)), 0)
        << what << ": a second call merged differently";
    EXPECT_EQ(std::memcmp(in_last_block.data(), by_kernel.data(), by_kernel.size() * sizeof(float)), 0)
        << what << ": the merge kernel's bits differ from the last split block's";
    expect_matches_reference(by_kernel, problem.reference(), what + ", merge kernel");
  };
  unsigned seed = 3000;
  for (const int length : {65, 129}) {
    DecodeProblem problem(c.shape_case.shape, {length}, c.storage, c.element, {}, 1, ++seed, 1.0f);
    expect_same_bits(problem, "length " + std::to_string(length));
  }
  const std::vector<int> lengths = {2500, 1, 65, 1000, 2, 127, 64, 300};
  DecodeProblem mixed(c.shape_case.shape, lengths, c.storage, c.element, {7, 2, 9, 0, 4, 1, 8, 5}, 10, 78, 2.5f);
  expect_same_bits(mixed, lengths_text(lengths));
#endif
}

INSTANTIATE_TEST_SUITE_P(Cases, SplitKvDecode, ::testing::ValuesIn(kernel_cases()),
                         [](const ::testing::TestParamInfo<KernelCase>& param_info) {
                           return kernel_case_name(param_info.param);
                         });

// ---------------------------------------------------------------------------
// The split and the workspace.

TEST(SplitKvDecodeSplit, PiecewiseConstantPerPowerOfTwoAndCoversMaxLength) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  using cuda::kernels::DecodeSplit;
  using cuda::kernels::split_kv_decode_split;
  const DecodeSplit first = split_kv_decode_split(1);
  EXPECT_EQ(first.splits, 1) << "a short context is one launch";
  DecodeSplit previous = first;
  int failures = 0;
  for (int max_length = 1; max_length <= 70000 && failures < 5; ++max_length) {
    const DecodeSplit split = split_kv_decode_split(max_length);
    const long long covered = static_cast<long long>(split.splits) * split.keys_per_split;
    const bool covers = split.splits >= 1 && split.keys_per_split >= 1 && covered >= max_length;
    // The bucket (splits x keys per split) is a power of two, less than
    // twice max_length (or the smallest bucket).
    const bool power_of_two = (covered & (covered - 1)) == 0;
    const bool tight = covered < 2LL * max_length ||
                       covered == static_cast<long long>(first.splits) * first.keys_per_split;
    // max_length - 1 and max_length share a bucket unless max_length - 1 is a power of two.
    const bool crossing = max_length > 1 && ((max_length - 1) & (max_length - 2)) == 0;
    const bool constant =
        crossing || (split.splits == previous.splits && split.keys_per_split == previous.keys_per_split);
    const bool monotonic = split.splits >= previous.splits && split.keys_per_split >= previous.keys_per_split;
    if (!(covers && power_of_two && tight && constant && monotonic)) {
      ++failures;
      ADD_FAILURE() << "max_length " << max_length << ": " << split.splits << " splits of " << split.keys_per_split
                    << " keys (previous " << previous.splits << " of " << previous.keys_per_split << ")";
    }
    previous = split;
  }
  // Every length up to 64 shares one launch (a graph captured at position 1 replays to 64 at least).
  EXPECT_EQ(split_kv_decode_split(64).splits, first.splits);
  EXPECT_EQ(split_kv_decode_split(64).keys_per_split, first.keys_per_split);
  // Long contexts are split.
  EXPECT_GT(split_kv_decode_split(4097).splits, 1);
#endif
}

TEST(SplitKvDecodeSplit, WorkspaceCoversEverySplit) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  for (const ShapeCase& shape_case : shape_cases()) {
    const AttentionShape& shape = shape_case.shape;
    for (const int n_queries : {1, 3, 64}) {
      for (const int max_length : {1, 64, 128, 129, 1000, 1024, 4097, 40000}) {
        const auto split = cuda::kernels::split_kv_decode_split(max_length);
        const std::size_t floats = cuda::kernels::split_kv_decode_workspace_floats(shape, n_queries, max_length);
        if (split.splits > 1) {
          const std::size_t needed = static_cast<std::size_t>(n_queries) * shape.n_heads * split.splits *
                                     (static_cast<std::size_t>(shape.head_dim) + 2);
          EXPECT_GE(floats, needed) << shape_case.name << ", " << n_queries << " queries, max_length " << max_length;
        }
        // One ticket per (query, KV head, chunk of up to 8 query heads), never more than one per query head.
        const std::size_t tickets = cuda::kernels::split_kv_decode_merge_tickets(shape, n_queries);
        const int group = shape.n_heads / shape.n_kv_heads;
        EXPECT_EQ(tickets, static_cast<std::size_t>(n_queries) * shape.n_kv_heads * ((group + 7) / 8))
            << shape_case.name;
        EXPECT_LE(tickets, static_cast<std::size_t>(n_queries) * shape.n_heads) << shape_case.name;
        // The same for every max_length of the bucket (a graph's workspace stays big enough).
        const int bucket_end = split.splits * split.keys_per_split;
        EXPECT_EQ(floats, cuda::kernels::split_kv_decode_workspace_floats(shape, n_queries, bucket_end))
            << shape_case.name << ", max_length " << max_length << " vs " << bucket_end;
      }
    }
  }
#endif
}

// ---------------------------------------------------------------------------
// CUDA-graph stability.

// max_length only picks the bucket: two max_lengths of one bucket give the
// same launches, hence the same bits.
TEST(SplitKvDecodeGraph, SameBucketGivesIdenticalBits) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const std::vector<int> lengths = {300, 700, 1000, 5};
  for (const Storage storage : {Storage::Contiguous, Storage::Paged}) {
    DecodeProblem problem({32, 8, 128}, lengths, storage, KvElement::Float32, {3, 0, 2, 1}, 4, 5, 1.0f);
    const auto split_1000 = cuda::kernels::split_kv_decode_split(1000);
    const auto split_1024 = cuda::kernels::split_kv_decode_split(1024);
    ASSERT_EQ(split_1000.splits, split_1024.splits);
    ASSERT_EQ(split_1000.keys_per_split, split_1024.keys_per_split);
    const std::vector<float> at_1000 = problem.run(1000);
    const std::vector<float> at_1024 = problem.run(1024);
    ASSERT_EQ(at_1000.size(), at_1024.size());
    EXPECT_EQ(std::memcmp(at_1000.data(), at_1024.data(), at_1000.size() * sizeof(float)), 0);
    expect_matches_reference(at_1000, problem.reference(), lengths_text(lengths));
  }
#endif
}

// A launch captured into a CUDA graph at some lengths, replayed after the
// lengths in device memory changed (same bucket): the replay computes the
// new lengths' attention, bit for bit what an eager call computes.
TEST(SplitKvDecodeGraph, ReplayWithNewLengthsMatchesEagerCall) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  for (const KvElement element : {KvElement::Float32, KvElement::Int8}) {
    const AttentionShape shape{16, 4, 64};
    const std::vector<int> filled = {1000, 1024, 900, 17};
    DecodeProblem problem(shape, filled, Storage::Paged, element, {}, 4, 99, 1.0f);
    const std::vector<int> captured_lengths = {300, 700, 900, 1};   // max 900: bucket 1024
    const std::vector<int> replayed_lengths = {1000, 1024, 513, 17};  // max 1024: the same bucket
    problem.set_lengths(captured_lengths);

    const int max_length = 900;
    cuda::DeviceBuffer<float> workspace(std::max<std::size_t>(
        1, cuda::kernels::split_kv_decode_workspace_floats(shape, problem.n_queries(), 1024)));
    cudaStream_t stream = nullptr;
    LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cuda::kernels::split_kv_decode_attention(shape, problem.device_q(), problem.queries(max_length),
                                             problem.device_out(), workspace.data(), stream);
    cudaGraph_t graph = nullptr;
    LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t replay = nullptr;
    LLM_CUDA_CHECK(cudaGraphInstantiate(&replay, graph, 0));

    // The captured lengths first: the graph computes them.
    problem.reset_output();
    poison_workspace(workspace, stream);  // every replay writes its partials over the same workspace
    LLM_CUDA_CHECK(cudaGraphLaunch(replay, stream));
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> captured = problem.download_output();
    expect_matches_reference(captured, problem.reference(), "graph at " + lengths_text(captured_lengths));

    // New lengths in device memory only; the same graph.
    problem.set_lengths(replayed_lengths);
    problem.reset_output();
    poison_workspace(workspace, stream);
    LLM_CUDA_CHECK(cudaGraphLaunch(replay, stream));
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> replayed = problem.download_output();
    expect_matches_reference(replayed, problem.reference(), "graph replayed at " + lengths_text(replayed_lengths));
    const std::vector<float> eager = problem.run(1024);
    ASSERT_EQ(replayed.size(), eager.size());
    EXPECT_EQ(std::memcmp(replayed.data(), eager.data(), eager.size() * sizeof(float)), 0)
        << "a replay and an eager call of the same inputs differ";

    LLM_CUDA_CHECK(cudaGraphExecDestroy(replay));
    LLM_CUDA_CHECK(cudaGraphDestroy(graph));
    LLM_CUDA_CHECK(cudaStreamDestroy(stream));
  }
#endif
}

// ---------------------------------------------------------------------------
// Bad input.

TEST(SplitKvDecodeInput, RejectsShapesItCannotTakeAndEmptyBatchesLaunchNothing) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  DecodeProblem problem({4, 2, 8}, {10, 20}, Storage::Paged, KvElement::Float32, {}, 2, 3, 1.0f);
  cuda::DeviceBuffer<float> workspace(1);
  const auto call = [&](const AttentionShape& shape, const cuda::kernels::DecodeQueries& queries) {
    cuda::kernels::split_kv_decode_attention(shape, problem.device_q(), queries, problem.device_out(),
                                             workspace.data(), nullptr);
  };
  EXPECT_THROW(call({4, 2, 0}, problem.queries()), InputError);    // head_dim 0
  EXPECT_THROW(call({4, 2, 257}, problem.queries()), InputError);  // above kMaxHeadDim
  EXPECT_THROW(call({6, 4, 8}, problem.queries()), InputError);    // heads not a multiple of KV heads
  EXPECT_THROW(call({4, 1, 8}, problem.queries()), InputError);    // the views' rows are 2 KV heads wide
  EXPECT_THROW(call({4, 2, 8}, problem.queries(15)), InputError);  // a length above max_length
  cuda::kernels::DecodeQueries empty;  // n_queries 0, null arrays: nothing to do
  EXPECT_NO_THROW(call({4, 2, 8}, empty));
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

}  // namespace
}  // namespace llm
