#pragma once
// A minimal JSON writer (objects, arrays, scalars, escaped strings), enough for
// the results files; the course avoids a JSON dependency for this one use.
#include <string>
#include <string_view>

namespace llm {

std::string json_escape(std::string_view text);  // with the quotes
std::string json_number(double value);           // NaN/Inf become null

}  // namespace llm
