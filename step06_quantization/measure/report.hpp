#pragma once
// The step's measurements as results rows (JSON) and as the printed tables,
// and its targets checked against what was measured.
#include <string>
#include <vector>

#include "llm/harness/results.hpp"
#include "step06_quantization/measure/kernel_table.hpp"
#include "step06_quantization/measure/model_table.hpp"

namespace step06 {

// Part 1: one row per kernel cell that ran (skipped cells travel in the
// "skipped_cells" JSON table); printed as one line per shape and format with
// every batch side by side.
void add_kernel_rows(llm::Results& results, const KernelTable& table, double cuda_copy_gbps);
void print_kernel_table(const KernelTable& table, double cuda_copy_gbps);

// Parts 2 and 3: one row per model variant and device.
void add_model_rows(llm::Results& results, const std::vector<ModelRow>& rows, const std::string& part,
                    double cpu_read_gbps, double cuda_copy_gbps);
void print_speed_table(const std::vector<ModelRow>& rows, double cpu_read_gbps, double cuda_copy_gbps);
void print_quality_table(const std::vector<ModelRow>& rows, bool trained_weights);

// The targets: CPU decode speedups on the small preset, CUDA W4A16 on
// Llama-2-7B layers and the loaded model's CUDA decode against its fp16
// model, GPTQ/AWQ vs RTN and int8's top-1 on a trained model.
// Each is "met", "missed" (with the measured value) or "not measured" (and
// why); they go to the JSON table "targets" and are printed. Never a check:
// a miss does not fail the run.
struct TargetInputs {
  const KernelTable* kernels = nullptr;
  const std::vector<ModelRow>* small_speed = nullptr;  // part 2 on the small preset
  const std::vector<ModelRow>* quality = nullptr;      // parts 2 and 3 on the loaded model
  bool trained_weights = false;                        // part 3 ran on a checkpoint
};
void report_targets(llm::Results& results, const TargetInputs& inputs);

}  // namespace step06
