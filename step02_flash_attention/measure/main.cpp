// Step 02: FlashAttention.
//
// Runs every attention variant of the step's table (variants.hpp) on the same
// random Q/K/V, per sequence length and per (heads, head_dim):
//   time, TFLOP/s, speedup over the same device's naive variant, the memory
//   that holds scores (naive: Sq x Sk per head; flash: one tile + O(Sq)
//   running statistics), and the max error against a float64 reference.
// Then the decode shape (one query against a long cache), and the model's
// prefill of a long prompt with the model's default attention ("before") and
// with step 02's flash kernel plugged into its attention hook ("flash"),
// every logit checked against the CPU's (model_prefill.cpp).
// Exits non-zero when any variant disagrees with the reference.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/result_rows.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "llm/harness/timer.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/cpu_attention.hpp"
#include "step02_flash_attention/half_precision.hpp"
#include "step02_flash_attention/measure/cuda_runner.hpp"
#include "step02_flash_attention/measure/model_prefill.hpp"
#include "step02_flash_attention/measure/sdpa_beside.hpp"
#include "step02_flash_attention/reference_attention.hpp"
#include "step02_flash_attention/variants.hpp"

namespace {

using step02::AttentionProblem;
using step02::AttentionVariant;

// The kernel table's lengths (Sq = Sk) when --seq-lens is not given, per run
// size and device. The default run stops the CPU at 2048 (the naive kernel's
// time grows as the square of the length) and CUDA
// at 4096 (naive's scores: 512 MiB at 8 heads, fine on any GPU). --full runs
// the lengths the chapter quotes; --long takes the CPU to 16384 as well.
const std::vector<int> kDefaultCpuLengths = {256, 512, 1024, 2048};
const std::vector<int> kDefaultCudaLengths = {256, 512, 1024, 2048, 4096};
const std::vector<int> kFullCpuLengths = {256, 512, 1024, 2048, 4096};
const std::vector<int> kFullCudaLengths = {256, 512, 1024, 2048, 4096, 8192, 16384};
// The model-prefill prompt when --prefill-tokens is not given.
constexpr int kQuickPrefillTokens = 256, kDefaultPrefillTokens = 1024, kFullPrefillTokens = 2048;

struct Step02Options {
  llm::CommonOptions common;
  std::vector<int> seq_lens;          // --seq-lens: Sq = Sk of the kernel table (empty: per-device defaults)
  std::vector<int> decode_lens;       // --decode-lens: Sk of the decode table (empty: the kernel table's)
  std::vector<int> heads;             // --heads: query heads (= KV heads) of the kernel table (empty: 8; --quick 4)
  std::vector<int> head_dims;         // --head-dims (empty: 64,128; --quick 64)
  bool long_run = false;              // --long: the CPU runs up to 16384 too
  bool causal = true;
  int repeats = 3;
  int prefill_tokens = 0;             // --prefill-tokens: the model prefill's prompt (0: by run size, above)
  std::string sdpa_script;            // --compare-sdpa: sdpa_compare.py, run beside the CUDA rows (sdpa_beside.hpp)
  std::string python = "python3";     // --python: the interpreter that runs it (a bare name is looked up on PATH)
};

// The variant column's width: the longest name in the table.
int name_width() {
  static const int width = [] {
    std::size_t longest = 0;
    for (const auto& v : step02::variants()) longest = std::max(longest, v.name.size());
    return static_cast<int>(longest);
  }();
  return width;
}

// --list: the table with each row's device and input precision.
void print_variants() {
  llm::print_variant_list<step02::AttentionKernel>(step02::variants(), name_width(), [](const AttentionVariant& v) {
    return llm::VariantListDetails{
        fmt::format("{:<5} {:<5} ", llm::backend_name(v.backend), llm::dtype_name(v.fn.dtype)),
        v.fn.run ? "" : "  [not in this build]"};
  });
}

// Returns the exit status when the program should stop (--help, a bad flag, --list).
std::optional<int> parse_options(int argc, char** argv, Step02Options& options) {
  return llm::parse_step_command_line(
      "Step 02: FlashAttention. Naive vs tiled online-softmax attention on CPU and CUDA.", argc, argv,
      options.common,
      [&options](CLI::App& app) {
        llm::at_least(app.add_option("--seq-lens", options.seq_lens,
                                     "sequence lengths (Sq = Sk) of the kernel table; default 256..2048 on the CPU, "
                                     "256..4096 on CUDA (--full: 256..4096 and 256..16384)")
                          ->delimiter(','),
                      1);
        llm::at_least(app.add_option("--decode-lens", options.decode_lens,
                                     "cache lengths of the decode table (one query; default: the --seq-lens of "
                                     "each device)")
                          ->delimiter(','),
                      1);
        app.add_flag("--long", options.long_run,
                     "the CPU too up to 16384 tokens (naive needs 1 GiB of scores per head there)");
        llm::at_least(app.add_option("--heads", options.heads,
                                     "query heads (= KV heads) of the kernel table (default 8; --quick 4)")
                          ->delimiter(','),
                      1);
        llm::at_least(app.add_option("--head-dims", options.head_dims,
                                     "head dims of the kernel table (default 64,128; --quick 64)")
                          ->delimiter(','),
                      1);
        app.add_flag("--causal,!--no-causal", options.causal, "causal mask (bottom-right aligned); default on");
        llm::at_least(
            app.add_option("--repeats", options.repeats, "timed runs per variant and shape (median reported)"), 1);
        llm::at_least(app.add_option("--prefill-tokens", options.prefill_tokens,
                                     fmt::format("prompt length of the model prefill comparison, may exceed the "
                                                 "model's context (default {}; --full {}; --quick {})",
                                                 kDefaultPrefillTokens, kFullPrefillTokens, kQuickPrefillTokens)),
                      1);
        app.add_option("--compare-sdpa", options.sdpa_script,
                       "PyTorch's SDPA beside the CUDA rows, same shapes, same run: the path of "
                       "step02_flash_attention/measure/sdpa_compare.py (needs PyTorch with CUDA)");
        app.add_option("--python", options.python, "the Python that runs --compare-sdpa's script (default python3)");
      },
      &print_variants,
      {{{"--prompt", "--steps", "--temperature", "--top-p"},
        "it times attention kernels on random inputs, and the model's prefill on a random prompt of "
        "--prefill-tokens tokens"},
       {{"--dtype", "--gemv", "--max-gemv-rows", "--no-graphs", "--no-fusions", "--no-norm-folding",
         "--merge-folding", "--no-rope-folding", "--no-pdl", "--no-gemv-prefetch",
         "--no-gemv-pipelining", "--no-gemv-wave-fit", "--gemv-prefetch-next"},
         "its CUDA rows time its own fp32 attention kernels (steps 01 and 04 take them)"}});
}

// --quick: one small shape, short lengths, one timed run; the shape flags
// given on the command line are kept (only their defaults shrink).
void apply_quick_and_defaults(Step02Options& options) {
  const bool quick = options.common.quick;
  if (options.heads.empty()) options.heads = quick ? std::vector<int>{4} : std::vector<int>{8};
  if (options.head_dims.empty()) options.head_dims = quick ? std::vector<int>{64} : std::vector<int>{64, 128};
  if (quick) {
    options.repeats = 1;
    if (options.seq_lens.empty()) options.seq_lens = {256, 1024};
  }
  if (options.prefill_tokens == 0)
    options.prefill_tokens =
        llm::by_run_size(options.common, kQuickPrefillTokens, kDefaultPrefillTokens, kFullPrefillTokens);
}

// What measure_problem runs: the devices, the variants, how often.
struct Settings {
  int repeats = 3;
  int check_rows = 64;  // query rows compared with the float64 reference per problem
  bool cpu = true, cuda = false;
  std::vector<int> selected;  // variant ids from --variant
};

// The kernel table's sequence lengths per device. A GPU runs longer ones than
// the CPU in the same time, so by default their lists differ.
struct KernelTableLengths {
  std::vector<int> cpu, cuda;

  bool on_cpu(int length) const { return std::find(cpu.begin(), cpu.end(), length) != cpu.end(); }
  bool on_cuda(int length) const { return std::find(cuda.begin(), cuda.end(), length) != cuda.end(); }
  // Every length of the devices in use, ascending: the table's rows.
  std::vector<int> all(const Settings& settings) const {
    std::vector<int> lengths = settings.cpu ? cpu : std::vector<int>{};
    if (settings.cuda)
      for (int length : cuda)
        if (std::find(lengths.begin(), lengths.end(), length) == lengths.end()) lengths.push_back(length);
    std::sort(lengths.begin(), lengths.end());
    return lengths;
  }
};

KernelTableLengths kernel_table_lengths(const Step02Options& options) {
  KernelTableLengths lengths{options.seq_lens, options.seq_lens};
  if (options.seq_lens.empty() && !options.common.quick) {
    lengths.cpu = options.common.full ? kFullCpuLengths : kDefaultCpuLengths;
    lengths.cuda = options.common.full ? kFullCudaLengths : kDefaultCudaLengths;
    if (options.long_run) lengths.cpu = kFullCudaLengths;
  }
  return lengths;
}

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
  std::vector<int> rows;                         // the sampled query rows
  std::map<llm::DType, std::vector<float>> out;  // [rows, q_row] per dtype

  const std::vector<float>& get(const AttentionProblem& p, const Inputs& in, llm::DType dtype) {
    auto it = out.find(dtype);
    if (it != out.end()) return it->second;
    const auto q = step02::rounded_to(in.q, dtype), k = step02::rounded_to(in.k, dtype),
               v = step02::rounded_to(in.v, dtype);
    return out[dtype] = step02::reference_attention_f64(p, q, k, v, rows);
  }
};

// One measured (variant, problem) pair, printed and added to the results.
struct Measurement {
  const AttentionVariant* variant;
  std::string device;
  llm::TimingStats time;
  llm::CompareResult error;
  std::string skipped;  // non-empty: did not run, and why
};

bool runs_here(const Settings& settings, const AttentionVariant& v, llm::Backend backend, bool decode_table) {
  return v.backend == backend && llm::is_selected(settings.selected, v.id) && (!v.fn.for_decode || decode_table);
}

// Runs one problem on every selected variant of the devices in use.
std::vector<Measurement> measure_problem(const AttentionProblem& p, const Settings& settings, bool decode_table,
                                         std::uint64_t seed) {
  const Inputs in = random_inputs(p, seed);
  Reference reference{step02::rows_to_check(p, settings.check_rows), {}};
  std::vector<Measurement> out;

  if (settings.cpu) {
    // Host "cache": the inputs K/V behind a one-block view, as the model's
    // contiguous cache presents them.
    std::vector<float> keys = in.k, values = in.v;  // [Sk, kv_row] each
    const std::int32_t block_zero = 0;              // the view's block table: one block
    step02::AttentionArgs args;
    args.q = in.q.data();
    args.kv = step02::contiguous_kv_view(keys.data(), values.data(), p.seqlen_k, p.kv_row(), &block_zero);
    std::vector<float> result(p.q_elements());  // [Sq, q_row]
    args.out = result.data();
    for (const auto& v : step02::variants()) {
      if (!runs_here(settings, v, llm::Backend::Cpu, decode_table)) continue;
      Measurement m{&v, "cpu", {}, {}, {}};
      std::fill(result.begin(), result.end(), std::nanf(""));  // poison: a row not written fails the check
      v.fn.run(p, args);  // the check run doubles as the warm-up
      m.error = llm::compare(step02::select_rows(p, result, reference.rows), reference.get(p, in, v.fn.dtype),
                             llm::tolerance_for(v.fn.dtype));
      m.time = llm::time_cpu([&] { v.fn.run(p, args); }, 0, settings.repeats);
      out.push_back(m);
    }
  }
  if (settings.cuda) {
    step02::CudaProblem gpu(p, in.q, in.k, in.v);
    for (const auto& v : step02::variants()) {
      if (!runs_here(settings, v, llm::Backend::Cuda, decode_table)) continue;
      Measurement m{&v, "cuda", {}, {}, gpu.skip_reason(v)};
      if (m.skipped.empty()) {
        const auto result = gpu.run_once(v);  // [Sq, q_row]
        m.error = llm::compare(step02::select_rows(p, result, reference.rows), reference.get(p, in, v.fn.dtype),
                               llm::tolerance_for(v.fn.dtype));
        m.time = gpu.time(v, 2, std::max(settings.repeats, 5));
      }
      out.push_back(m);
    }
  }
  return out;
}

llm::Results make_results(const Step02Options& options, const Settings& settings,
                          const KernelTableLengths& lengths, const llm::DeviceSelection& devices) {
  const auto joined = [](const std::vector<int>& values) { return fmt::format("{}", fmt::join(values, ",")); };
  llm::Results results("step02_flash_attention", "FlashAttention: naive vs tiled online-softmax attention");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("heads", joined(options.heads));
  results.set_config("head_dims", joined(options.head_dims));
  results.set_config("cpu_seq_lens", settings.cpu ? joined(lengths.cpu) : std::string("-"));
  results.set_config("cuda_seq_lens", settings.cuda ? joined(lengths.cuda) : std::string("-"));
  if (!options.decode_lens.empty()) results.set_config("decode_lens", joined(options.decode_lens));
  results.set_config("causal", options.causal);
  results.set_config("repeats", static_cast<long long>(settings.repeats));
  results.set_config("check_rows", static_cast<long long>(settings.check_rows));
  results.set_config("quick", options.common.quick);
  results.set_config("full", options.common.full);
  results.set_config("prefill_tokens", static_cast<long long>(options.prefill_tokens));
  results.set_config("speedup_baseline", std::string("kernels: the same device's naive variant (cpu_naive, "
                                                     "cuda_naive), same shape; model prefill: model_prefill_before "
                                                     "on the same device"));
  results.set_config("flops_formula", "4 * head_dim * heads * visible (query, key) pairs (causal: ~half of 4*Sq*Sk*d*heads)");
  results.set_config("cpu_tile", fmt::format("Br {} x Bc {}", step02::cpu::kBlockRows, step02::cpu::kBlockCols));
  return results;
}

// The run's header (step, devices, commit) and what the columns mean. The
// config line waits for the JSON: the tables print their shapes themselves.
void print_header(const llm::Results& results, int check_rows) {
  fmt::print("{}", results.format_header(llm::Results::ConfigLine::Omitted));
  fmt::print("TFLOP/s = 4 * d * heads * visible (query, key) pairs / time (causal: ~half of 4*Sq*Sk*d*heads);\n"
             "scores mem = memory outside registers/shared memory holding scores or softmax statistics;\n"
             "speedup = time of the same device's naive variant (cpu_naive, cuda_naive) / this row's time, same "
             "shape;\n"
             "max_rel = max|got - ref| / max|ref| against float64 over {} sampled query rows.\n",
             check_rows);
}

void print_kernel_table_columns() {
  fmt::print("  {:<5} {:<{}} {:>10} {:>9} {:>9} {:>8} {:>11} {:>10}  {}\n", "dev", "variant", name_width(), "time",
             "TFLOP/s", "KV GB/s", "speedup", "scores mem", "max_rel", "ok");
}

// Prints one problem's measurements and adds them to the results; the
// speedup is over the same device's naive variant. Returns false when a
// check failed.
bool report_kernel_rows(llm::Results& results, const AttentionProblem& p, const std::vector<Measurement>& measured,
                        const std::string& phase) {
  bool all_ok = true;
  std::map<std::string, double> naive_ms;  // per device
  for (const auto& m : measured)
    if (m.skipped.empty() && m.variant->id == step02::naive_id_for(m.variant->backend))
      naive_ms[m.device] = m.time.median_ms;
  for (const auto& m : measured) {
    if (!m.skipped.empty()) {
      fmt::print("  {:<5} {:<{}} skipped: {}\n", m.device, m.variant->name, name_width(), m.skipped);
      continue;
    }
    const auto& kernel = m.variant->fn;
    const std::size_t score_bytes = kernel.score_bytes ? kernel.score_bytes(p) : 0;
    const double speedup = naive_ms.count(m.device) ? naive_ms[m.device] / m.time.median_ms : 0.0;
    const double tflops = p.flops() / (m.time.median_ms * 1e-3) / 1e12;
    // Decode reads every K and V row once: bytes / time is the number that matters.
    const std::size_t element_bytes = kernel.dtype == llm::DType::F32 ? 4 : 2;
    const double kv_bytes = 2.0 * static_cast<double>(p.kv_elements()) * element_bytes;
    const double gbps = kv_bytes / (m.time.median_ms * 1e-3) / 1e9;
    fmt::print("  {:<5} {:<{}} {:>10} {:>9.3f} {:>9.1f} {:>8} {:>11} {:>10.2e}  {}\n", m.device, m.variant->name,
               name_width(),
               llm::format_ms(m.time.median_ms), tflops, gbps, speedup > 0 ? fmt::format("{:.2f}x", speedup) : "-",
               llm::format_bytes(static_cast<double>(score_bytes)), m.error.max_rel_err, m.error.ok ? "ok" : "FAIL");
    all_ok &= llm::report_if_failed(fmt::format("{} {} on {}", m.device, m.variant->name, p.describe()), m.error);
    llm::ResultRow row = llm::timed_result_row(m.device, m.variant->id, m.variant->name, m.time, speedup, m.error);
    row.throughput_key = phase == "decode" ? "gbps" : "tflops";
    row.throughput = phase == "decode" ? gbps : tflops;
    row.extra["phase"] = phase;
    row.extra["seqlen_q"] = static_cast<long long>(p.seqlen_q);
    row.extra["seqlen_k"] = static_cast<long long>(p.seqlen_k);
    row.extra["heads"] = static_cast<long long>(p.n_heads);
    row.extra["kv_heads"] = static_cast<long long>(p.n_kv_heads);
    row.extra["head_dim"] = static_cast<long long>(p.head_dim);
    row.extra["causal"] = p.causal;
    row.extra["dtype"] = std::string(llm::dtype_name(kernel.dtype));
    row.extra["flops"] = p.flops();
    row.extra["tflops"] = tflops;
    row.extra["kv_gbps"] = gbps;
    row.extra["score_bytes"] = static_cast<long long>(score_bytes);
    row.extra["rows_checked"] = static_cast<long long>(m.error.count / static_cast<std::size_t>(p.q_row()));
    row.extra["speedup_over"] = std::string(step02::find_variant(step02::naive_id_for(m.variant->backend)).name);
    results.add_row(std::move(row));
  }
  return all_ok;
}

// The kernel table: prefill shapes, Sq = Sk, per (heads, head_dim) and length.
bool run_prefill_tables(llm::Results& results, const Step02Options& options, const Settings& settings,
                        const KernelTableLengths& lengths, llm::RunProgress& progress) {
  bool all_ok = true;
  for (int heads : options.heads) {
    for (int d : options.head_dims) {
      progress.start(fmt::format("kernel table, {} heads, head_dim {}", heads, d));
      fmt::print("\nprefill: {} heads, head_dim {}, {}\n", heads, d, options.causal ? "causal" : "not causal");
      print_kernel_table_columns();
      for (int length : lengths.all(settings)) {
        const AttentionProblem p{heads, heads, d, length, length, options.causal};
        p.validate();
        Settings here = settings;
        here.cpu = settings.cpu && lengths.on_cpu(length);
        here.cuda = settings.cuda && lengths.on_cuda(length);
        fmt::print(" Sq = Sk = {}\n", length);
        const std::uint64_t seed = 1000003ull * length + d + 7ull * heads + options.common.seed;
        all_ok &= report_kernel_rows(results, p, measure_problem(p, here, false, seed), "prefill");
      }
    }
  }
  return all_ok;
}

// Decode: one query against a long cache (what split-KV is for), at the first
// (heads, head_dim) of the kernel table.
bool run_decode_table(llm::Results& results, const Step02Options& options, const Settings& settings,
                      const KernelTableLengths& lengths, llm::RunProgress& progress) {
  bool all_ok = true;
  const int heads = options.heads.front(), d = options.head_dims.front();
  progress.start(fmt::format("decode table, one query, {} heads, head_dim {}", heads, d));
  fmt::print("\ndecode: one query, {} heads, head_dim {} (KV GB/s = K and V bytes read / time)\n", heads, d);
  print_kernel_table_columns();
  const bool lengths_given = !options.decode_lens.empty();
  for (int length : lengths_given ? options.decode_lens : lengths.all(settings)) {
    const AttentionProblem p{heads, heads, d, 1, length, true};
    p.validate();
    Settings here = settings;
    if (!lengths_given) {  // each device at its kernel-table lengths
      here.cpu = settings.cpu && lengths.on_cpu(length);
      here.cuda = settings.cuda && lengths.on_cuda(length);
    }
    here.repeats = std::max(settings.repeats, 5);
    fmt::print(" Sq = 1, Sk = {}\n", length);
    const std::uint64_t seed = 7000003ull * length + d + options.common.seed;
    all_ok &= report_kernel_rows(results, p, measure_problem(p, here, true, seed), "decode");
  }
  return all_ok;
}

// PyTorch's SDPA on the kernel table's CUDA shapes, once per head count,
// then the comparison and its targets (sdpa_beside.hpp).
void compare_with_sdpa(llm::Results& results, const Step02Options& options, const KernelTableLengths& lengths,
                       llm::RunProgress& progress) {
  std::vector<step02::SdpaRun> runs;
  for (int heads : options.heads) {
    progress.start(fmt::format("PyTorch SDPA on the same shapes ({} heads, head_dims {}, {} lengths)", heads,
                               fmt::join(options.head_dims, ","), lengths.cuda.size()));
    runs.push_back(step02::run_sdpa_compare(options.python, options.sdpa_script,
                                            {heads, options.head_dims, lengths.cuda, options.causal}));
  }
  step02::report_sdpa_comparison(results, runs);
}

int run_step02(int argc, char** argv) {
  Step02Options options;
  if (const auto exit_status = parse_options(argc, argv, options)) return *exit_status;
  apply_quick_and_defaults(options);
  Settings settings;
  settings.repeats = options.repeats;
  settings.selected = llm::parse_variant_selection(options.common.variant, llm::variant_ids(step02::variants()));
  const llm::DeviceSelection devices = llm::select_devices(options.common.device);
  settings.cpu = devices.cpu;
  settings.cuda = devices.cuda;
  const KernelTableLengths lengths = kernel_table_lengths(options);
  const bool compare_sdpa = !options.sdpa_script.empty();
  if (compare_sdpa) step02::check_sdpa_request(options.sdpa_script, settings.cuda);
  // Part 3's model, loaded before any benchmark: a bad --model or
  // --tokenizer fails at once, not after the kernel tables.
  llm::LoadedModel loaded = llm::load_model(options.common);

  llm::Results results = make_results(options, settings, lengths, devices);
  print_header(results, settings.check_rows);
  bool all_ok = true;
  const bool model_part = settings.cpu || settings.cuda;
  const int sdpa_parts = compare_sdpa ? static_cast<int>(options.heads.size()) : 0;
  llm::RunProgress progress("step02_flash_attention", static_cast<int>(options.heads.size() * options.head_dims.size()) +
                                                          1 + (model_part ? 1 : 0) + sdpa_parts);
  // 1. The kernel table: every variant on random Q/K/V, Sq = Sk; with
  //    --compare-sdpa, PyTorch's SDPA on the same shapes beside it.
  all_ok &= run_prefill_tables(results, options, settings, lengths, progress);
  if (compare_sdpa) compare_with_sdpa(results, options, lengths, progress);
  // 2. Decode: one query against a long cache.
  all_ok &= run_decode_table(results, options, settings, lengths, progress);
  // 3. The model's prefill with its default attention and with step 02's flash kernel.
  if (model_part) {
    progress.start(fmt::format("the model's prefill of {} tokens, before and with the flash kernel",
                               options.prefill_tokens));
    const step02::ModelPrefillSettings prefill{settings.cpu, settings.cuda, settings.repeats, options.common.quick,
                                               options.prefill_tokens, options.common.seed};
    all_ok &= step02::run_model_prefill(results, prefill, std::move(loaded));
  }
  return llm::finish_run(results, options.common, devices, all_ok);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, run_step02); }
