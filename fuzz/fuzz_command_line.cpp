// Fuzz target: a step's command line. The input is split into words at
// whitespace, as a shell would (no quoting), and parsed with the flags every
// step registers (add_common_options) plus step flags of each kind the steps
// use (an int, a comma-separated int list, a double, a string, flags, negated
// flags) under the range checks at_least, greater_than and in_range.
// parse_command_line must either accept the words, or print "error: ..." and
// return 1 (0 after --help): any exception escaping it, a crash or undefined
// behaviour is a finding. Run with -close_fd_mask=3: each refusal prints its
// message.
#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/step_command_line.hpp"

namespace {

struct StepFlags {
  int repeats = 3;
  std::vector<int> ks{2, 4};
  double budget_gib = 1.0;
  double fraction = 0.5;
  std::string sizes = "256";
  bool flag = false;
  bool on = true;
  bool loopback = true;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words{"step_fuzz"};
  std::string word;
  for (std::size_t i = 0; i <= size; ++i) {
    const char c = i < size ? static_cast<char>(data[i]) : ' ';
    if (c == ' ' || c == '\t' || c == '\n' || c == '\0') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word.push_back(c);
    }
  }
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);

  llm::CommonOptions common;
  StepFlags step;
  const std::optional<int> status = llm::parse_step_command_line(
      "fuzz", static_cast<int>(words.size()), argv.data(), common,
      [&step](CLI::App& app) {
        llm::in_range(app.add_option("--repeats", step.repeats, "timed runs"), 1, 1000);
        llm::in_range(app.add_option("--k", step.ks, "a list")->delimiter(','), 1, 64);
        llm::greater_than(app.add_option("--kv-budget-gib", step.budget_gib, "a size"), 0);
        llm::in_range(app.add_option("--fraction", step.fraction, "a fraction"), 0, 1);
        app.add_option("--seq-lens", step.sizes, "a list parsed later");
        app.add_flag("--flag", step.flag, "a flag");
        app.add_flag("--on,!--off", step.on, "a flag with a negation (step 02's --causal,!--no-causal)");
        app.add_flag("!--no-loopback", step.loopback, "a negated flag only (step 07's)");
      },
      [] {}, {{{"--prompt"}, "fuzzing"}});
  if (status && *status != 0 && *status != 1) std::abort();
  if (!status) {
    // Accepted: every checked value is within its range.
    if (common.steps < 1 || !(common.temperature >= 0) || !(common.top_p >= 0 && common.top_p <= 1)) std::abort();
    if (step.repeats < 1 || step.repeats > 1000 || !(step.budget_gib > 0)) std::abort();
    for (int k : step.ks)
      if (k < 1 || k > 64) std::abort();
    try {
      (void)llm::parse_positive_int_list(step.sizes, "--seq-lens");
    } catch (const llm::InputError&) {
    }
  }
  return 0;
}
