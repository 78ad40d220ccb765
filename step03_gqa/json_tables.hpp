#pragma once
// Extra top-level tables in a step's JSON: llm::Results holds the measured
// rows (device | variant | time ...); the cache-size tables of this step are
// not timings, so they travel beside the rows as arrays of flat objects:
//   {"step": ..., "rows": [...], "kv_cache_by_kv_heads": [{...}, ...], ...}
#include <string>
#include <utility>
#include <vector>

#include "llm/harness/results.hpp"

namespace step03 {

// One flat JSON object, keys in insertion order.
using JsonObject = std::vector<std::pair<std::string, llm::JsonScalar>>;

struct JsonTable {
  std::string name;
  std::vector<JsonObject> rows;
};

// results.to_json() with `tables` added as top-level keys.
std::string results_json_with_tables(const llm::Results& results, const std::vector<JsonTable>& tables);
// Writes it to `path`; throws llm::InputError on I/O failure.
void write_results_json(const std::string& path, const llm::Results& results, const std::vector<JsonTable>& tables);

}  // namespace step03
