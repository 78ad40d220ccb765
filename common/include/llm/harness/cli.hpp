#pragma once
// The flags every step executable accepts (CLI11), and loading the model they
// name: a preset with seeded random weights, or a llama2.c checkpoint.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "llm/harness/device_info.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"

namespace CLI {
class App;
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
  std::string variant = "all";   // --variant N[,M]|all
  bool list_variants = false;    // --list
  std::string json_path;         // --json FILE
  bool quick = false;            // --quick: seconds, for CI
};

void add_common_options(CLI::App& app, CommonOptions& options);

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
// stop here (--help, or a bad flag: CLI11 has printed why), nullopt otherwise.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

// The device description for a results header; when --device all skipped
// CUDA, the reason replaces the generic note.
DeviceInfo device_info_for(const DeviceSelection& devices);

class Results;
// The common end of every step: says why CUDA rows are missing, writes the
// JSON when --json was given, and returns 0 when every row (and
// `other_checks_passed`) is ok, else prints an error and returns 1.
int finish_run(const Results& results, const CommonOptions& options, const DeviceSelection& devices,
               bool other_checks_passed = true);

// Runs `body` and turns course errors into a message on stderr and exit status
// 1, so no executable ends in an uncaught exception. (Command-line errors are
// reported by CLI11 itself, with its own non-zero codes.)
int run_main(int argc, char** argv, int (*body)(int, char**));

}  // namespace llm
