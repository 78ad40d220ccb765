// Part 3 of step 02's executable (model_prefill.hpp): the model's prefill
// before and with step 02's flash kernel in its attention hook.
#include "step02_flash_attention/measure/model_prefill.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/result_rows.hpp"
#include "llm/harness/timer.hpp"
#include "step02_flash_attention/cpu_attention.hpp"
#include "step02_flash_attention/measure/cuda_runner.hpp"

namespace step02 {
namespace {

// The model-prefill rows, and the models they run on: the same weights with
// the model's default attention ("before", id 0, the baseline of its device)
// and with step 02's flash kernel in its attention hook ("flash", id 1). The
// CPU rows share one CpuModel and swap its hook (set_attention); each CUDA row
// builds its own CudaModel with the hook in CudaModelOptions, one at a time,
// so the GPU never holds two copies of the weights.
class ModelPrefillRows {
 public:
  struct Row {
    std::string device;
    int id;                                // 0: before, 1: flash
    std::string name, what;                // the variant's name; the attention it runs
    std::function<llm::Model&()> prepare;  // the model with this row's attention; may throw InputError
  };

  ModelPrefillRows(const llm::ModelWeights& weights, const ModelPrefillSettings& settings) : weights_(weights) {
    if (settings.cpu) {
      cpu_model_.emplace(weights_);
      add_cpu_row(0, "model_prefill_before", "llm::cpu::reference_prefill_attention (steps 00-01)",
                  &llm::cpu::reference_prefill_attention);
      add_cpu_row(1, "model_prefill_flash", "step02::cpu::flash_prefill via CpuModel::set_attention",
                  &step02::cpu::flash_prefill);
    }
    if (settings.cuda) {
      add_cuda_row(0, "model_prefill_before",
                   "llm::cuda::kernels::prefill_attention (CudaModel default; scores in a global workspace)",
                   step02::CudaModelPrefill::Baseline);
      add_cuda_row(1, "model_prefill_flash", "step02::cuda::flash1_prefill (variant 3) via CudaModelOptions.attention",
                   step02::CudaModelPrefill::Flash1);
    }
  }
  ModelPrefillRows(const ModelPrefillRows&) = delete;  // the rows' functions point into this object
  ModelPrefillRows& operator=(const ModelPrefillRows&) = delete;

  const std::vector<Row>& rows() const { return rows_; }

 private:
  void add_cpu_row(int id, const char* name, const char* what, llm::cpu::PrefillAttentionFn prefill) {
    rows_.push_back({"cpu", id, name, what, [this, prefill]() -> llm::Model& {
                       cpu_model_->set_attention({prefill, &llm::cpu::reference_decode_attention});
                       return *cpu_model_;
                     }});
  }
  void add_cuda_row(int id, const char* name, const char* what, step02::CudaModelPrefill prefill) {
    rows_.push_back({"cuda", id, name, what, [this, prefill]() -> llm::Model& {
                       cuda_model_.reset();  // free the previous row's model before uploading the next
                       cuda_model_ = step02::make_cuda_model(weights_, prefill);
                       return *cuda_model_;
                     }});
  }

  const llm::ModelWeights& weights_;
  std::optional<llm::CpuModel> cpu_model_;
  std::unique_ptr<llm::Model> cuda_model_;
  std::vector<Row> rows_;
};

// Every row is checked against its device's "before" row and against the
// CPU's "before" row (the reference), when those ran.
struct PrefillReferences {
  std::vector<float> cpu_logits;  // [vocab] logits of the CPU's before row
  struct Before {
    std::vector<float> logits;  // [vocab]
    double ms = 0.0;
  };
  std::map<std::string, Before> before;  // per device
};

// Times one row's prefill, checks its logits, prints it and adds it to the
// results. Returns false when a check failed.
bool run_model_prefill_row(llm::Results& results, const ModelPrefillRows::Row& r, llm::Model& model,
                           const llm::TokenBatch& batch, int prefill_tokens, int runs, PrefillReferences& references) {
  auto cache = model.make_cache(1, prefill_tokens);
  std::vector<float> logits;  // [vocab] of the last row
  // One warm-up run, untimed: the first CUDA forward also allocates the
  // model's scratch and loads the kernels. The forward returns host logits
  // after waiting for the GPU, so the host stopwatch of time_cpu measures the
  // whole prefill on either device.
  const auto time = llm::time_cpu(
      [&] {
        cache->clear();
        const auto last_row_logits = model.forward(batch, *cache);
        logits.assign(last_row_logits.begin(), last_row_logits.end());
      },
      1, runs);
  if (r.id == 0) {
    references.before[r.device] = {logits, time.median_ms};
    if (r.device == "cpu") references.cpu_logits = logits;
  }
  const llm::Tolerance tolerance = llm::model_logits_tolerance(llm::DType::F32);
  const auto base = references.before.find(r.device);
  std::optional<llm::CompareResult> vs_before, vs_cpu;
  if (base != references.before.end()) vs_before = llm::compare(logits, base->second.logits, tolerance);
  if (!references.cpu_logits.empty()) vs_cpu = llm::compare(logits, references.cpu_logits, tolerance);
  const bool ok = (!vs_before || vs_before->ok) && (!vs_cpu || vs_cpu->ok);
  const double max_rel = std::max(vs_before ? vs_before->max_rel_err : 0.0, vs_cpu ? vs_cpu->max_rel_err : 0.0);
  const double speedup = base != references.before.end() ? base->second.ms / time.median_ms : 0.0;
  const auto rel = [](const std::optional<llm::CompareResult>& e) {
    return e ? fmt::format("{:.2e}", e->max_rel_err) : std::string("-");
  };
  fmt::print("  {:<5} {:<22} {:>10} {:>12.0f} {:>8} {:>10} {:>10}  {:<4} {}\n", r.device, r.name,
             llm::format_ms(time.median_ms), prefill_tokens / (time.median_ms * 1e-3),
             speedup > 0 ? fmt::format("{:.2f}x", speedup) : "-", rel(vs_before), rel(vs_cpu), ok ? "ok" : "FAIL",
             r.what);
  if (vs_before) llm::report_if_failed(r.device + " " + r.name + " vs its device's model_prefill_before", *vs_before);
  if (vs_cpu) llm::report_if_failed(r.device + " " + r.name + " vs the CPU reference", *vs_cpu);

  llm::ResultRow row;
  row.device = r.device;
  row.variant = r.name;
  row.id = r.id;
  row.time_ms = time.median_ms;
  row.speedup = speedup;
  row.max_rel_err = max_rel;  // the worse of the two checks
  row.ok = ok;
  row.throughput_key = "tokens_per_s";
  row.throughput = prefill_tokens / (time.median_ms * 1e-3);
  row.extra["phase"] = std::string("model_prefill");
  row.extra["prompt_tokens"] = static_cast<long long>(prefill_tokens);
  row.extra["attention"] = r.what;
  row.extra["time_min_ms"] = time.min_ms;
  row.extra["time_max_ms"] = time.max_ms;
  if (vs_before) row.extra["max_rel_err_vs_before"] = vs_before->max_rel_err;
  if (vs_cpu) row.extra["max_rel_err_vs_cpu"] = vs_cpu->max_rel_err;  // absent when the CPU rows are off
  results.add_row(std::move(row));
  return ok;
}

}  // namespace

bool run_model_prefill(llm::Results& results, const ModelPrefillSettings& settings, llm::LoadedModel loaded) {
  const llm::ModelConfig trained = loaded.weights.config;  // what the table and the JSON describe
  llm::ModelWeights weights = std::move(loaded.weights);
  // Random prompt tokens; the context grows to hold them (RoPE works at any
  // position; this is a timing run, not text generation).
  weights.config.seq_len = std::max(weights.config.seq_len, settings.prefill_tokens);
  const llm::ModelConfig& config = weights.config;
  std::mt19937 rng(static_cast<unsigned>(settings.seed));
  std::uniform_int_distribution<int> token(3, config.vocab_size - 1);  // no <unk>, BOS or EOS
  std::vector<int> prompt(static_cast<std::size_t>(settings.prefill_tokens));  // [prefill_tokens]
  for (int& t : prompt) t = token(rng);
  const llm::TokenBatch batch = llm::TokenBatch::prefill(prompt, 0, 0);

  fmt::print("\nmodel prefill: {} ({}), a {}-token prompt of random tokens{}, logits of the last row\n",
             loaded.name, trained.describe(), settings.prefill_tokens,
             settings.prefill_tokens > trained.seq_len
                 ? fmt::format(" (past the trained context of {}: RoPE runs on, and this is a timing run)",
                               trained.seq_len)
                 : std::string());
  fmt::print("speedup = time of model_prefill_before / this row's time, same device and prompt;\n"
             "vs before = max_rel against the same device's model_prefill_before; vs cpu = against the CPU's "
             "(the reference){}\n",
             settings.cpu ? "" : " (not run: CPU rows are off)");
  fmt::print("  {:<5} {:<22} {:>10} {:>12} {:>8} {:>10} {:>10}  {:<4} {}\n", "dev", "variant", "time", "tok/s",
             "speedup", "vs before", "vs cpu", "ok", "attention");
  bool all_ok = true;
  PrefillReferences references;
  const ModelPrefillRows model_rows(weights, settings);
  for (const auto& r : model_rows.rows()) {
    llm::Model* model = nullptr;
    try {
      model = &r.prepare();
    } catch (const llm::InputError& e) {  // a head the kernel is not compiled for: say so, do not fail
      fmt::print("  {:<5} {:<22} skipped: {}\n", r.device, r.name, e.what());
      continue;
    }
    // The GPU rows are cheap: more runs.
    const int runs = settings.quick ? 1
                     : r.device == "cuda" ? std::max(5, settings.repeats)
                                          : std::max(2, settings.repeats);
    all_ok &= run_model_prefill_row(results, r, *model, batch, settings.prefill_tokens, runs, references);
  }
  results.set_config("model", loaded.name);
  results.set_config("model_config", trained.describe());
  results.set_config("model_prefill_reference",
                     settings.cpu ? std::string("cpu model_prefill_before (last-row logits)")
                                  : std::string("none: CPU rows off, CUDA rows checked against cuda model_prefill_before"));
  return all_ok;
}

}  // namespace step02
