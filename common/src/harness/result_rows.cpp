#include "llm/harness/result_rows.hpp"

#include <cstdio>

namespace llm {

ResultRow timed_result_row(const std::string& device, int id, const std::string& variant, const TimingStats& time,
                           double speedup, const CompareResult& check) {
  ResultRow row;
  row.device = device;
  row.variant = variant;
  row.id = id;
  row.time_ms = time.median_ms;
  row.speedup = speedup;
  row.max_rel_err = check.max_rel_err;
  row.ok = check.ok;
  row.extra["time_min_ms"] = time.min_ms;
  row.extra["time_max_ms"] = time.max_ms;
  row.extra["max_abs_err"] = check.max_abs_err;
  return row;
}

void report_failed_check(const std::string& what, const std::string& why) {
  std::fprintf(stderr, "check failed for %s: %s\n", what.c_str(), why.c_str());
}

bool report_if_failed(const std::string& what, const CompareResult& check) {
  if (!check.ok) report_failed_check(what, check.summary());
  return check.ok;
}

}  // namespace llm
