#pragma once
// One way to turn a measurement into a results row, and one way to say that
// a check failed.
#include <string>

#include "llm/harness/compare.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/timer.hpp"

namespace llm {

// A row of `variant` (id `id`) on `device`, timed by `time` and checked by
// `check`: time_ms is the median, speedup = baseline / median (the step
// decides the baseline), max_rel_err and ok come from the check; the JSON
// also gets time_min_ms, time_max_ms and max_abs_err. The step adds the
// throughput and its own keys.
ResultRow timed_result_row(const std::string& device, int id, const std::string& variant, const TimingStats& time,
                           double speedup, const CompareResult& check);

// On stderr, beside the table's FAIL: "check failed for <what>: <why>".
void report_failed_check(const std::string& what, const std::string& why);
// The same with the comparison's summary as the why, only when it failed;
// returns check.ok.
bool report_if_failed(const std::string& what, const CompareResult& check);

}  // namespace llm
