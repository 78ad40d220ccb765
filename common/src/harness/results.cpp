#include "llm/harness/results.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "llm/errors.hpp"
#include "llm/harness/json_writer.hpp"

namespace llm {

Results::Results(std::string step, std::string title) : step_(std::move(step)), title_(std::move(title)) {}

bool Results::all_ok() const {
  for (const auto& r : rows_)
    if (!r.ok) return false;
  return !rows_.empty();
}

namespace {

std::string scalar_text(const JsonScalar& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, long long>) return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, double>) return fmt::format("{:.6g}", x);
        else return x;
      },
      v);
}

std::string scalar_json(const JsonScalar& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, long long>) return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, double>) return json_number(x);
        else return json_escape(x);
      },
      v);
}

std::string format_throughput(const std::string& key, double value) {
  if (key.empty()) return "-";
  std::string unit = key;
  if (key == "tokens_per_s") unit = "tok/s";
  else if (key == "gbps") unit = "GB/s";
  else if (key == "tflops") unit = "TFLOP/s";
  return format_rate(value) + " " + unit;
}

}  // namespace

std::string format_rate(double value) {
  if (!std::isfinite(value)) return fmt::format("{}", value);
  if (value >= 1e6) return fmt::format("{:.2f}M", value / 1e6);
  // Fixed notation with about three significant digits, never an exponent:
  // a column reads 9290 beside 10890, not 9.29e+03 beside 10890.
  const double magnitude = std::fabs(value);
  int decimals = 0;
  if (magnitude < 1e-3) decimals = 5;
  else if (magnitude < 1.0) decimals = 3;
  else if (magnitude < 10.0) decimals = 2;
  else if (magnitude < 100.0) decimals = 1;
  return fmt::format("{:.{}f}", value, decimals);
}

std::string format_ms(double ms) {
  if (ms >= 1000.0) return fmt::format("{:.2f} s", ms / 1000.0);
  if (ms >= 1.0) return fmt::format("{:.2f} ms", ms);
  return fmt::format("{:.1f} us", ms * 1000.0);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string Results::format_header(ConfigLine config_line) const {
  std::string out;
  out += fmt::format("== {} : {} ==\n", step_, title_);
  out += fmt::format("cpu: {} ({} thread{})\n", device_info_.cpu_model, device_info_.cpu_threads,
                     device_info_.cpu_threads == 1 ? "" : "s");
  if (device_info_.cuda_available)
    out += fmt::format("gpu: {} (sm_{}, {} SMs, {:.0f} GiB, SM clock up to {} MHz, memory {} MHz x {} bits), "
                       "driver {} (CUDA {}), CUDA runtime {}\n",
                       device_info_.gpu_name, device_info_.gpu_compute_capability, device_info_.gpu_sm_count,
                       device_info_.gpu_memory_gib, device_info_.gpu_sm_clock_mhz, device_info_.gpu_memory_clock_mhz,
                       device_info_.gpu_memory_bus_bits,
                       device_info_.nvidia_driver.empty() ? "?" : device_info_.nvidia_driver, device_info_.cuda_driver,
                       device_info_.cuda_runtime);
  else
    out += fmt::format("gpu: none ({})\n", device_info_.cuda_note);
  if (config_line == ConfigLine::Shown) {
    std::string config;
    for (const auto& [k, v] : config_) config += fmt::format("{}{}={}", config.empty() ? "" : ", ", k, scalar_text(v));
    out += fmt::format("config: {}\n", config);
  }
  out += fmt::format("commit: {}\n", git_commit());
  return out;
}

std::string Results::format_table() const {
  std::string out = format_header() + "\n";
  // The variant column: 22 wide, or the longest name when one is longer.
  std::size_t name_width = 22;
  for (const auto& r : rows_) name_width = std::max(name_width, r.variant.size());
  out += fmt::format("{:<6} {:>3}  {:<{}} {:>11} {:>16} {:>9} {:>10}  {}\n", "device", "id", "variant", name_width,
                     "time", "throughput", "speedup", "max_rel", "ok");
  out += std::string(70 + name_width, '-') + "\n";
  bool any_inexact = false;
  for (const auto& r : rows_) {
    out += fmt::format("{:<6} {:>3}  {:<{}} {:>11} {:>16} {:>8.2f}x {:>10.2e}  {}\n", r.device, r.id, r.variant,
                       name_width, format_ms(r.time_ms), format_throughput(r.throughput_key, r.throughput), r.speedup,
                       r.max_rel_err, !r.ok ? "FAIL" : r.expected_inexact ? "approx" : "ok");
    any_inexact |= r.expected_inexact;
  }
  for (const std::string& note : notes_) out += note + "\n";
  if (any_inexact)
    out += "approx = an approximation by design: max_rel is reported, not held to a tolerance; the row passed its "
           "own check\n";
  return out;
}

std::string Results::to_json() const {
  std::string out = "{\n";
  out += fmt::format("  \"step\": {},\n  \"title\": {},\n  \"commit\": {},\n", json_escape(step_), json_escape(title_),
                     json_escape(git_commit()));
  out += "  \"config\": {";
  bool first = true;
  for (const auto& [k, v] : config_) {
    out += fmt::format("{}\n    {}: {}", first ? "" : ",", json_escape(k), scalar_json(v));
    first = false;
  }
  out += "\n  },\n";
  const DeviceInfo& d = device_info_;
  out += fmt::format(
      "  \"device_info\": {{\n    \"cpu_model\": {},\n    \"cpu_threads\": {},\n    \"cuda_available\": {},\n"
      "    \"cuda_note\": {},\n    \"gpu_name\": {},\n    \"gpu_sm_count\": {},\n"
      "    \"gpu_compute_capability\": {},\n    \"gpu_memory_gib\": {},\n    \"gpu_sm_clock_mhz\": {},\n"
      "    \"gpu_memory_clock_mhz\": {},\n    \"gpu_memory_bus_bits\": {},\n    \"nvidia_driver\": {},\n"
      "    \"cuda_driver\": {},\n    \"cuda_runtime\": {}\n  }},\n",
      json_escape(d.cpu_model), d.cpu_threads, d.cuda_available ? "true" : "false", json_escape(d.cuda_note),
      json_escape(d.gpu_name), d.gpu_sm_count, d.gpu_compute_capability, json_number(d.gpu_memory_gib),
      d.gpu_sm_clock_mhz, d.gpu_memory_clock_mhz, d.gpu_memory_bus_bits, json_escape(d.nvidia_driver),
      json_escape(d.cuda_driver), json_escape(d.cuda_runtime));
  out += "  \"rows\": [";
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const ResultRow& r = rows_[i];
    out += fmt::format(
        "{}\n    {{\"device\": {}, \"variant\": {}, \"id\": {}, \"time_ms\": {}, \"speedup\": {}, "
        "\"max_rel_err\": {}, \"ok\": {}",
        i ? "," : "", json_escape(r.device), json_escape(r.variant), r.id, json_number(r.time_ms),
        json_number(r.speedup), json_number(r.max_rel_err), r.ok ? "true" : "false");
    if (r.expected_inexact) out += ", \"expected_inexact\": true";
    if (!r.throughput_key.empty()) out += fmt::format(", {}: {}", json_escape(r.throughput_key), json_number(r.throughput));
    for (const auto& [k, v] : r.extra) out += fmt::format(", {}: {}", json_escape(k), scalar_json(v));
    out += "}";
  }
  out += "\n  ]";
  if (!notes_.empty()) {
    out += ",\n  \"notes\": [";
    for (std::size_t i = 0; i < notes_.size(); ++i)
      out += fmt::format("{}\n    {}", i ? "," : "", json_escape(notes_[i]));
    out += "\n  ]";
  }
  for (const JsonTable& table : tables_) {
    out += fmt::format(",\n  {}: [", json_escape(table.name));
    for (std::size_t r = 0; r < table.rows.size(); ++r) {
      out += r ? ",\n    {" : "\n    {";
      for (std::size_t k = 0; k < table.rows[r].size(); ++k)
        out += fmt::format("{}{}: {}", k ? ", " : "", json_escape(table.rows[r][k].first),
                           scalar_json(table.rows[r][k].second));
      out += "}";
    }
    out += "\n  ]";
  }
  out += "\n}\n";
  return out;
}

void Results::write_json(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw InputError(fmt::format("cannot write results file '{}'", path));
  out << to_json();
  if (!out) throw InputError(fmt::format("writing results file '{}' failed", path));
}

}  // namespace llm
