#pragma once
// Progress of a long run on stderr, one line per part as it starts:
//   step02_flash_attention: part 2 of 3: decode table (one query, 8 heads, head_dim 64)
// stdout keeps the tables (and their order) alone, so a run's output piped to
// a file or a test reads the same with or without these lines.
#include <string>

namespace llm {

class RunProgress {
 public:
  // `step` prefixes every line; `parts` is how many start() calls the run makes.
  RunProgress(std::string step, int parts);

  // Prints "<step>: part n of m: <what>" on stderr and counts the part.
  void start(const std::string& what);

  int parts_started() const { return started_; }

 private:
  std::string step_;
  int parts_;
  int started_ = 0;
};

}  // namespace llm
