#pragma once
// The variant table: each step lists its implementations once (id, name, one
// line of what changed, the function). The CLI (--list, --variant), the tests
// and the benchmarks all read the same table, so a new variant is one new row.
// Convention: id 0 is the baseline; library rows (cuBLAS, ...) take ids >= 90.
#include <string>
#include <vector>

#include "llm/errors.hpp"

namespace llm {

// Where a variant runs. Any: the variant is an algorithm over the Model
// interface (step 01's decode loops) and runs on every device.
enum class Backend { Cpu, Cuda, Any };
inline const char* backend_name(Backend b) {
  return b == Backend::Cpu ? "cpu" : b == Backend::Cuda ? "cuda" : "any";
}

template <class Fn>
struct Variant {
  int id;
  std::string name;
  std::string what_changed;  // one line, shown by --list
  Backend backend;
  Fn fn;
};

// Parses --variant: "all" -> every id, else a comma-separated id list that
// must exist in the table (InputError otherwise).
std::vector<int> parse_variant_selection(const std::string& text, const std::vector<int>& known_ids);

template <class Fn>
std::vector<int> variant_ids(const std::vector<Variant<Fn>>& table) {
  std::vector<int> ids;
  for (const auto& v : table) ids.push_back(v.id);
  return ids;
}

// The ids of the variants that run on `backend` (tests instantiate one suite
// per backend from this).
template <class Fn>
std::vector<int> variant_ids(const std::vector<Variant<Fn>>& table, Backend backend) {
  std::vector<int> ids;
  for (const auto& v : table)
    if (v.backend == backend) ids.push_back(v.id);
  return ids;
}

}  // namespace llm
