#include "step07_batching/measure/loopback_serving.hpp"

#include "step07_batching/serve/server.hpp"

namespace step07 {

LoopbackRun serve_over_loopback(const std::string& device, llm::Model& model, const std::string& model_name,
                                const std::vector<Request>& requests, const std::vector<std::vector<int>>& solo,
                                const ServingLimits& limits, double in_process_tokens_per_s) {
  ServerOptions options;
  options.engine = engine_options_for(policy(kContinuous), limits, model.config().seq_len);
  // A thread per open connection: every request of the trace may be open at once.
  options.http_threads = std::max(options.http_threads, static_cast<int>(requests.size()) + 8);
  CompletionServer server(model, model_name, /*tokenizer=*/nullptr, options);  // prompts travel as token ids
  server.start();
  LoopbackRun run;
  run.device = device;
  run.load = run_load(server.host(), server.port(), requests, LoadOptions{});
  server.stop();
  // The client sees tokens, not logits rows: a parting on a device whose
  // rows are not batch-invariant is judged from the solo row alone.
  run.check = check_tokens_only(model, requests, run.load.records, solo,
                                llm::same_rounding_logits_tolerance(limits.weight_type));
  if (!run.load.records.empty()) {
    run.served = summarize_serving(run.load.records, {}, limits.max_sequences);
    run.in_process_tokens_per_s = in_process_tokens_per_s;
    run.ratio = in_process_tokens_per_s > 0 ? run.served.output_tokens_per_s / in_process_tokens_per_s : 0.0;
  }
  return run;
}

}  // namespace step07
