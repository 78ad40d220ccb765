#pragma once
// Step 06 beside llama.cpp: the same checkpoint decoded by llama.cpp's
// llama-bench and by this step's rows, one thread each, in the same run.
//
// llama.cpp is the CPU inference most people run; its Q8_0 and Q4_0 products
// (int8 activations, integer dot products) are the bar this step's quantized
// kernels are held to. The course does not ship llama.cpp: build llama-bench,
// convert the checkpoint with llama.cpp's llama2.c converter and quantize it
// with `llama-quantize --pure` (every matrix in the one type, as this step
// quantizes every matrix; docs/06_quantization.md says how), then pass
//   --compare-llama-bench path/to/llama-bench --llama-gguf f32.gguf,q8_0.gguf,q4_0.gguf
// Each GGUF runs as `llama-bench -m FILE -t 1 -p 0 -n N -r R -o json`: N
// decode tokens (this step's decode forwards of the loaded model), R
// repetitions (this step's repeats); its type (F32, Q8_0, ...) is read from
// what llama-bench reports, and paired with this step's rows:
//   F32  - fp32
//   Q8_0 - int8 and int8-a8 (the faster of the two is the pair's ratio)
//   Q4_0 - the fastest 4-bit row, and int4sym-g32-a8 (Q4_0's own layout and
//          product) when it ran
//   any other type is shown without a partner.
#include <string>
#include <vector>

#include "llm/harness/progress.hpp"
#include "llm/harness/results.hpp"
#include "step06_quantization/measure/model_table.hpp"

namespace step06 {

// Checks a comparison request before any work: --compare-llama-bench and
// --llama-gguf together or not at all, the CPU selected (the comparison is
// one CPU thread), the binary an executable file, every GGUF a file.
// Throws llm::InputError saying which.
void check_llama_bench_request(const std::string& binary, const std::vector<std::string>& ggufs, bool cpu_selected);

// One llama-bench decode test of one GGUF, as its JSON reports it.
struct LlamaBenchResult {
  std::string gguf;               // the file as given to -m
  std::string model_type;         // llama.cpp's description of the model: "llama ?B Q8_0"
  std::string type_name;          // its weights' type, from model_type: "F32", "Q8_0", "Q4_0", "Q4_K - Medium"
  long long model_size_bytes = 0;  // every tensor's bytes, the token embedding included
  long long model_parameters = 0;
  long long decode_tokens = 0;    // n_gen: tokens decoded one at a time from position 0
  double avg_tokens_per_s = 0.0;  // the mean of the samples
  double stddev_tokens_per_s = 0.0;
  std::vector<double> samples_tokens_per_s;  // [repetitions]
  std::string build_commit;       // llama.cpp's commit, as it was built
  long long build_number = 0;     // llama.cpp's commit count (its release "bNNNN")
  std::string binary;             // llama-bench, as given (empty when only the JSON was parsed)
  std::string command;            // the command line that ran
};

// Reads llama-bench's `-o json` output (an array of tests) and returns its
// decode test (n_prompt 0, n_gen > 0). `gguf` and `command` are recorded
// with it. Throws llm::InputError when the text is not that JSON or holds no
// decode test.
LlamaBenchResult parse_llama_bench_json(const std::string& json_text, const std::string& gguf,
                                        const std::string& command);

// Runs `binary -m gguf -t 1 -p 0 -n decode_tokens -r repeats -o json` and
// parses what it prints. Throws llm::InputError when the binary cannot be
// run, exits non-zero (the error carries the end of its stderr) or prints no
// decode test.
LlamaBenchResult run_llama_bench(const std::string& binary, const std::string& gguf, int decode_tokens, int repeats);

// run_llama_bench on each GGUF in turn, each a part of `progress` (stderr).
std::vector<LlamaBenchResult> run_llama_bench_files(const std::string& binary, const std::vector<std::string>& ggufs,
                                                    int decode_tokens, int repeats, llm::RunProgress& progress);

// One of this step's rows beside a llama.cpp type.
struct LlamaPartner {
  std::string weights;      // the row's weights: "fp32", "int8-a8", "int4-g64"
  std::string role;         // why it is here when its name does not say: "best 4-bit", "Q4_0's layout"; else empty
  double tokens_per_s = 0.0;
  bool headline = false;    // the row the type's ratio is quoted from (the faster int8 row, the best 4-bit row)
};

// A llama.cpp GGUF and this step's rows it is compared with (none: a type
// this step has no counterpart for).
struct LlamaComparison {
  LlamaBenchResult llama;
  std::vector<LlamaPartner> partners;
  // ours / llama.cpp's tokens/s for `partner`.
  double ratio(const LlamaPartner& partner) const { return partner.tokens_per_s / llama.avg_tokens_per_s; }
};

// Pairs each llama.cpp result with this step's decode rows of the same model
// (`rows`: the loaded model's table; only its CPU rows of RTN weights with
// the fp32 KV cache that ran are candidates), as the header says.
std::vector<LlamaComparison> pair_with_llama(const std::vector<LlamaBenchResult>& llama,
                                             const std::vector<ModelRow>& rows);

// One table: llama.cpp type | its tok/s | this step's row | its tok/s | ours / llama.cpp.
void print_llama_comparison(const std::vector<LlamaComparison>& comparisons, const std::string& model_name,
                            int decode_tokens, int repeats);

// The comparison in the JSON: the table "llama_bench" (one object per line
// of the printed table, the llama.cpp command line in each) and the config
// key "llama_bench_build" (llama.cpp's commit and build number).
void add_llama_rows(llm::Results& results, const std::vector<LlamaComparison>& comparisons);

}  // namespace step06
