#include "step07_batching/measure/workload.hpp"

#include <fmt/format.h>

#include <cmath>

#include "llm/errors.hpp"
#include "llm/splitmix64.hpp"

namespace step07 {

namespace {

// The text prompts are cut from: a short story in the style of the
// TinyStories data the llama2.c models were trained on, so a trained model
// continues it sensibly. A prompt is a window of it (wrapping around), so
// prompts differ but read like the training data.
constexpr const char* kPromptText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
    "red ball. One day, she saw a big tree with a swing. She wanted to go on the swing, but it was too high. "
    "Lily asked her mom for help. Her mom lifted her up and gave her a gentle push. Lily laughed and said, "
    "\"Higher, Mom, higher!\" The sun was warm and the birds were singing. After a while, Lily saw a small "
    "dog sitting under the bench. The dog looked sad and lonely. Lily jumped off the swing and walked to the "
    "dog. \"Hello, little dog. Do you want to play with me?\" she asked. The dog wagged its tail and barked "
    "happily. Lily threw her red ball and the dog ran to get it. They played together all afternoon. When it "
    "was time to go home, the dog followed Lily and her mom. Lily's mom smiled and said they could keep the "
    "dog if nobody came to look for it. Lily was so happy. She named the dog Spot. Every day after that, Lily "
    "and Spot went to the park together. They ran on the grass, they looked at the ducks in the pond, and "
    "they shared a snack on the bench. One rainy day, Lily could not go outside. She felt sad. Spot brought "
    "her the red ball and put it in her lap. Lily smiled and hugged him. \"You are my best friend, Spot,\" "
    "she said. They played a quiet game inside until the rain stopped and a rainbow came out over the park. "
    "Tim was a boy who lived next door. He liked to build things with blocks and sticks. One morning he made "
    "a tall tower in his yard. The wind blew and the tower fell down. Tim was sad, but his friend Sue came "
    "to help. Together they built a new tower, bigger and stronger than before. They learned that working "
    "together makes hard things easy.";

}  // namespace

PromptSource::PromptSource(const llm::Tokenizer* tokenizer, int vocab_size, std::uint64_t seed)
    : vocab_size_(vocab_size), seed_(seed) {
  if (tokenizer != nullptr && tokenizer->vocab_size() > 0)
    text_ids_ = tokenizer->encode(kPromptText, /*add_bos=*/false, /*add_eos=*/false);
}

std::vector<int> PromptSource::prompt(int length, std::uint64_t request_seed) const {
  std::vector<int> ids;
  ids.reserve(static_cast<std::size_t>(length));
  ids.push_back(llm::Tokenizer::kBos);
  llm::SplitMix64 random(llm::splitmix64_mix(seed_ ^ request_seed));
  // A window of the text from a random start, or random ids past BOS/EOS (0-2).
  const std::size_t start = text_ids_.empty() ? 0 : random.next() % text_ids_.size();
  for (int i = 1; i < length; ++i) {
    if (!text_ids_.empty()) {
      ids.push_back(text_ids_[(start + static_cast<std::size_t>(i - 1)) % text_ids_.size()]);
    } else {
      ids.push_back(3 + static_cast<int>(random.next() % static_cast<std::uint64_t>(vocab_size_ - 3)));
    }
  }
  return ids;
}

std::vector<Request> with_arrivals(std::vector<Request> requests, double rate_per_s, std::uint64_t seed) {
  if (!(rate_per_s >= 0.0)) throw llm::InputError(fmt::format("arrival rate must be >= 0 (got {})", rate_per_s));
  // A Poisson process: gaps between arrivals are exponential with mean
  // 1 / rate, drawn by inversion: gap = -ln(1 - u) / rate, u in [0, 1).
  llm::SplitMix64 random(llm::splitmix64_mix(seed ^ 0xa5a5a5a5u));
  double arrival_ms = 0.0;
  for (Request& request : requests) {
    if (rate_per_s > 0.0) arrival_ms += -std::log(1.0 - random.uniform()) / rate_per_s * 1000.0;
    request.arrival_ms = arrival_ms;
  }
  return requests;
}

std::vector<Request> make_workload(const WorkloadOptions& options, const PromptSource& prompts) {
  const std::vector<step05::TraceRequest> trace = step05::make_request_trace(options.lengths);
  std::vector<Request> requests;
  requests.reserve(trace.size());
  for (const step05::TraceRequest& lengths : trace) {
    Request request;
    request.id = lengths.id;
    request.prompt = prompts.prompt(lengths.prompt_length, static_cast<std::uint64_t>(lengths.id));
    // The trace's output length counts generated tokens; the last is never
    // fed back, so the request holds prompt + output - 1 <= context positions.
    request.max_tokens = lengths.output_length;
    request.sampling = options.sampling;
    request.sampling.seed = options.sampling.seed + static_cast<std::uint64_t>(lengths.id);
    requests.push_back(std::move(request));
  }
  return with_arrivals(std::move(requests), options.arrival_rate_per_s, options.lengths.seed);
}

}  // namespace step07
