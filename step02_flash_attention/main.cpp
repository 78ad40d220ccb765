// Step 02: FlashAttention.
//
// Runs every attention variant of the step's table (variants.hpp) on the same
// random Q/K/V, per sequence length and per (heads, head_dim):
//   time, TFLOP/s, speedup over the same device's naive variant, the memory
//   that holds scores (naive: Sq x Sk per head; flash: one tile + O(Sq)
//   running statistics), and the max error against a float64 reference.
// Then the decode shape (one query against a long cache), and the model's
// prefill of a long prompt with the model's default attention ("before") and
// with step 02's flash kernel plugged into its attention hook ("flash"): on
// the CPU (cpu_flash via CpuModel::set_attention) and on CUDA (cuda_flash1
// via CudaModelOptions.attention), every logit checked against the CPU's.
// Exits non-zero when any variant disagrees with the reference.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/timer.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/cpu_attention.hpp"
#include "step02_flash_attention/cuda_runner.hpp"
#include "step02_flash_attention/half_precision.hpp"
#include "step02_flash_attention/reference_attention.hpp"
#include "step02_flash_attention/variants.hpp"

namespace {

using step02::AttentionProblem;
using step02::AttentionVariant;

// Fresh random inputs for one problem. Q and K in [-2, 2] give logits with a
// standard deviation of about 1.3 after the 1/sqrt(d) scale: peaked enough
// that the softmax matters, never degenerate. V in [-1, 1].
struct Inputs {
  std::vector<float> q;  // [Sq, n_heads, d]
  std::vector<float> k;  // [Sk, n_kv_heads, d]
  std::vector<float> v;  // [Sk, n_kv_heads, d]
};
Inputs random_inputs(const AttentionProblem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> qk(-2.0f, 2.0f), val(-1.0f, 1.0f);
  Inputs in{std::vector<float>(p.q_elements()), std::vector<float>(p.kv_elements()),
            std::vector<float>(p.kv_elements())};
  for (auto& x : in.q) x = qk(rng);
  for (auto& x : in.k) x = qk(rng);
  for (auto& x : in.v) x = val(rng);
  return in;
}

// The float64 reference of a sample of query rows, per input precision (a
// 16-bit variant is checked against the reference of its rounded inputs).
struct Reference {
  std::vector<int> rows;
  std::map<llm::DType, std::vector<float>> out;  // [rows, q_row] per dtype

  const std::vector<float>& get(const AttentionProblem& p, const Inputs& in, llm::DType dtype) {
    auto it = out.find(dtype);
    if (it != out.end()) return it->second;
    const auto q = step02::rounded_to(in.q, dtype), k = step02::rounded_to(in.k, dtype),
               v = step02::rounded_to(in.v, dtype);
    return out[dtype] = step02::reference_attention_f64(p, q, k, v, rows);
  }
};

std::string format_ms(double ms) {
  if (ms >= 1000.0) return fmt::format("{:.2f} s", ms / 1000.0);
  if (ms >= 1.0) return fmt::format("{:.2f} ms", ms);
  return fmt::format("{:.1f} us", ms * 1000.0);
}

struct Settings {
  int repeats = 3;
  int check_rows = 64;  // query rows compared with the float64 reference per problem
  bool cpu = true, cuda = false;
  std::vector<int> selected;
};

// One measured (variant, problem) pair, printed and added to the results.
struct Measurement {
  const AttentionVariant* variant;
  std::string device;
  llm::TimingStats time;
  llm::CompareResult error;
  std::string skipped;  // non-empty: did not run, and why
};

bool selected(const Settings& s, const AttentionVariant& v) {
  return std::find(s.selected.begin(), s.selected.end(), v.id) != s.selected.end();
}

// Runs one problem on every selected variant of the devices in use.
std::vector<Measurement> measure_problem(const AttentionProblem& p, const Settings& s, bool decode_table,
                                         std::uint64_t seed) {
  const Inputs in = random_inputs(p, seed);
  Reference reference{step02::rows_to_check(p, s.check_rows), {}};
  std::vector<Measurement> out;

  if (s.cpu) {
    // Host "cache": the inputs K/V behind a one-block view, as the model's
    // contiguous cache presents them.
    std::vector<float> keys = in.k, values = in.v;
    const std::int32_t block_zero = 0;
    step02::AttentionArgs args;
    args.q = in.q.data();
    args.kv = step02::contiguous_kv_view(keys.data(), values.data(), p.seqlen_k, p.kv_row(), &block_zero);
    std::vector<float> result(p.q_elements());
    args.out = result.data();
    for (const auto& v : step02::variants()) {
      if (v.backend != llm::Backend::Cpu || !selected(s, v) || (v.fn.for_decode && !decode_table)) continue;
      Measurement m{&v, "cpu", {}, {}, {}};
      std::fill(result.begin(), result.end(), std::nanf(""));  // poison: a row not written fails the check
      v.fn.run(p, args);  // the check run doubles as the warm-up
      m.error = llm::compare(step02::select_rows(p, result, reference.rows), reference.get(p, in, v.fn.dtype),
                             llm::tolerance_for(v.fn.dtype));
      m.time = llm::time_cpu([&] { v.fn.run(p, args); }, 0, s.repeats);
      out.push_back(m);
    }
  }
  if (s.cuda) {
    std::optional<step02::CudaProblem> gpu;
    gpu.emplace(p, in.q, in.k, in.v);
    for (const auto& v : step02::variants()) {
      if (v.backend != llm::Backend::Cuda || !selected(s, v) || (v.fn.for_decode && !decode_table)) continue;
      Measurement m{&v, "cuda", {}, {}, gpu->skip_reason(v)};
      if (m.skipped.empty()) {
        const auto result = gpu->run_once(v);
        m.error = llm::compare(step02::select_rows(p, result, reference.rows), reference.get(p, in, v.fn.dtype),
                               llm::tolerance_for(v.fn.dtype));
        m.time = gpu->time(v, 2, std::max(s.repeats, 5));
      }
      out.push_back(m);
    }
  }
  return out;
}

int body(int argc, char** argv) {
  CLI::App app{"Step 02: FlashAttention. Naive vs tiled online-softmax attention on CPU and CUDA."};
  llm::CommonOptions o;
  Settings s;
  std::vector<int> seq_lens, decode_lens, heads_list = {8}, head_dims = {64, 128};
  bool long_run = false, causal = true;
  int prefill_tokens = 2048;
  llm::add_common_options(app, o);
  app.add_option("--seq-lens", seq_lens,
                 "sequence lengths (Sq = Sk) of the kernel table; default 256..4096 on the CPU "
                 "(256..16384 on CUDA)")
      ->delimiter(',');
  app.add_option("--decode-lens", decode_lens,
                 "cache lengths of the decode table (one query; default: the --seq-lens of each device)")
      ->delimiter(',');
  app.add_flag("--long", long_run, "CPU too up to 16384 tokens (naive needs 1 GiB of scores per head there)");
  app.add_option("--heads", heads_list, "query heads (= KV heads) of the kernel table")->delimiter(',');
  app.add_option("--head-dims", head_dims, "head dims of the kernel table")->delimiter(',');
  app.add_flag("--causal,!--no-causal", causal, "causal mask (bottom-right aligned); default on");
  app.add_option("--repeats", s.repeats, "timed runs per variant and shape (median reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--prefill-tokens", prefill_tokens, "prompt length of the model prefill comparison")
      ->check(CLI::PositiveNumber);
  if (const auto status = llm::parse_command_line(app, argc, argv)) return *status;

  const auto& table = step02::variants();
  if (o.list_variants) {
    for (const auto& v : table)
      fmt::print("{:>3}  {:<21} {:<5} {:<5} {}{}\n", v.id, v.name, llm::backend_name(v.backend),
                 llm::dtype_name(v.fn.dtype), v.what_changed, v.fn.run ? "" : "  [not in this build]");
    return 0;
  }
  for (int d : head_dims)
    if (d <= 0) throw llm::InputError(fmt::format("--head-dims: {} is not a head dim", d));
  const bool lens_given = !seq_lens.empty();
  if (o.quick) {
    s.repeats = 1;
    heads_list = {4};
    head_dims = {64};
    if (!lens_given) seq_lens = {256, 1024};
    prefill_tokens = std::min(prefill_tokens, 256);
  }
  s.selected = llm::parse_variant_selection(o.variant, llm::variant_ids(table));
  const llm::DeviceSelection devices = llm::select_devices(o.device);
  s.cpu = devices.cpu;
  s.cuda = devices.cuda;
  std::vector<int> cpu_lens = seq_lens, cuda_lens = seq_lens;
  if (!lens_given && !o.quick) {
    cpu_lens = {256, 512, 1024, 2048, 4096};
    cuda_lens = {256, 512, 1024, 2048, 4096, 8192, 16384};
    if (long_run) cpu_lens = cuda_lens;
  }

  llm::Results results("step02_flash_attention", "FlashAttention: naive vs tiled online-softmax attention");
  const llm::DeviceInfo info = llm::device_info_for(devices);
  results.set_device_info(info);
  results.set_config("heads", fmt::format("{}", fmt::join(heads_list, ",")));
  results.set_config("head_dims", fmt::format("{}", fmt::join(head_dims, ",")));
  results.set_config("cpu_seq_lens", s.cpu ? fmt::format("{}", fmt::join(cpu_lens, ",")) : std::string("-"));
  results.set_config("cuda_seq_lens", s.cuda ? fmt::format("{}", fmt::join(cuda_lens, ",")) : std::string("-"));
  if (!decode_lens.empty()) results.set_config("decode_lens", fmt::format("{}", fmt::join(decode_lens, ",")));
  results.set_config("causal", causal);
  results.set_config("repeats", static_cast<long long>(s.repeats));
  results.set_config("check_rows", static_cast<long long>(s.check_rows));
  results.set_config("quick", o.quick);
  results.set_config("flops_formula", "4 * head_dim * heads * visible (query, key) pairs (causal: ~half of 4*Sq*Sk*d*heads)");
  results.set_config("cpu_tile", fmt::format("Br {} x Bc {}", step02::cpu::kBlockRows, step02::cpu::kBlockCols));

  fmt::print("== step02_flash_attention : FlashAttention ==\n");
  fmt::print("cpu: {} (1 thread)\n", info.cpu_model);
  if (info.cuda_available)
    fmt::print("gpu: {} (sm_{}, {} SMs, {:.0f} GiB), driver {}, CUDA runtime {}\n", info.gpu_name,
               info.gpu_compute_capability, info.gpu_sm_count, info.gpu_memory_gib, info.cuda_driver,
               info.cuda_runtime);
  else
    fmt::print("gpu: none ({})\n", info.cuda_note);
  fmt::print("commit: {}\n", llm::git_commit());
  fmt::print("TFLOP/s = 4 * d * heads * visible (query, key) pairs / time (causal: ~half of 4*Sq*Sk*d*heads);\n"
             "scores mem = memory outside registers/shared memory holding scores or softmax statistics;\n"
             "max_rel = max|got - ref| / max|ref| against float64 over {} sampled query rows.\n",
             s.check_rows);

  bool all_ok = true;
  auto add_rows = [&](const AttentionProblem& p, const std::vector<Measurement>& ms, const std::string& phase) {
    std::map<std::string, double> naive_ms;  // per device
    for (const auto& m : ms)
      if (m.skipped.empty() && m.variant->id == step02::naive_id_for(m.variant->backend))
        naive_ms[m.device] = m.time.median_ms;
    for (const auto& m : ms) {
      const auto& fn = m.variant->fn;
      const std::size_t score_bytes = fn.score_bytes ? fn.score_bytes(p) : 0;
      if (!m.skipped.empty()) {
        fmt::print("  {:<5} {:<21} skipped: {}\n", m.device, m.variant->name, m.skipped);
        continue;
      }
      const double speedup = naive_ms.count(m.device) ? naive_ms[m.device] / m.time.median_ms : 0.0;
      const double tflops = p.flops() / (m.time.median_ms * 1e-3) / 1e12;
      // Decode reads every K and V row once: bytes / time is the number that matters.
      const std::size_t element = fn.dtype == llm::DType::F32 ? 4 : 2;
      const double kv_bytes = 2.0 * static_cast<double>(p.kv_elements()) * element;
      const double gbps = kv_bytes / (m.time.median_ms * 1e-3) / 1e9;
      fmt::print("  {:<5} {:<21} {:>10} {:>9.3f} {:>9.1f} {:>8} {:>11} {:>10.2e}  {}\n", m.device, m.variant->name,
                 format_ms(m.time.median_ms), tflops, gbps, speedup > 0 ? fmt::format("{:.2f}x", speedup) : "-",
                 llm::format_bytes(static_cast<double>(score_bytes)), m.error.max_rel_err, m.error.ok ? "ok" : "FAIL");
      if (!m.error.ok) {
        all_ok = false;
        std::fprintf(stderr, "check failed for %s %s on %s: %s\n", m.device.c_str(), m.variant->name.c_str(),
                     p.describe().c_str(), m.error.summary().c_str());
      }
      llm::ResultRow row;
      row.device = m.device;
      row.variant = m.variant->name;
      row.id = m.variant->id;
      row.time_ms = m.time.median_ms;
      row.speedup = speedup;
      row.max_rel_err = m.error.max_rel_err;
      row.ok = m.error.ok;
      row.throughput_key = phase == "decode" ? "gbps" : "tflops";
      row.throughput = phase == "decode" ? gbps : tflops;
      row.extra["phase"] = phase;
      row.extra["seqlen_q"] = static_cast<long long>(p.seqlen_q);
      row.extra["seqlen_k"] = static_cast<long long>(p.seqlen_k);
      row.extra["heads"] = static_cast<long long>(p.n_heads);
      row.extra["kv_heads"] = static_cast<long long>(p.n_kv_heads);
      row.extra["head_dim"] = static_cast<long long>(p.head_dim);
      row.extra["causal"] = p.causal;
      row.extra["dtype"] = std::string(llm::dtype_name(fn.dtype));
      row.extra["flops"] = p.flops();
      row.extra["tflops"] = tflops;
      row.extra["kv_gbps"] = gbps;
      row.extra["score_bytes"] = static_cast<long long>(score_bytes);
      row.extra["max_abs_err"] = m.error.max_abs_err;
      row.extra["rows_checked"] = static_cast<long long>(m.error.count / static_cast<std::size_t>(p.q_row()));
      row.extra["time_min_ms"] = m.time.min_ms;
      row.extra["time_max_ms"] = m.time.max_ms;
      row.extra["speedup_over"] =
          std::string(step02::find_variant(step02::naive_id_for(m.variant->backend)).name);
      results.add_row(std::move(row));
    }
  };
  auto print_header = [] {
    fmt::print("  {:<5} {:<21} {:>10} {:>9} {:>9} {:>8} {:>11} {:>10}  {}\n", "dev", "variant", "time", "TFLOP/s",
               "KV GB/s", "speedup", "scores mem", "max_rel", "ok");
  };

  // --- the kernel table: prefill shapes, Sq = Sk
  std::vector<int> all_lens = s.cpu ? cpu_lens : std::vector<int>{};
  if (s.cuda)
    for (int L : cuda_lens)
      if (std::find(all_lens.begin(), all_lens.end(), L) == all_lens.end()) all_lens.push_back(L);
  std::sort(all_lens.begin(), all_lens.end());
  for (int heads : heads_list) {
    for (int d : head_dims) {
      fmt::print("\nprefill: {} heads, head_dim {}, {}\n", heads, d, causal ? "causal" : "not causal");
      print_header();
      for (int L : all_lens) {
        const AttentionProblem p{heads, heads, d, L, L, causal};
        p.validate();
        Settings here = s;
        here.cpu = s.cpu && std::find(cpu_lens.begin(), cpu_lens.end(), L) != cpu_lens.end();
        here.cuda = s.cuda && std::find(cuda_lens.begin(), cuda_lens.end(), L) != cuda_lens.end();
        fmt::print(" Sq = Sk = {}\n", L);
        add_rows(p, measure_problem(p, here, false, 1000003ull * L + d + 7ull * heads + o.seed), "prefill");
      }
    }
  }

  // --- decode: one query against a long cache (what split-KV is for)
  {
    const int heads = heads_list.front(), d = head_dims.front();
    fmt::print("\ndecode: one query, {} heads, head_dim {} (KV GB/s = K and V bytes read / time)\n", heads, d);
    print_header();
    for (int L : decode_lens.empty() ? all_lens : decode_lens) {
      const AttentionProblem p{heads, heads, d, 1, L, true};
      p.validate();
      Settings here = s;
      if (decode_lens.empty()) {
        here.cpu = s.cpu && std::find(cpu_lens.begin(), cpu_lens.end(), L) != cpu_lens.end();
        here.cuda = s.cuda && std::find(cuda_lens.begin(), cuda_lens.end(), L) != cuda_lens.end();
      }
      here.repeats = std::max(s.repeats, 5);
      fmt::print(" Sq = 1, Sk = {}\n", L);
      add_rows(p, measure_problem(p, here, true, 7000003ull * L + d + o.seed), "decode");
    }
  }

  // --- the model's prefill of a long prompt, before and after, per device:
  // the same weights and prompt, the model's default attention ("before")
  // and step 02's flash kernel plugged into its attention hook ("flash").
  if (s.cpu || s.cuda) {
    llm::LoadedModel loaded = llm::load_model(o);
    llm::ModelWeights weights = std::move(loaded.weights);
    // Random prompt tokens; the context grows to hold them (RoPE works at any
    // position; this is a timing run, not text generation).
    weights.config.seq_len = std::max(weights.config.seq_len, prefill_tokens);
    const llm::ModelConfig& c = weights.config;
    std::mt19937 rng(static_cast<unsigned>(o.seed));
    std::uniform_int_distribution<int> token(3, c.vocab_size - 1);
    std::vector<int> prompt(static_cast<std::size_t>(prefill_tokens));
    for (int& t : prompt) t = token(rng);
    const llm::TokenBatch batch = llm::TokenBatch::prefill(prompt, 0, 0);

    // One row: how to get the model with that row's attention, and its name.
    // The CPU rows share one CpuModel and swap its hook (set_attention); each
    // CUDA row builds its own CudaModel with the hook in CudaModelOptions, one
    // at a time, so the GPU never holds two copies of the weights.
    struct ModelRow {
      std::string device;
      int id;  // 0: before (the baseline of its device), 1: flash
      std::string name, what;
      std::function<llm::Model&()> prepare;  // may throw InputError: the row is skipped
    };
    std::optional<llm::CpuModel> cpu_model;
    std::unique_ptr<llm::Model> cuda_model;
    std::vector<ModelRow> model_rows;
    if (s.cpu) {
      cpu_model.emplace(weights);
      const auto with_cpu_prefill = [&cpu_model](llm::cpu::PrefillAttentionFn prefill) {
        return [&cpu_model, prefill]() -> llm::Model& {
          cpu_model->set_attention({prefill, &llm::cpu::reference_decode_attention});
          return *cpu_model;
        };
      };
      model_rows.push_back({"cpu", 0, "model_prefill_before", "llm::cpu::reference_prefill_attention (steps 00-01)",
                            with_cpu_prefill(&llm::cpu::reference_prefill_attention)});
      model_rows.push_back({"cpu", 1, "model_prefill_flash", "step02::cpu::flash_prefill via CpuModel::set_attention",
                            with_cpu_prefill(&step02::cpu::flash_prefill)});
    }
    if (s.cuda) {
      const auto with_cuda_prefill = [&cuda_model, &weights](step02::CudaModelPrefill prefill) {
        return [&cuda_model, &weights, prefill]() -> llm::Model& {
          cuda_model.reset();  // free the previous row's model before uploading the next
          cuda_model = step02::make_cuda_model(weights, prefill);
          return *cuda_model;
        };
      };
      model_rows.push_back({"cuda", 0, "model_prefill_before",
                            "llm::cuda::kernels::prefill_attention (CudaModel default; scores in a global workspace)",
                            with_cuda_prefill(step02::CudaModelPrefill::Baseline)});
      model_rows.push_back({"cuda", 1, "model_prefill_flash",
                            "step02::cuda::flash1_prefill (variant 3) via CudaModelOptions.attention",
                            with_cuda_prefill(step02::CudaModelPrefill::Flash1)});
    }

    fmt::print("\nmodel prefill: {} ({}), a {}-token prompt, logits of the last row\n", loaded.name, c.describe(),
               prefill_tokens);
    fmt::print("vs before = max_rel against the same device's model_prefill_before; vs cpu = against the CPU's "
               "(the reference){}\n",
               s.cpu ? "" : " (not run: CPU rows are off)");
    fmt::print("  {:<5} {:<22} {:>10} {:>12} {:>8} {:>10} {:>10}  {:<4} {}\n", "dev", "variant", "time", "tok/s",
               "speedup", "vs before", "vs cpu", "ok", "attention");
    const llm::Tolerance tolerance = llm::model_logits_tolerance(llm::DType::F32);
    std::vector<float> cpu_reference;  // logits of the CPU's before row: every row is checked against it
    struct Before {
      std::vector<float> logits;
      double ms = 0.0;
    };
    std::map<std::string, Before> before;  // per device
    for (const auto& r : model_rows) {
      llm::Model* model = nullptr;
      try {
        model = &r.prepare();
      } catch (const llm::InputError& e) {  // a head the kernel is not compiled for: say so, do not fail
        fmt::print("  {:<5} {:<22} skipped: {}\n", r.device, r.name, e.what());
        continue;
      }
      auto cache = model->make_cache(1, prefill_tokens);
      std::vector<float> logits;
      // One warm-up run, untimed: the first CUDA forward also allocates the
      // model's scratch and loads the kernels. The forward returns host logits
      // after waiting for the GPU, so the host stopwatch of time_cpu measures
      // the whole prefill on either device. The GPU rows are cheap: more runs.
      const int runs = o.quick ? 1 : (r.device == "cuda" ? std::max(5, s.repeats) : std::max(2, s.repeats));
      const auto t = llm::time_cpu(
          [&] {
            cache->clear();
            const auto l = model->forward(batch, *cache);
            logits.assign(l.begin(), l.end());
          },
          1, runs);
      if (r.id == 0) {
        before[r.device] = {logits, t.median_ms};
        if (r.device == "cpu") cpu_reference = logits;
      }
      const auto base = before.find(r.device);
      std::optional<llm::CompareResult> vs_before, vs_cpu;
      if (base != before.end()) vs_before = llm::compare(logits, base->second.logits, tolerance);
      if (!cpu_reference.empty()) vs_cpu = llm::compare(logits, cpu_reference, tolerance);
      const bool ok = (!vs_before || vs_before->ok) && (!vs_cpu || vs_cpu->ok);
      const double max_rel = std::max(vs_before ? vs_before->max_rel_err : 0.0, vs_cpu ? vs_cpu->max_rel_err : 0.0);
      const double speedup = base != before.end() ? base->second.ms / t.median_ms : 0.0;
      const auto rel = [](const std::optional<llm::CompareResult>& e) {
        return e ? fmt::format("{:.2e}", e->max_rel_err) : std::string("-");
      };
      fmt::print("  {:<5} {:<22} {:>10} {:>12.0f} {:>8} {:>10} {:>10}  {:<4} {}\n", r.device, r.name,
                 format_ms(t.median_ms), prefill_tokens / (t.median_ms * 1e-3),
                 speedup > 0 ? fmt::format("{:.2f}x", speedup) : "-", rel(vs_before), rel(vs_cpu),
                 ok ? "ok" : "FAIL", r.what);
      const auto report = [&r](const std::optional<llm::CompareResult>& e, const char* against) {
        if (e && !e->ok)
          std::fprintf(stderr, "check failed for %s %s vs %s: %s\n", r.device.c_str(), r.name.c_str(), against,
                       e->summary().c_str());
      };
      report(vs_before, "its device's model_prefill_before");
      report(vs_cpu, "the CPU reference");
      if (!ok) all_ok = false;
      llm::ResultRow row;
      row.device = r.device;
      row.variant = r.name;
      row.id = r.id;
      row.time_ms = t.median_ms;
      row.speedup = speedup;
      row.max_rel_err = max_rel;  // the worse of the two checks
      row.ok = ok;
      row.throughput_key = "tokens_per_s";
      row.throughput = prefill_tokens / (t.median_ms * 1e-3);
      row.extra["phase"] = std::string("model_prefill");
      row.extra["prompt_tokens"] = static_cast<long long>(prefill_tokens);
      row.extra["attention"] = r.what;
      row.extra["time_min_ms"] = t.min_ms;
      row.extra["time_max_ms"] = t.max_ms;
      if (vs_before) row.extra["max_rel_err_vs_before"] = vs_before->max_rel_err;
      if (vs_cpu) row.extra["max_rel_err_vs_cpu"] = vs_cpu->max_rel_err;  // absent when the CPU rows are off
      results.add_row(std::move(row));
    }
    results.set_config("model", loaded.name);
    results.set_config("model_config", c.describe());
    results.set_config("model_prefill_reference",
                       s.cpu ? std::string("cpu model_prefill_before (last-row logits)")
                             : std::string("none: CPU rows off, CUDA rows checked against cuda model_prefill_before"));
  }
  return llm::finish_run(results, o, devices, all_ok);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, body); }
