#pragma once
// Results: the rows a step measured, printed as a table (fmt) and written as
// JSON with --json FILE:
//   {"step": ..., "config": {...}, "device_info": {...}, "rows": [{"device":
//    "cpu"|"cuda", "variant": ..., "id": ..., "time_ms": ..., "speedup": ...,
//    "max_rel_err": ..., "ok": true, ...extra keys}], "notes": [...]}
// Docs quote the JSON, never a number typed by hand.
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "llm/harness/device_info.hpp"

namespace llm {

using JsonScalar = std::variant<bool, long long, double, std::string>;

// A table that is not a list of timed variants (cache sizes, a sweep, ...):
// it travels in the JSON beside "rows" as a top-level array of flat objects,
//   {"step": ..., "rows": [...], "<name>": [{...}, ...]}
using JsonObject = std::vector<std::pair<std::string, JsonScalar>>;  // keys in insertion order
struct JsonTable {
  std::string name;
  std::vector<JsonObject> rows;
};

struct ResultRow {
  std::string device;    // "cpu" or "cuda"
  std::string variant;   // the variant's name
  int id = 0;            // the variant's id
  double time_ms = 0.0;  // median time of what the row measures
  double speedup = 1.0;  // baseline time / this time (same device's baseline)
  double max_rel_err = 0.0;
  bool ok = false;
  // An approximation by design (step 03's mean-pooled KV heads): max_rel_err
  // is reported, not held to a tolerance, and `ok` is the row's own weaker
  // check (finite output, say). The table prints "approx" instead of "ok"
  // (still "FAIL" when that check fails); the JSON adds "expected_inexact": true.
  bool expected_inexact = false;
  // Throughput shown in the table, e.g. {"tokens_per_s", 5123.4}.
  std::string throughput_key;
  double throughput = 0.0;
  std::map<std::string, JsonScalar> extra;  // more keys for the JSON
};

class Results {
 public:
  Results(std::string step, std::string title);

  void set_config(const std::string& key, JsonScalar value) { config_[key] = std::move(value); }
  void set_device_info(const DeviceInfo& info) { device_info_ = info; }
  void add_row(ResultRow row) { rows_.push_back(std::move(row)); }
  void add_table(JsonTable table) { tables_.push_back(std::move(table)); }
  // A line printed under the table and written to the JSON's "notes": what
  // the speedup column compares, what a mark in the ok column means.
  void add_note(std::string note) { notes_.push_back(std::move(note)); }
  const std::vector<std::string>& notes() const { return notes_; }
  const std::vector<ResultRow>& rows() const { return rows_; }
  bool all_ok() const;

  // Whether format_header prints the config line (a step that prints its
  // header before its config is complete leaves it out).
  enum class ConfigLine { Shown, Omitted };
  // "== step : title ==", the CPU and GPU lines, the config line, the commit.
  std::string format_header(ConfigLine config_line = ConfigLine::Shown) const;
  // format_header, a blank line, then one line per row:
  // device | id | variant | time | throughput | speedup | error | ok,
  // then the notes, one per line (and what "approx" means, when a row is).
  std::string format_table() const;
  std::string to_json() const;
  void write_json(const std::string& path) const;  // throws InputError on I/O failure

 private:
  std::string step_;
  std::string title_;
  std::map<std::string, JsonScalar> config_;
  DeviceInfo device_info_;
  std::vector<ResultRow> rows_;
  std::vector<JsonTable> tables_;
  std::vector<std::string> notes_;
};

// A rate for a table, in fixed notation with about three significant digits
// (never an exponent, so a column lines up): "0.123", "9.29", "45.6", "9290",
// "10890", "2.35M".
std::string format_rate(double value);

// A duration for a table: "850.0 us", "3.25 ms", "1.20 s".
std::string format_ms(double ms);

// Bytes for a table: "512 B", "1.2 KiB", "64.0 MiB", "2.0 GiB" (powers of 1024).
std::string format_bytes(double bytes);

// The commit the binary was built from, read at build time (cmake/WriteGitCommit.cmake).
const char* git_commit();

}  // namespace llm
