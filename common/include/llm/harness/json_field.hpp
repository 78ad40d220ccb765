#pragma once
// Reading the JSON an outside program printed (step 06's llama-bench, step
// 02's sdpa_compare.py): one field of the JSON type its reader expects, or an
// llm::InputError that names the field. Header-only; a target that includes
// it links nlohmann_json::nlohmann_json.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <string>

#include "llm/errors.hpp"

namespace llm {

// object[key] as `Value`. `where` names the object in the messages:
// "<where> has no \"key\"", "<where>'s \"key\" is <what it holds>".
template <typename Value>
Value required_json_field(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto found = object.find(key);
  if (found == object.end()) throw InputError(fmt::format("{} has no \"{}\"", where, key));
  try {
    return found->get<Value>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(fmt::format("{}'s \"{}\" is {}", where, key, found->dump()));
  }
}

}  // namespace llm
