#include "llm/harness/variant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

namespace llm {

std::vector<int> parse_variant_selection(const std::string& text, const std::vector<int>& known_ids) {
  if (text == "all") return known_ids;
  if (text.empty() || text.back() == ',' || text.front() == ',')
    throw InputError(fmt::format("--variant expects 'all' or ids like 0,1 (got '{}')", text));
  std::vector<int> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    int id = 0;
    try {
      std::size_t used = 0;
      id = std::stoi(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw InputError(fmt::format("--variant expects 'all' or ids like 0,1 (got '{}')", text));
    }
    if (std::find(known_ids.begin(), known_ids.end(), id) == known_ids.end())
      throw InputError(fmt::format("--variant {}: no such variant (see --list)", id));
    ids.push_back(id);
  }
  return ids;
}

}  // namespace llm
