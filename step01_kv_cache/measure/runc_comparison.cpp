#include "step01_kv_cache/measure/runc_comparison.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sys/wait.h>

#include "llm/checkpoint.hpp"
#include "llm/errors.hpp"
#include "llm/harness/timer.hpp"

namespace step01 {
namespace {

// `text` inside single quotes for /bin/sh: a quote inside becomes '\''.
std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char ch : text) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

// Runs `command` through the shell and returns what it wrote to stdout.
// Throws InputError when it cannot start or exits non-zero.
std::string run_and_capture(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw llm::InputError(fmt::format("cannot run: {}", command));
  std::string output;
  char buffer[4096];
  while (const std::size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0)
    throw llm::InputError(fmt::format("'{}' failed (exit status {}); its output:\n{}", command,
                                      WIFEXITED(status) ? WEXITSTATUS(status) : status, output));
  return output;
}

}  // namespace

Llama2cFiles write_llama2c_files(const llm::LoadedModel& loaded, const std::string& checkpoint_path) {
  std::filesystem::path tokenizer_path(checkpoint_path);
  tokenizer_path.replace_extension(".tokenizer.bin");
  llm::save_checkpoint(loaded.weights, checkpoint_path);
  llm::save_tokenizer(loaded.tokenizer, tokenizer_path.string());
  return {checkpoint_path, tokenizer_path.string()};
}

RuncRun run_runc(const std::string& run_binary, const Llama2cFiles& files, int positions) {
  // run.c prints the text on stdout and "achieved tok/s: X" on stderr, both
  // captured here in one stream. Its last newline is still in stdout's buffer
  // when the speed line is written, so the line is cut out of the middle.
  const std::string command =
      fmt::format("{} {} -z {} -t 0 -n {} 2>&1", shell_quoted(run_binary), shell_quoted(files.checkpoint),
                  shell_quoted(files.tokenizer), positions);
  const std::string output = run_and_capture(command);
  const std::string marker = "achieved tok/s: ";
  const std::size_t at = output.rfind(marker);
  if (at == std::string::npos)
    throw llm::InputError(fmt::format("'{}' printed no \"{}\" line (is it llama2.c's run.c?); its output:\n{}",
                                      command, marker, output));
  RuncRun run;
  run.tokens_per_s = std::strtod(output.c_str() + at + marker.size(), nullptr);
  const std::size_t line_end = output.find('\n', at);
  run.text = output.substr(0, at) + (line_end == std::string::npos ? "" : output.substr(line_end + 1));
  return run;
}

RuncMeasurement measure_runc(const std::string& run_binary, const Llama2cFiles& files, int positions, int repeats) {
  RuncMeasurement m;
  run_runc(run_binary, files, std::min(positions, 8));  // warm-up: the page cache holds the checkpoint
  for (int r = 0; r < repeats; ++r) {
    RuncRun run = run_runc(run_binary, files, positions);
    m.tokens_per_s.push_back(run.tokens_per_s);
    if (r == 0) m.text = std::move(run.text);
  }
  std::vector<double> sorted = m.tokens_per_s;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t middle = sorted.size() / 2;
  m.median_tokens_per_s = sorted.size() % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
  return m;
}

}  // namespace step01
