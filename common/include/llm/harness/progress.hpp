#pragma once
// Progress of a long run on stderr, one line per part as it starts, with the
// seconds since the run's progress began (so a run's log says where its time
// went: the gap between two lines is the part between them):
//   step02_flash_attention: part 2 of 3: decode table (one query, 8 heads, head_dim 64) (at 41.7 s)
// stdout keeps the tables (and their order) alone, so a run's output piped to
// a file or a test reads the same with or without these lines.
#include <chrono>
#include <string>

namespace llm {

class RunProgress {
 public:
  // `step` prefixes every line; `parts` is how many start() calls the run
  // makes. The clock starts here.
  RunProgress(std::string step, int parts);

  // Prints "<step>: part n of m: <what> (at S s)" on stderr and counts the part.
  void start(const std::string& what);

  // Prints "<step>:   <what> (at S s)" on stderr: a stage inside the current
  // part, for a part long enough that its log should say which stage took
  // the time. Counts nothing.
  void note(const std::string& what) const;

  int parts_started() const { return started_; }

 private:
  double seconds_since_begun() const;

  std::string step_;
  int parts_;
  int started_ = 0;
  std::chrono::steady_clock::time_point begun_ = std::chrono::steady_clock::now();
};

}  // namespace llm
