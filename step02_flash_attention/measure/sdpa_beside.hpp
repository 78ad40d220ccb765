#pragma once
// Step 02 beside PyTorch's SDPA: the FlashAttention-2 rows of this run next
// to PyTorch's scaled_dot_product_attention (its FlashAttention-2 backend)
// on the same GPU, the same shapes, in the same run.
//
// PyTorch is the bar the course's kernels are held to (docs/02, section 8.2):
// its FLASH_ATTENTION backend is FlashAttention-2 itself. The course does not
// ship PyTorch; where it is installed,
//   --compare-sdpa step02_flash_attention/measure/sdpa_compare.py [--python python3]
// runs that script once per --heads value of the kernel table, with the
// table's head dims, CUDA lengths and mask, and `--json -` (its rows as JSON
// on stdout). Then one table pairs every (dtype, head_dim, length) of PyTorch
// with this run's rows of the same shape: the baseline FlashAttention-2
// (cuda_flash2_fp16 / _bf16), the ladder's scheduling rungs' end
// (cuda_flash2_tuned_fp16 / _bf16) and its last rung
// (cuda_flash2_hoisted_copies_fp16 / _bf16), each as a percentage of
// PyTorch's TFLOP/s; the JSON gets the table "sdpa" and the targets (the last
// rung >= 80% of PyTorch at 4096 tokens and more).
#include <string>
#include <vector>

#include "llm/harness/results.hpp"

namespace step02 {

// Checks a comparison request before any work: the script a readable file,
// then CUDA selected (PyTorch runs on the GPU). Throws llm::InputError saying which.
void check_sdpa_request(const std::string& script, bool cuda_selected);

// One shape as sdpa_compare.py timed it.
struct SdpaRow {
  std::string dtype;     // "fp16" or "bf16" (the course's names for float16, bfloat16)
  int heads = 0;
  int head_dim = 0;
  int seqlen = 0;        // Sq = Sk
  bool causal = true;
  double time_ms = 0.0;  // median of the script's runs, L2 flushed before each
  double tflops = 0.0;   // the course's FLOP formula (attention_problem.hpp) over time_ms
  std::string backend;   // "flash_attention", or "default" when that backend refused (see note)
  std::string note;
};

// What one run of the script reported.
struct SdpaRun {
  std::vector<SdpaRow> rows;
  std::string gpu_name;       // as PyTorch names the device
  std::string torch_version;
  std::string command;        // the command line that ran
};

// Reads sdpa_compare.py's JSON ({"device_info": {...}, "rows": [...]}).
// Throws llm::InputError when the text is not that JSON, or a row lacks a
// field or has a time that is not a positive number.
SdpaRun parse_sdpa_json(const std::string& json_text, const std::string& command);

// The shapes of one run of the script.
struct SdpaShapes {
  int heads = 8;
  std::vector<int> head_dims;
  std::vector<int> seq_lens;
  bool causal = true;
};

// Runs `python script --heads H --head-dims D,.. --seq-lens S,.. [--no-causal]
// --json -` and parses what it prints. Throws llm::InputError when it cannot
// start, fails (the end of its stderr is quoted) or prints no such JSON.
SdpaRun run_sdpa_compare(const std::string& python, const std::string& script, const SdpaShapes& shapes);

// Prints PyTorch's rows beside this run's FlashAttention-2 rows of the same
// shape (read from `results`' prefill rows), and adds the tables "sdpa" and
// "targets" to the results.
void report_sdpa_comparison(llm::Results& results, const std::vector<SdpaRun>& runs);

}  // namespace step02
