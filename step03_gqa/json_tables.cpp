#include "json_tables.hpp"

#include <fmt/format.h>

#include <fstream>

#include "llm/errors.hpp"
#include "llm/harness/json_writer.hpp"

namespace step03 {
namespace {

std::string scalar_json(const llm::JsonScalar& value) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, long long>) return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, double>) return llm::json_number(x);
        else return llm::json_escape(x);
      },
      value);
}

}  // namespace

std::string results_json_with_tables(const llm::Results& results, const std::vector<JsonTable>& tables) {
  std::string json = results.to_json();
  // to_json() ends with the closing brace of the top-level object (and a
  // newline): reopen it there.
  const std::size_t close = json.rfind('}');
  if (close == std::string::npos) throw llm::InputError("results JSON without a closing brace");
  json.erase(close);
  while (!json.empty() && (json.back() == '\n' || json.back() == ' ')) json.pop_back();
  for (const JsonTable& table : tables) {
    json += fmt::format(",\n  {}: [", llm::json_escape(table.name));
    for (std::size_t r = 0; r < table.rows.size(); ++r) {
      json += r ? ",\n    {" : "\n    {";
      for (std::size_t k = 0; k < table.rows[r].size(); ++k)
        json += fmt::format("{}{}: {}", k ? ", " : "", llm::json_escape(table.rows[r][k].first),
                            scalar_json(table.rows[r][k].second));
      json += "}";
    }
    json += "\n  ]";
  }
  json += "\n}\n";
  return json;
}

void write_results_json(const std::string& path, const llm::Results& results, const std::vector<JsonTable>& tables) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw llm::InputError(fmt::format("cannot write results file '{}'", path));
  out << results_json_with_tables(results, tables);
  if (!out) throw llm::InputError(fmt::format("writing results file '{}' failed", path));
}

}  // namespace step03
