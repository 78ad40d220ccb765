#pragma once
// Step 01 beside llama2.c's run.c: the same checkpoint decoded by both
// programs, one thread each, in the same run.
//
// run.c is the 1,000-line C file that made "a Llama in one file" famous; its
// cached decode (one matrix-vector product loop, compiled with -Ofast
// -march=native) is the bar a CPU reference should reach. The course does not
// ship run.c: build it yourself from the llama2.c repository, e.g.
//   gcc -Ofast -march=native -o run run.c -lm
// then pass the binary with --compare-runc. Any model works: --model files
// directly, presets through --write-checkpoint.
#include <string>
#include <vector>

#include "llm/harness/cli.hpp"

namespace step01 {

// The llama2.c files a run writes for a model: checkpoint and tokenizer.
struct Llama2cFiles {
  std::string checkpoint;
  std::string tokenizer;
};

// Writes `loaded` as a llama2.c checkpoint at `checkpoint_path` and its
// tokenizer beside it ("<stem>.tokenizer.bin"). Presets become files run.c
// (and --model) can load.
Llama2cFiles write_llama2c_files(const llm::LoadedModel& loaded, const std::string& checkpoint_path);

// One run.c decode: its tokens/s as run.c reports it ("achieved tok/s",
// timed from the second token on) and what it printed.
struct RuncRun {
  double tokens_per_s = 0.0;
  std::string text;  // stdout: the generated text
};

// Runs `run_binary` greedy (-t 0) for `positions` positions on `files`.
// Throws llm::InputError when the binary cannot be run or reports no speed.
RuncRun run_runc(const std::string& run_binary, const Llama2cFiles& files, int positions);

// Median tokens/s over `repeats` runs, and the first run's text.
struct RuncMeasurement {
  double median_tokens_per_s = 0.0;
  std::vector<double> tokens_per_s;  // [repeats]
  std::string text;
};
RuncMeasurement measure_runc(const std::string& run_binary, const Llama2cFiles& files, int positions, int repeats);

}  // namespace step01
