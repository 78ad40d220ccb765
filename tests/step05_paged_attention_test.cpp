// Step 05 (PagedAttention), CPU: the paged kernels against common's reference
// attention on fresh random K/V stored twice, contiguous and in a pool of
// SHUFFLED blocks (a kernel that ignores the block table reads wrong rows):
// block sizes 1, 7, 16 and larger than the sequence, lengths 1, B-1, B, B+1
// and odd ones, GQA groups 1 to 4, head_dim 8, 13, 64, 80, 128, many
// sequences of different lengths in one call, prefill with n_past > 0.
// A NaN anywhere in the inputs never passes; an int8 view is refused; the
// CPU model with the paged kernels on a paged cache matches the reference
// model on a contiguous one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "llm/attention.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/kv_cache.hpp"
#include "llm/token_batch.hpp"
#include "llm/weights.hpp"
#include "paged_kv_cache_double.hpp"
#include "step05_paged_attention/measure/kernel_overhead.hpp"
#include "step05_paged_attention/paged_attention.hpp"
#include "step05_paged_attention/measure/shuffled_kv_pool.hpp"
#include "step05_attention_cases.hpp"
#include "test_support.hpp"

namespace step05 {
namespace {

const llm::Tolerance kF32 = llm::tolerance_for(llm::DType::F32);

// Fresh random K/V for n_seqs sequences of `capacity` positions in a
// contiguous host cache (sequence s: keys scaled by key_scale, values in [-1, 1]).
struct ContiguousKv {
  llm::CpuKvCache cache;
  std::vector<llm::KvView> views;  // [n_seqs]

  ContiguousKv(const llm::AttentionShape& shape, int n_seqs, int capacity, std::uint64_t seed, float key_scale)
      : cache(one_layer_config(shape, capacity), n_seqs, capacity) {
    const std::size_t floats = static_cast<std::size_t>(capacity) * shape.n_kv_heads * shape.head_dim;
    for (int s = 0; s < n_seqs; ++s) {
      const llm::KvView v = cache.view(0, s);
      const auto keys = llm::testing::random_vector(floats, seed + 2 * s, key_scale);
      const auto values = llm::testing::random_vector(floats, seed + 2 * s + 1, 1.0f);
      std::copy(keys.begin(), keys.end(), v.key_row(0));  // the sequence's rows (v.keys is the layer's pool)
      std::copy(values.begin(), values.end(), v.value_row(0));
      views.push_back(v);
    }
  }
};

class PagedDecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(PagedDecodeTest, ShuffledPoolAndContiguousMatchTheReference) {
  const DecodeCase& c = GetParam();
  const llm::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim};
  const int n_seqs = static_cast<int>(c.lengths.size());
  const int capacity = *std::max_element(c.lengths.begin(), c.lengths.end());
  const ContiguousKv kv(shape, n_seqs, capacity, 11, c.key_scale);
  const ShuffledKvPool pool(kv.views, capacity, c.block_size, 5);
  const auto q = llm::testing::random_vector(static_cast<std::size_t>(n_seqs) * c.n_heads * c.head_dim, 3);

  std::vector<float> reference(q.size(), std::numeric_limits<float>::quiet_NaN());
  llm::cpu::reference_decode_attention(shape, q.data(), kv.views, c.lengths, reference.data());
  for (const bool paged : {true, false}) {
    SCOPED_TRACE(paged ? "shuffled pool" : "contiguous cache");
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    const std::vector<llm::KvView> views = paged ? pool.views() : kv.views;
    paged_decode_attention(shape, q.data(), views, c.lengths, out.data());
    const llm::CompareResult check = llm::compare(out, reference, kF32);
    EXPECT_TRUE(check.ok) << check.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Step05, PagedDecodeTest,
    ::testing::Values(
        // Block size 1: a table lookup per position.
        DecodeCase{4, 4, 8, 1, {1, 2, 5}, 1.0f},
        // Block size 7 (not a power of two): lengths B-1, B, B+1 and odd ones, GQA 2.
        DecodeCase{8, 4, 8, 7, {1, 6, 7, 8, 15, 22}, 1.0f},
        DecodeCase{8, 2, 64, 16, {1, 15, 16, 17, 33, 100}, 1.0f},
        // Llama-3-8B's heads (GQA 4); the contiguous block is longer than the CPU kernel's 64-key tile.
        DecodeCase{32, 8, 128, 16, {1000, 1, 17}, 1.0f},
        DecodeCase{8, 2, 128, 16, {257, 3}, 8.0f},
        // Odd head dims: 80 with groups of 3, 13 with MHA.
        DecodeCase{6, 2, 80, 7, {50, 13}, 1.0f},
        DecodeCase{4, 4, 13, 5, {9, 31}, 8.0f},
        // One block longer than every sequence: the paged layout is contiguous too.
        DecodeCase{8, 2, 64, 128, {100, 7}, 1.0f}),
    [](const auto& info) { return decode_case_name(info.param); });

class PagedPrefillTest : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(PagedPrefillTest, ShuffledPoolAndContiguousMatchTheReference) {
  const PrefillCase& c = GetParam();
  const llm::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim};
  const int capacity = c.n_past + c.n_new;
  const ContiguousKv kv(shape, 2, capacity, 21, 2.0f);  // prefill reads sequence 1; sequence 0 shares the pool
  const ShuffledKvPool pool(kv.views, capacity, c.block_size, 9);
  const auto q = llm::testing::random_vector(static_cast<std::size_t>(c.n_new) * c.n_heads * c.head_dim, 4);

  std::vector<float> reference(q.size(), std::numeric_limits<float>::quiet_NaN());
  llm::cpu::reference_prefill_attention(shape, q.data(), kv.views[1], c.n_past, c.n_new, reference.data());
  for (const bool paged : {true, false}) {
    SCOPED_TRACE(paged ? "shuffled pool" : "contiguous cache");
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    paged_prefill_attention(shape, q.data(), paged ? pool.view(1) : kv.views[1], c.n_past, c.n_new, out.data());
    const llm::CompareResult check = llm::compare(out, reference, kF32);
    EXPECT_TRUE(check.ok) << check.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(Step05, PagedPrefillTest,
                         ::testing::Values(PrefillCase{8, 4, 8, 7, 0, 9}, PrefillCase{8, 2, 64, 16, 37, 20},
                                           PrefillCase{32, 8, 128, 1, 5, 3}, PrefillCase{6, 6, 80, 16, 100, 1}),
                         [](const auto& info) { return prefill_case_name(info.param); });

// The pool really is shuffled, and reading it as if it were contiguous (the
// table ignored) gives another answer: the tests above could not pass with a
// kernel that skips the lookups.
TEST(PagedAttention, ShuffledPoolReadAsIfContiguousGivesAnotherAnswer) {
  const llm::AttentionShape shape{8, 2, 16};
  const std::vector<int> lengths = {40, 40};
  const ContiguousKv kv(shape, 2, 40, 31, 2.0f);
  const ShuffledKvPool pool(kv.views, 40, 8, 7);
  std::vector<std::int32_t> in_order(pool.tables().size());
  for (std::size_t i = 0; i < in_order.size(); ++i) in_order[i] = static_cast<std::int32_t>(i);
  EXPECT_FALSE(std::equal(in_order.begin(), in_order.end(), pool.tables().begin())) << "the pool is in order";

  const auto q = llm::testing::random_vector(2 * 8 * 16, 8);
  std::vector<float> reference(q.size());
  llm::cpu::reference_decode_attention(shape, q.data(), kv.views, lengths, reference.data());
  std::vector<float> paged(q.size()), flat(q.size());
  paged_decode_attention(shape, q.data(), pool.views(), lengths, paged.data());
  EXPECT_TRUE(llm::compare(paged, reference, kF32).ok);
  // Every sequence's view of the pool as one block of all its rows, in
  // physical order: what a kernel that ignores the table would read.
  const std::int32_t first_block[1] = {0};
  std::vector<llm::KvView> as_if_contiguous = pool.views();
  for (llm::KvView& v : as_if_contiguous) {
    v.block_table = first_block;
    v.block_size = static_cast<int>(pool.rows());
  }
  paged_decode_attention(shape, q.data(), as_if_contiguous, lengths, flat.data());
  const llm::CompareResult check = llm::compare(flat, reference, kF32);
  EXPECT_FALSE(check.ok) << "reading the shuffled pool in physical order matched the reference: " << check.summary();
}

// A NaN in a key, a value or the query reaches the output (never a silent
// pass): the online softmax has no path that drops it.
TEST(PagedAttention, NanInAnyInputReachesTheOutput) {
  const llm::AttentionShape shape{4, 2, 8};
  const std::vector<int> lengths = {20};
  for (const char* where : {"key", "value", "query"}) {
    SCOPED_TRACE(where);
    const ContiguousKv kv(shape, 1, 20, 41, 1.0f);
    ShuffledKvPool pool(kv.views, 20, 7, 3);
    auto q = llm::testing::random_vector(4 * 8, 5);
    const llm::KvView view = pool.view(0);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (std::string(where) == "key") view.key_row(13)[3] = nan;  // KV head 0, position 13 (block 1)
    if (std::string(where) == "value") view.value_row(13)[3] = nan;
    if (std::string(where) == "query") q[5] = nan;  // query head 0
    std::vector<float> out(q.size(), 0.0f);
    const llm::KvView views[1] = {view};
    paged_decode_attention(shape, q.data(), views, lengths, out.data());
    // Query heads 0 and 1 read KV head 0.
    EXPECT_TRUE(std::isnan(out[0]) || std::isnan(out[3])) << "head 0 of the output is finite";
    std::vector<float> reference(q.size());
    llm::cpu::reference_decode_attention(shape, q.data(), kv.views, lengths, reference.data());
    EXPECT_FALSE(llm::compare(out, reference, kF32).ok);
  }
}

TEST(PagedAttention, RefusesInt8ViewsAndBadLengths) {
  const llm::AttentionShape shape{4, 2, 8};
  const ContiguousKv kv(shape, 1, 8, 1, 1.0f);
  const auto q = llm::testing::random_vector(4 * 8, 2);
  std::vector<float> out(q.size());
  llm::KvView int8 = kv.views[0];
  int8.element = llm::KvElement::Int8;
  const int length[1] = {8};
  const llm::KvView int8_views[1] = {int8};
  EXPECT_THROW(paged_decode_attention(shape, q.data(), int8_views, length, out.data()), llm::InputError);
  EXPECT_THROW(paged_prefill_attention(shape, q.data(), int8, 7, 1, out.data()), llm::InputError);
  const int zero[1] = {0};
  EXPECT_THROW(paged_decode_attention(shape, q.data(), kv.views, zero, out.data()), llm::InputError);
  // Rows of another width than n_kv_heads * head_dim.
  EXPECT_THROW(paged_decode_attention({4, 4, 8}, q.data(), kv.views, length, out.data()), llm::InputError);
  // The hook says so too: a model refuses to pair these kernels with an int8 cache.
  EXPECT_FALSE(paged_cpu_attention().reads(llm::KvElement::Int8));
  EXPECT_TRUE(paged_cpu_attention().reads(llm::KvElement::Float32));
}

// The unchanged CpuModel with the paged kernels in its hook, on a paged
// cache (blocks of 7), gives the reference model's logits on a contiguous
// cache: a prompt, then greedy decode steps.
TEST(PagedAttention, CpuModelOnAPagedCacheMatchesTheReferenceModel) {
  const llm::ModelConfig config = llm::make_config(64, 96, 2, 8, 4, 64, 64, true);  // head_dim 8, GQA 2
  const llm::ModelWeights weights = llm::random_weights(config, 17);
  llm::CpuModel reference(weights);
  llm::CpuModelOptions options;
  options.attention = paged_cpu_attention();
  llm::CpuModel paged(weights, options);
  const auto contiguous_cache = reference.make_cache(1, 40);
  llm::testing::PagedCpuKvCacheDouble paged_cache(config, 1, /*n_blocks=*/8, /*block_size=*/7,
                                                  llm::KvElement::Float32);
  const std::vector<int> prompt = llm::testing::random_tokens(11, config.vocab_size, 3);
  const auto copy = [](std::span<const float> logits) { return std::vector<float>(logits.begin(), logits.end()); };
  auto ref = copy(reference.forward(llm::TokenBatch::prefill(prompt, 0, 0), *contiguous_cache, llm::LogitsFor::AllRows));
  auto got = copy(paged.forward(llm::TokenBatch::prefill(prompt, 0, 0), paged_cache, llm::LogitsFor::AllRows));
  llm::testing::expect_logit_rows_close(got, ref, config.vocab_size, "prefill");
  for (int pos = 11; pos < 30; ++pos) {
    const int token = static_cast<int>(std::max_element(ref.end() - config.vocab_size, ref.end()) -
                                       (ref.end() - config.vocab_size));
    ref = copy(reference.forward(llm::TokenBatch::single(token, pos, 0), *contiguous_cache));
    got = copy(paged.forward(llm::TokenBatch::single(token, pos, 0), paged_cache));
    llm::testing::expect_logit_rows_close(got, ref, config.vocab_size, "decode at position " + std::to_string(pos));
  }
}

// The measurement itself at a small size: every cell checked and timed, the
// contiguous cell first with 0% overhead, the bytes it reads.
TEST(KernelOverhead, SmallRunChecksAndTimesEveryCell) {
  KernelOverheadOptions o;
  o.n_heads = 8;
  o.n_kv_heads = 2;
  o.head_dim = 64;
  o.contexts = {96, 200};
  o.block_sizes = {8, 16};
  o.batches = {1, 3};
  o.repeats = 2;
  o.flush_caches = false;
  const KernelOverheadResult r = run_kernel_overhead(o);
  ASSERT_EQ(r.cells.size(), 2u * 2u * 3u);
  EXPECT_TRUE(r.skipped.empty());
  for (const KernelOverheadCell& c : r.cells) {
    SCOPED_TRACE("context " + std::to_string(c.context) + " batch " + std::to_string(c.batch) + " block " +
                 std::to_string(c.block_size));
    EXPECT_EQ(c.device, "cpu");
    EXPECT_TRUE(c.error.ok) << c.error.summary();
    EXPECT_EQ(c.kv_bytes_read, 2u * c.batch * c.context * 2 * 64 * sizeof(float));
    EXPECT_EQ(c.timing.runs, 2);
    EXPECT_GT(c.gb_per_s, 0.0);
    if (c.block_size == 0) EXPECT_EQ(c.overhead_percent, 0.0);
  }
  EXPECT_EQ(r.cells[0].block_size, 0);
  EXPECT_EQ(r.cells[1].block_size, 8);
  EXPECT_EQ(r.cells[2].block_size, 16);

  o.max_host_gib = 1e-6;  // nothing fits: every CPU cell is skipped, with its reason
  const KernelOverheadResult none = run_kernel_overhead(o);
  EXPECT_TRUE(none.cells.empty());
  ASSERT_EQ(none.skipped.size(), 4u);
  EXPECT_TRUE(llm::testing::HasSubstr(none.skipped[0], "max-host-gib"));

  o.repeats = 0;
  EXPECT_THROW(run_kernel_overhead(o), llm::InputError);
}

}  // namespace
}  // namespace step05
