#include "llm/harness/step_command_line.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "llm/errors.hpp"

namespace llm {

std::optional<int> parse_step_command_line(const std::string& description, int argc, char** argv,
                                           CommonOptions& common,
                                           const std::function<void(CLI::App&)>& add_step_flags,
                                           const std::function<void()>& print_variants,
                                           const std::vector<UnusedFlags>& unused) {
  CLI::App app{description};
  add_common_options(app, common);
  if (add_step_flags) add_step_flags(app);
  if (const auto exit_status = parse_command_line(app, argc, argv)) return exit_status;
  if (common.list_variants && print_variants) {
    print_variants();
    return 0;
  }
  // The executable's name starts each note, as a compiler's name starts its
  // warnings: scripts/run_all_steps.sh interleaves the output of every step.
  const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "step";
  for (const UnusedFlags& group : unused)
    for (const std::string& flag : group.flags)
      if (app.count(flag) > 0)  // app.count throws for a flag that does not exist: a typo in the step's list
        fmt::print(stderr, "{}: {} is not used by this step ({})\n", program, flag, group.reason);
  return std::nullopt;
}

bool is_selected(const std::vector<int>& selected_ids, int id) {
  return std::find(selected_ids.begin(), selected_ids.end(), id) != selected_ids.end();
}

std::vector<int> encode_prompt(const LoadedModel& loaded, const CommonOptions& options) {
  return loaded.tokenizer.encode(options.prompt, /*add_bos=*/true, /*add_eos=*/false);
}

int generation_positions(const CommonOptions& options, const ModelConfig& config, std::size_t prompt_tokens) {
  const int positions = std::min(options.steps, config.seq_len);
  if (positions < options.steps)
    fmt::print(stderr, "note: --steps {} is more than the model's context of {} positions; running {}\n",
               options.steps, config.seq_len, positions);
  if (prompt_tokens > static_cast<std::size_t>(positions))
    throw InputError(fmt::format("the prompt is {} tokens but --steps is {} (and the context {})", prompt_tokens,
                                 positions, config.seq_len));
  return positions;
}

std::vector<int> parse_positive_int_list(const std::string& text, const char* flag) {
  std::vector<int> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      std::size_t used = 0;
      const int value = std::stoi(item, &used);
      if (used != item.size() || value <= 0) throw std::invalid_argument(item);
      values.push_back(value);
    } catch (const std::exception&) {
      throw InputError(fmt::format("{} expects positive integers like 1024,4096 (got '{}')", flag, text));
    }
  }
  if (values.empty()) throw InputError(fmt::format("{} needs at least one value", flag));
  return values;
}

}  // namespace llm
