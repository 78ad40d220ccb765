// Step 03 (grouped-query attention), CUDA: both GPU variants against the CPU
// reference for groups 1, 2, 3, 4, 8, 32 (MQA) at odd lengths, lengths that are
// not multiples of the kernels' 64-key chunks, and head sizes up to 256.
// Skips with the reason where no GPU can be present, fails where one is
// present but unusable (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp).
#include <gtest/gtest.h>

#include <limits>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "step03_gqa/cuda_gqa_attention.hpp"
#include "step03_gqa/gqa_attention.hpp"
#include "test_support.hpp"

namespace step03 {
namespace {

struct GpuCase {
  int n_heads, n_kv_heads, head_dim, capacity;
  std::vector<int> lengths;  // decode lengths to run on the same uploaded cache
};

void PrintTo(const GpuCase& c, std::ostream* os) {
  *os << c.n_heads << " query heads, " << c.n_kv_heads << " KV heads, head_dim " << c.head_dim;
}

class Step03CudaDecodeTest : public ::testing::TestWithParam<GpuCase> {};

TEST_P(Step03CudaDecodeTest, BothVariantsMatchTheCpuReference) {
  LLM_REQUIRE_CUDA_DEVICE();
  const GpuCase& c = GetParam();
  const llm::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim};
  const int kv_dim = c.n_kv_heads * c.head_dim;
  // One contiguous host cache of `capacity` rows (a single block).
  auto keys = llm::testing::random_vector(static_cast<std::size_t>(c.capacity) * kv_dim, 21, 2.0f);
  auto values = llm::testing::random_vector(keys.size(), 22, 1.0f);
  const std::int32_t block = 0;
  llm::KvView host_kv;
  host_kv.keys = keys.data();
  host_kv.values = values.data();
  host_kv.block_table = &block;
  host_kv.block_size = c.capacity;
  host_kv.kv_dim = kv_dim;
  const auto q = llm::testing::random_vector(static_cast<std::size_t>(c.n_heads) * c.head_dim, 23, 1.0f);
  CudaDecodeProblem problem(shape, host_kv, c.capacity, q);
  for (const int length : c.lengths) {
    std::vector<float> reference(q.size(), std::numeric_limits<float>::quiet_NaN());
    const llm::KvView views[1] = {host_kv};
    const int lengths[1] = {length};
    llm::cpu::reference_decode_attention(shape, q.data(), std::span<const llm::KvView>(views),
                                         std::span<const int>(lengths), reference.data());
    std::vector<std::vector<float>> outputs;
    for (const auto& v : variants()) {
      outputs.push_back(problem.run(v.fn.cuda, length));
      const auto check = llm::compare(outputs.back(), reference, llm::tolerance_for(llm::DType::F32));
      EXPECT_TRUE(check.ok) << v.name << " length " << length << ": " << check.summary();
    }
    const auto same = llm::compare(outputs[1], outputs[0], llm::tolerance_for(llm::DType::F32));
    EXPECT_TRUE(same.ok) << "group_aware vs repeat_kv, length " << length << ": " << same.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(Step03Groups, Step03CudaDecodeTest,
                         ::testing::Values(GpuCase{8, 8, 16, 300, {1, 7, 64, 65, 257}},
                                           GpuCase{8, 4, 16, 300, {1, 33, 129}},
                                           GpuCase{8, 2, 64, 300, {5, 257}},
                                           GpuCase{8, 1, 64, 300, {3, 300}},
                                           GpuCase{32, 4, 128, 1100, {1, 1031}},
                                           GpuCase{32, 1, 128, 1100, {77, 1100}},
                                           GpuCase{4, 2, 256, 200, {199}},
                                           // A group that is not a power of two (3) and a head_dim
                                           // that is not a multiple of the 32 lanes (80).
                                           GpuCase{6, 2, 80, 200, {1, 130, 200}}),
                         [](const auto& info) {
                           const GpuCase& c = info.param;
                           return "q" + std::to_string(c.n_heads) + "_kv" + std::to_string(c.n_kv_heads) + "_hd" +
                                  std::to_string(c.head_dim);
                         });

TEST(Step03CudaDecode, RejectsGroupsBeyondTheKernelLimit) {
  LLM_REQUIRE_CUDA_DEVICE();
  // 64 query heads on one KV head: group 64 > kCudaMaxGroup.
  const llm::AttentionShape shape{64, 1, 16};
  auto keys = llm::testing::random_vector(16 * 8, 1);
  auto values = llm::testing::random_vector(16 * 8, 2);
  const std::int32_t block = 0;
  const llm::KvView host_kv{.keys = keys.data(), .values = values.data(), .block_table = &block, .block_size = 8, .kv_dim = 16};
  const auto q = llm::testing::random_vector(64 * 16, 3);
  CudaDecodeProblem problem(shape, host_kv, 8, q);
  EXPECT_THROW(problem.run(&group_aware_decode_attention_cuda, 8), llm::InputError);
}

#ifndef LLM_WITH_CUDA
// Only in a build without CUDA: there, asking for the kernel is a clear error.
// (A CUDA build has nothing to check here, and a skipped test would read as a
// GPU path that did not run.)
TEST(Step03CudaDecode, BuildWithoutCudaSaysSo) {
  const std::int32_t block = 0;
  std::vector<float> kv(16);
  const llm::KvView host_kv{.keys = kv.data(), .values = kv.data(), .block_table = &block, .block_size = 1, .kv_dim = 16};
  EXPECT_THROW(CudaDecodeProblem({1, 1, 16}, host_kv, 1, std::vector<float>(16)), llm::DeviceError);
}
#endif

}  // namespace
}  // namespace step03
