#include "step05_paged_attention/measure/request_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <utility>

#include "llm/errors.hpp"
#include "llm/harness/timer.hpp"
#include "llm/splitmix64.hpp"

namespace step05 {
namespace {

// Two independent standard normals from two uniforms (Box-Muller). 1 - u
// keeps the logarithm's argument in (0, 1].
std::pair<double, double> standard_normal_pair(llm::SplitMix64& random) {
  const double radius = std::sqrt(-2.0 * std::log(1.0 - random.uniform()));
  const double angle = 2.0 * std::numbers::pi * random.uniform();
  return {radius * std::cos(angle), radius * std::sin(angle)};
}

// A log-normal length of median context * median_fraction, rounded, in [1, most].
int log_normal_length(int context, double median_fraction, double sigma, double z, int most) {
  const double length = std::round(context * median_fraction * std::exp(sigma * z));
  return static_cast<int>(std::clamp(length, 1.0, static_cast<double>(most)));
}

LengthStats stats_of(std::vector<double> lengths) {
  const double mean = std::accumulate(lengths.begin(), lengths.end(), 0.0) / static_cast<double>(lengths.size());
  // The timer's order statistics, applied to lengths instead of milliseconds.
  const llm::TimingStats order = llm::TimingStats::from_samples(std::move(lengths));
  return {order.min_ms, order.p50_ms, order.p90_ms, order.p99_ms, order.max_ms, mean};
}

}  // namespace

std::vector<TraceRequest> make_request_trace(const TraceOptions& options) {
  if (options.n_requests < 1 || options.context < 2)
    throw llm::InputError(
        fmt::format("request trace: {} requests at context {}: needs >= 1 request and a context of "
                    ">= 2 positions (a prompt and an output token)",
                    options.n_requests, options.context));
  const auto valid_fraction = [](double f) { return f > 0.0 && f <= 1.0; };
  if (!valid_fraction(options.prompt_median_fraction) || !valid_fraction(options.output_median_fraction) ||
      !(options.prompt_sigma >= 0.0) || !(options.output_sigma >= 0.0))
    throw llm::InputError(fmt::format(
        "request trace: median fractions must be in (0, 1] and sigmas >= 0 (prompt {} / {}, output {} / {})",
        options.prompt_median_fraction, options.prompt_sigma, options.output_median_fraction, options.output_sigma));
  llm::SplitMix64 random(options.seed);
  std::vector<TraceRequest> trace;
  trace.reserve(static_cast<std::size_t>(options.n_requests));
  for (int id = 0; id < options.n_requests; ++id) {
    const auto [z_prompt, z_output] = standard_normal_pair(random);
    TraceRequest request;
    request.id = id;
    // The prompt leaves room for at least one output token; the output is
    // cut where the context ends (a real server stops there too).
    request.prompt_length = log_normal_length(options.context, options.prompt_median_fraction, options.prompt_sigma,
                                              z_prompt, options.context - 1);
    request.output_length = log_normal_length(options.context, options.output_median_fraction, options.output_sigma,
                                              z_output, options.context - request.prompt_length);
    trace.push_back(request);
  }
  return trace;
}

LengthSummary summarize_lengths(const std::vector<TraceRequest>& trace, int context) {
  if (trace.empty() || context < 1)
    throw llm::InputError(fmt::format("length summary of {} requests at context {}: needs requests and a context",
                                      trace.size(), context));
  std::vector<double> prompts, outputs, totals;  // [requests] each
  for (const TraceRequest& request : trace) {
    prompts.push_back(request.prompt_length);
    outputs.push_back(request.output_length);
    totals.push_back(request.total_length());
  }
  LengthSummary summary;
  summary.requests = static_cast<int>(trace.size());
  summary.context = context;
  summary.prompt = stats_of(std::move(prompts));
  summary.output = stats_of(std::move(outputs));
  summary.total = stats_of(std::move(totals));
  summary.mean_total_fraction = summary.total.mean / context;
  return summary;
}

}  // namespace step05
