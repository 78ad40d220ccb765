#pragma once
// The flags every step executable accepts (CLI11), and loading the model they
// name: a preset with seeded random weights, or a llama2.c checkpoint.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "llm/cuda/cuda_runtime_api.hpp"  // kMaxGemvRows
#include "llm/harness/device_info.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"

namespace CLI {
class App;
class Option;
}

namespace llm {

struct CommonOptions {
  std::string model_path;        // --model: llama2.c checkpoint (overrides --preset)
  std::string tokenizer_path;    // --tokenizer: tokenizer.bin for --model
  std::string preset = "tiny";   // --preset
  std::string prompt;            // --prompt ("" = start from BOS)
  int steps = 256;               // --steps: positions to run, prompt included
  float temperature = 0.0f;      // --temperature (0 = greedy)
  float top_p = 0.9f;            // --top-p
  std::uint64_t seed = 42;       // --seed (weights of presets and the sampler)
  std::string device = "all";    // --device cpu|cuda|all
  std::string dtype = "fp32";    // --dtype fp32|fp16|bf16: the CUDA model's weights
  std::string gemv = "cuda-cores";  // --gemv cuda-cores|tensor-cores: the fp16/bf16 products' GEMV kernel
  int max_gemv_rows = cuda::kDefaultMaxGemvRows;  // --max-gemv-rows N: those products of more rows run cuBLAS
  bool no_gemv_prefetch = false;  // --no-gemv-prefetch: the GEMV asks L2 for no weights before its wait
  bool no_gemv_pipelining = false;  // --no-gemv-pipelining: the GEMV's next weights requested after its multiplies
  bool no_gemv_wave_fit = false;  // --no-gemv-wave-fit: the GEMV's column split not fitted to whole waves
  bool gemv_prefetch_next = false;  // --gemv-prefetch-next: each GEMV asks L2 for the next product's first weights
  bool no_graphs = false;        // --no-graphs: CUDA decode launches every kernel (the before row of graphs)
  bool no_fusions = false;       // --no-fusions: the CUDA model's seven products and separate small kernels
  bool no_norm_folding = false;  // --no-norm-folding: fusions, but RMSNorm/SwiGLU/residual add as their own kernels
  bool merge_folding = false;    // --merge-folding: split-KV decode attention merges in its last split block
  bool no_rope_folding = false;  // --no-rope-folding: RoPE + K/V append as a kernel after the QKV product
  bool no_pdl = false;           // --no-pdl: each CUDA kernel starts after the one before finishes (no overlap)
  std::string variant = "all";   // --variant N[,M]|all
  bool list_variants = false;    // --list
  std::string json_path;         // --json FILE
  // How big a run is. The default is a laptop run: every check on, seconds,
  // under 1 GB. --full is the complete sweep whose numbers the docs quote
  // (minutes); --quick the seconds CI spends. A step flag given explicitly
  // (--contexts, --repeats, ...) wins over all three.
  bool quick = false;            // --quick
  bool full = false;             // --full
};

void add_common_options(CLI::App& app, CommonOptions& options);

// Range checks for numeric flags that say in words what is allowed, for every
// flag of every step. CLI11's own (CLI::PositiveNumber, CLI::Range) print the
// bounds as raw numbers, DBL_MAX's 309 digits included, and exit 105; these
// print "--steps must be at least 1 (got 0)" and parse_command_line exits 1.
// Each checks every value of a list flag (--k 2,4,0) and rejects NaN and
// infinity; a value that is not a number at all is left to CLI11's conversion
// ("Could not convert: --steps = abc"), which also exits 1. Each returns
// `option`, so that further settings chain after it:
//   llm::at_least(app.add_option("--repeats", repeats, "timed runs"), 1)->capture_default_str();
CLI::Option* at_least(CLI::Option* option, double minimum);               // minimum <= value
CLI::Option* greater_than(CLI::Option* option, double bound);             // bound < value (a size in GiB)
CLI::Option* in_range(CLI::Option* option, double minimum, double maximum);  // minimum <= value <= maximum

// The value a sized setting takes when its flag was not given: the --quick
// run's, the default run's or the --full run's.
template <class T>
T by_run_size(const CommonOptions& options, T quick, T standard, T full) {
  return options.quick ? quick : options.full ? full : standard;
}

struct LoadedModel {
  std::string name;        // "stories260K.bin" or "preset tiny"
  ModelWeights weights;
  Tokenizer tokenizer;
};

// Loads --model/--tokenizer, or builds the preset. Throws InputError.
LoadedModel load_model(const CommonOptions& options);

// Devices to run, from --device and what is present. "cuda" when no device is
// usable is an error (DeviceError); "all" quietly means "cpu" then, and the
// reason is returned in `skipped_reason` for the table's header.
struct DeviceSelection {
  bool cpu = false;
  bool cuda = false;
  std::string skipped_reason;
};
DeviceSelection select_devices(const std::string& device_flag);

// Parses the command line. Returns the exit status when the program should
// stop here, nullopt otherwise: 0 after --help, 1 after a bad flag (an unknown
// flag, a missing value, a value that is not a number or out of its range),
// the same status as every other bad input, once the reason is on stderr.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

// The device description for a results header; when --device all skipped
// CUDA, the reason replaces the generic note.
DeviceInfo device_info_for(const DeviceSelection& devices);

class Results;
// What every step's JSON config records of the common flags, so that a run
// (a sampled one too) can be repeated from its JSON alone: "temperature",
// "top_p", "seed" and "prompt" (the text; "" = from BOS). finish_run adds them.
void set_sampling_config(Results& results, const CommonOptions& options);

// The common end of every step: says why CUDA rows are missing, writes the
// JSON when --json was given (with set_sampling_config's keys), and returns 0
// when every row (and `other_checks_passed`) is ok, else prints an error and
// returns 1.
int finish_run(const Results& results, const CommonOptions& options, const DeviceSelection& devices,
               bool other_checks_passed = true);

// Runs `body` and turns course errors into a message on stderr and exit status
// 1, so no executable ends in an uncaught exception. (Bad flags never get
// here: parse_command_line reports them and returns 1.)
int run_main(int argc, char** argv, int (*body)(int, char**));

}  // namespace llm
