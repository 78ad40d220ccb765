#pragma once
// The start of every step executable: its command line (the flags every step
// accepts plus the step's own), --list, and the prompt it generates from.
#include <fmt/format.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/variant.hpp"

namespace CLI {
class App;
}

namespace llm {

// Common flags a step does not use, and why. Every step accepts every common
// flag, so that scripts/run_all_steps.sh can pass the same ones to all of
// them; one of these, given anyway, prints a note on stderr and the run goes
// on (an error would stop that script at the first such step):
//   step02_flash_attention: --prompt is not used by this step (it benchmarks attention kernels on random inputs)
struct UnusedFlags {
  std::vector<std::string> flags;  // {"--prompt", "--steps"}
  std::string reason;              // "it benchmarks attention kernels on random inputs"
};

// Registers the flags every step accepts (add_common_options) and then the
// step's own (`add_step_flags`, in the order --help lists them), and parses.
// With --list it runs `print_variants` (the step's print_variant_list). Returns
// the exit status when the program should stop here (--help: 0; a bad flag: 1,
// the reason printed; --list: 0), nullopt otherwise, after a note for each
// flag of `unused` that was given.
std::optional<int> parse_step_command_line(const std::string& description, int argc, char** argv,
                                           CommonOptions& common,
                                           const std::function<void(CLI::App&)>& add_step_flags,
                                           const std::function<void()>& print_variants,
                                           const std::vector<UnusedFlags>& unused = {});

// What --list prints for a variant beyond its id, name and what changed:
// `columns` stand between the name and the description (step 02: device and
// dtype), `note` after it ("  [not in this build]").
struct VariantListDetails {
  std::string columns;
  std::string note;
};

// --list: one line per variant, "  id  name  [columns]what changed[note]".
// `name_width` pads the names into a column (each step's widest name).
template <class Fn>
std::string format_variant_list(
    const std::vector<Variant<Fn>>& table, int name_width,
    const std::function<VariantListDetails(const Variant<Fn>&)>& details_of = {}) {
  std::string out;
  for (const auto& variant : table) {
    const VariantListDetails details = details_of ? details_of(variant) : VariantListDetails{};
    out += fmt::format("{:>3}  {:<{}} {}{}{}\n", variant.id, variant.name, name_width, details.columns,
                       variant.what_changed, details.note);
  }
  return out;
}

template <class Fn>
void print_variant_list(const std::vector<Variant<Fn>>& table, int name_width,
                        const std::function<VariantListDetails(const Variant<Fn>&)>& details_of = {}) {
  fmt::print("{}", format_variant_list(table, name_width, details_of));
}

// True when `id` is among the ids --variant selected.
bool is_selected(const std::vector<int>& selected_ids, int id);

// --prompt as token ids, BOS first (llama2.c's encode with add_bos).
std::vector<int> encode_prompt(const LoadedModel& loaded, const CommonOptions& options);

// A flag's comma-separated list of positive integers ("1024,4096"); `flag`
// names it in the InputError a bad or empty list gets.
std::vector<int> parse_positive_int_list(const std::string& text, const char* flag);

// Positions a generation runs, prompt included: --steps, capped at the
// model's context as llama2.c caps -n, with a note on stderr when it is
// ("--steps 1000 is more than the model's context of 512 positions; running
// 512"). Throws InputError when the prompt does not fit in them.
int generation_positions(const CommonOptions& options, const ModelConfig& config, std::size_t prompt_tokens);

}  // namespace llm
