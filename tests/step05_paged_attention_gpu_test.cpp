// Step 05 (PagedAttention), CUDA: the decode kernel on a shuffled pool of
// blocks, the same kernel on the contiguous layout, and its contiguous twin,
// against common's CPU reference: block sizes 1, 7, 16, 64, lengths 1, B-1,
// B, B+1 and odd ones, many sequences of different lengths in one launch
// (the long ones split into partitions and merged, the short ones leaving
// partitions empty), GQA groups 1 to 8 and MQA, head_dim 8, 13, 64, 80, 128;
// prefill with n_past > 0; query rows mapped through `rows`; the CUDA model
// with the paged hook against the CPU model. Skips with the reason where no
// GPU can be present, fails where one is present but unusable
// (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "llm/attention.hpp"
#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/kv_cache.hpp"
#include "llm/token_batch.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/cuda_paged_runner.hpp"
#include "step05_paged_attention/measure/kernel_overhead.hpp"
#include "step05_paged_attention/measure/shuffled_kv_pool.hpp"
#include "step05_attention_cases.hpp"
#include "test_support.hpp"

namespace step05 {
namespace {

const llm::Tolerance kF32 = llm::tolerance_for(llm::DType::F32);

// Fresh random K/V for n_seqs sequences of `capacity` positions: a
// contiguous host cache (the reference reads it) and the same rows on the GPU.
struct TestKv {
  llm::AttentionShape shape;
  int capacity;
  llm::CpuKvCache cache;
  std::vector<llm::KvView> views;  // [n_seqs] host views of the cache
  CudaKvLayouts device;

  TestKv(const llm::AttentionShape& s, int n_seqs, int capacity_, std::uint64_t seed, float key_scale)
      : shape(s), capacity(capacity_), cache(one_layer_config(s, capacity_), n_seqs, capacity_),
        device(s, n_seqs, capacity_) {
    const std::size_t floats = static_cast<std::size_t>(capacity) * s.n_kv_heads * s.head_dim;
    for (int seq = 0; seq < n_seqs; ++seq) {
      const llm::KvView v = cache.view(0, seq);
      const auto keys = llm::testing::random_vector(floats, seed + 2 * seq, key_scale);
      const auto values = llm::testing::random_vector(floats, seed + 2 * seq + 1, 1.0f);
      std::copy(keys.begin(), keys.end(), v.key_row(0));  // the sequence's rows (v.keys is the layer's pool)
      std::copy(values.begin(), values.end(), v.value_row(0));
      device.upload_sequence(seq, keys, values);
      views.push_back(v);
    }
  }
  // A paged layout on the GPU with the blocks shuffled (the tables a host
  // ShuffledKvPool with this seed would use).
  void add_shuffled_layout(int block_size, std::uint64_t seed) {
    const int blocks = (capacity + block_size - 1) / block_size;
    device.add_paged_layout(block_size, shuffled_block_tables(static_cast<int>(views.size()), blocks, seed));
  }
};

class CudaPagedDecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(CudaPagedDecodeTest, ShuffledPoolAndContiguousMatchTheCpuReference) {
  LLM_REQUIRE_CUDA_DEVICE();
  const DecodeCase& c = GetParam();
  const llm::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim};
  const int n_seqs = static_cast<int>(c.lengths.size());
  TestKv kv(shape, n_seqs, *std::max_element(c.lengths.begin(), c.lengths.end()), 11, c.key_scale);
  kv.add_shuffled_layout(c.block_size, 5);
  const auto q = llm::testing::random_vector(static_cast<std::size_t>(n_seqs) * c.n_heads * c.head_dim, 3);
  std::vector<float> reference(q.size(), std::numeric_limits<float>::quiet_NaN());
  llm::cpu::reference_decode_attention(shape, q.data(), kv.views, c.lengths, reference.data());

  struct Run {
    const char* what;
    CudaDecodeKernel kernel;
    int layout;
  };
  for (const Run& run : {Run{"paged kernel, shuffled pool", CudaDecodeKernel::Paged, c.block_size},
                         Run{"paged kernel, contiguous layout", CudaDecodeKernel::Paged, CudaKvLayouts::kContiguousLayout},
                         Run{"contiguous kernel", CudaDecodeKernel::Contiguous, CudaKvLayouts::kContiguousLayout}}) {
    SCOPED_TRACE(run.what);
    const std::vector<float> out = kv.device.decode(run.kernel, run.layout, q, c.lengths);
    const llm::CompareResult check = llm::compare(out, reference, kF32);
    EXPECT_TRUE(check.ok) << check.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Step05, CudaPagedDecodeTest,
    ::testing::Values(
        // The real model's heads (head_dim 8: the narrow lane layout), block size 1 and 7.
        DecodeCase{8, 4, 8, 1, {1, 2, 5, 40}, 1.0f},
        DecodeCase{8, 4, 8, 7, {1, 6, 7, 8, 15, 22, 301}, 1.0f},
        // head_dim 64 (float2 loads), lengths around the block size and the 32-key warp span.
        DecodeCase{8, 2, 64, 16, {1, 15, 16, 17, 31, 32, 33, 100}, 1.0f},
        // Llama-3-8B's heads (head_dim 128, float4 loads, GQA 4); one long sequence split into
        // partitions and merged beside short ones that leave partitions empty.
        DecodeCase{32, 8, 128, 16, {5000, 1, 17, 300}, 1.0f},
        DecodeCase{8, 1, 128, 64, {2049, 64, 65}, 8.0f},
        // Groups of 8 (one block per KV head) and MQA with 32 heads (4 chunks of 8).
        DecodeCase{16, 2, 64, 32, {700, 9}, 1.0f},
        DecodeCase{32, 1, 64, 16, {1500, 3}, 1.0f},
        // Odd head dims: 80 with groups of 3 (the wide lane layout), 13 with MHA.
        DecodeCase{6, 2, 80, 7, {50, 13, 1200}, 1.0f},
        DecodeCase{4, 4, 13, 5, {9, 31}, 8.0f},
        // Past 32k positions, one sequence (the most partitions).
        DecodeCase{8, 2, 64, 16, {33000}, 1.0f}),
    [](const auto& info) { return decode_case_name(info.param); });

class CudaPagedPrefillTest : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(CudaPagedPrefillTest, ShuffledPoolAndContiguousMatchTheCpuReference) {
  LLM_REQUIRE_CUDA_DEVICE();
  const PrefillCase& c = GetParam();
  const llm::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim};
  TestKv kv(shape, 2, c.n_past + c.n_new, 21, 2.0f);  // prefill reads sequence 1; sequence 0 shares the pool
  kv.add_shuffled_layout(c.block_size, 9);
  const auto q = llm::testing::random_vector(static_cast<std::size_t>(c.n_new) * c.n_heads * c.head_dim, 4);
  std::vector<float> reference(q.size(), std::numeric_limits<float>::quiet_NaN());
  llm::cpu::reference_prefill_attention(shape, q.data(), kv.views[1], c.n_past, c.n_new, reference.data());
  for (const int layout : {c.block_size, CudaKvLayouts::kContiguousLayout}) {
    SCOPED_TRACE(layout == CudaKvLayouts::kContiguousLayout ? "contiguous layout" : "shuffled pool");
    const std::vector<float> out = kv.device.prefill(layout, 1, q, c.n_past, c.n_new);
    const llm::CompareResult check = llm::compare(out, reference, kF32);
    EXPECT_TRUE(check.ok) << check.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(Step05, CudaPagedPrefillTest,
                         ::testing::Values(PrefillCase{8, 4, 8, 7, 0, 9}, PrefillCase{8, 2, 64, 16, 37, 20},
                                           PrefillCase{32, 8, 128, 1, 5, 3}, PrefillCase{6, 6, 80, 16, 100, 1},
                                           // Long enough for partitions: early rows use fewer of them.
                                           PrefillCase{32, 8, 128, 16, 3000, 40}),
                         [](const auto& info) { return prefill_case_name(info.param); });

// Query i reads and writes row rows[i] of q and out (the model's mixed
// batches); a row no query names is left alone (NaN here).
TEST(CudaPagedAttention, QueriesReadAndWriteTheirRows) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::AttentionShape shape{8, 2, 64};
  const std::vector<int> lengths = {40, 1, 300};
  TestKv kv(shape, 3, 300, 31, 1.0f);
  kv.add_shuffled_layout(16, 2);
  const std::size_t row = 8 * 64;
  const auto q = llm::testing::random_vector(4 * row, 6);  // 4 rows; row 3 is nobody's
  const std::vector<int> rows = {2, 0, 1};
  const std::vector<float> out = kv.device.decode(CudaDecodeKernel::Paged, 16, q, lengths, rows);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("query " + std::to_string(i));
    const std::size_t r = static_cast<std::size_t>(rows[static_cast<std::size_t>(i)]);
    std::vector<float> reference(row);
    const llm::KvView view[1] = {kv.views[static_cast<std::size_t>(i)]};
    const int length[1] = {lengths[static_cast<std::size_t>(i)]};
    llm::cpu::reference_decode_attention(shape, q.data() + r * row, view, length, reference.data());
    const llm::CompareResult check =
        llm::compare(std::span<const float>(out.data() + r * row, row), reference, kF32);
    EXPECT_TRUE(check.ok) << check.summary();
  }
  EXPECT_TRUE(std::all_of(out.begin() + 3 * row, out.end(), [](float x) { return std::isnan(x); }));
}

// A NaN in the cache reaches the output: a kernel cannot pass by dropping it.
TEST(CudaPagedAttention, NanInAKeyReachesTheOutput) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::AttentionShape shape{4, 2, 64};
  const std::vector<int> lengths = {600};
  auto keys = llm::testing::random_vector(600 * 128, 1);
  const auto values = llm::testing::random_vector(600 * 128, 2);
  keys[333 * 128 + 5] = std::numeric_limits<float>::quiet_NaN();  // position 333, KV head 0
  CudaKvLayouts device(shape, 1, 600);
  device.upload_sequence(0, keys, values);
  device.add_paged_layout(16, shuffled_block_tables(1, 38, 3));
  const auto q = llm::testing::random_vector(4 * 64, 3);
  for (const int layout : {16, CudaKvLayouts::kContiguousLayout}) {
    const std::vector<float> out = device.decode(CudaDecodeKernel::Paged, layout, q, lengths);
    EXPECT_TRUE(std::isnan(out[0])) << "query head 0 reads KV head 0";
    EXPECT_TRUE(std::isfinite(out[2 * 64])) << "query head 2 reads KV head 1";
  }
}

// The contiguous kernel refuses a paged view (it would read the wrong rows);
// bad lengths and int8 never reach a kernel.
TEST(CudaPagedAttention, RefusesWhatItCannotRead) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::AttentionShape shape{4, 2, 16};
  TestKv kv(shape, 2, 50, 1, 1.0f);
  kv.add_shuffled_layout(8, 1);
  const auto q = llm::testing::random_vector(2 * 4 * 16, 2);
  const std::vector<int> lengths = {50, 9};
  EXPECT_THROW(kv.device.decode(CudaDecodeKernel::Contiguous, 8, q, lengths), llm::InputError);
  EXPECT_THROW(kv.device.decode(CudaDecodeKernel::Paged, 8, q, std::vector<int>{0, 9}), llm::InputError);
  EXPECT_THROW(kv.device.decode(CudaDecodeKernel::Paged, 8, q, std::vector<int>{51, 9}), llm::InputError);
  EXPECT_THROW(kv.device.add_paged_layout(8, std::vector<std::int32_t>(14, 0)), llm::InputError);  // not a permutation
}

// The CUDA model with the paged hook against the CPU model: a prompt, then
// a batch that decodes two sequences of different lengths while a third
// prefills (rows of one batch in any order), then greedy decode steps of all
// three in one launch per layer. GQA configs with head_dim 8, 16 and 128.
class CudaPagedModelTest : public ::testing::TestWithParam<int> {};

TEST_P(CudaPagedModelTest, MatchesTheCpuModel) {
  LLM_REQUIRE_CUDA_DEVICE();
  const int head_dim = GetParam();
  const llm::ModelConfig config = llm::make_config(4 * head_dim, 96, 2, 4, 2, 64, 96, false);
  const llm::ModelWeights weights = llm::random_weights(config, 23);
  llm::CpuModel cpu(weights);
  const auto gpu = make_cuda_paged_model(weights);
  const auto cpu_cache = cpu.make_cache(3, 96);
  const auto gpu_cache = gpu->make_cache(3, 96);
  const int vocab = config.vocab_size;
  const auto run = [&](llm::Model& model, const llm::TokenBatch& batch, llm::KvCache& cache) {
    const std::span<const float> logits = model.forward(batch, cache, llm::LogitsFor::AllRows);
    return std::vector<float>(logits.begin(), logits.end());
  };
  const auto both = [&](const llm::TokenBatch& batch, const std::string& what) {
    const std::vector<float> ref = run(cpu, batch, *cpu_cache);
    llm::testing::expect_logit_rows_close(run(*gpu, batch, *gpu_cache), ref, vocab, what);
    return ref;
  };
  both(llm::TokenBatch::prefill(llm::testing::random_tokens(20, vocab, 1), 0, 0), "prompt of sequence 0");
  both(llm::TokenBatch::prefill(llm::testing::random_tokens(7, vocab, 2), 0, 1), "prompt of sequence 1");
  llm::TokenBatch mixed;
  mixed.add(5, 20, 0);  // decode, sequence 0
  for (int i = 0; i < 12; ++i) mixed.add((i * 7) % vocab, i, 2);  // prefill, sequence 2
  mixed.add(9, 7, 1);   // decode, sequence 1
  both(mixed, "mixed batch");
  std::vector<int> lengths = {21, 8, 12};
  for (int step = 0; step < 10; ++step) {
    llm::TokenBatch decode;
    for (int s = 0; s < 3; ++s) decode.add((step * 3 + s) % vocab, lengths[static_cast<std::size_t>(s)]++, s);
    both(decode, "decode step " + std::to_string(step));
  }
}

INSTANTIATE_TEST_SUITE_P(Step05, CudaPagedModelTest, ::testing::Values(8, 16, 128),
                         [](const auto& info) { return "hd" + std::to_string(info.param); });

// The measurement on the GPU at a small size: every CUDA cell checked.
TEST(CudaKernelOverhead, SmallRunChecksEveryCell) {
  LLM_REQUIRE_CUDA_DEVICE();
  KernelOverheadOptions o;
  o.contexts = {1024, 4096};
  o.batches = {1, 4};
  o.block_sizes = {16};
  o.repeats = 1;
  o.cpu = false;
  o.cuda = true;
  const KernelOverheadResult r = run_kernel_overhead(o);
  ASSERT_EQ(r.cells.size(), 2u * 2u * 2u);
  for (const KernelOverheadCell& c : r.cells) {
    EXPECT_EQ(c.device, "cuda");
    EXPECT_TRUE(c.error.ok) << "context " << c.context << " batch " << c.batch << " block " << c.block_size << ": "
                            << c.error.summary();
    EXPECT_GT(c.gb_per_s, 0.0);
  }
}

#ifndef LLM_WITH_CUDA
// Only in a build without CUDA: asking for the GPU is a clear error.
TEST(CudaPagedAttention, BuildWithoutCudaSaysSo) {
  EXPECT_THROW(CudaKvLayouts({4, 2, 16}, 1, 8), llm::DeviceError);
  EXPECT_THROW(make_cuda_paged_model(llm::random_weights(llm::find_preset("tiny").config, 1)), llm::DeviceError);
}
#endif

}  // namespace
}  // namespace step05
