#pragma once
// Workshop exercises (docs/workshop.md). The maintained sources mark the lines
// a learner writes with
//
//   // BEGIN EXERCISE exNN.M
//   ...the solution...
//   // END EXERCISE exNN.M
//
// and `scripts/workshop.py make-copy` replaces each region by its stub in a
// student copy. A CPU stub is LLM_EXERCISE_TODO("exNN.M"): it throws
// ExerciseNotDone, whose message names the exercise, the file and line to
// write, and how to get a hint. The executables print it as an error and exit
// with status 1 (llm::run_main); a test that reaches it fails with the message.
// CUDA stubs are in common/cuda/exercise.cuh.
#include <stdexcept>
#include <string>
#include <utility>

namespace llm {

// A stub of a workshop exercise was reached: the exercise is not written yet.
// A logic_error, not an InputError: nothing the user passed was wrong.
class ExerciseNotDone : public std::logic_error {
 public:
  ExerciseNotDone(std::string exercise_id, const std::string& message)
      : std::logic_error(message), exercise_id_(std::move(exercise_id)) {}
  const std::string& exercise_id() const { return exercise_id_; }

 private:
  std::string exercise_id_;
};

// Throws ExerciseNotDone for `exercise_id`, stubbed at file:line.
[[noreturn]] void exercise_not_done(const char* exercise_id, const char* file, int line);

// Whether the environment variable LLM_STUBBED_EXERCISES (ids separated by
// commas) names `exercise_id`. Only the proof copy that CI builds calls it
// (scripts/workshop.py prove): there every region keeps its solution behind
// `if (exercise_stubbed(id)) { stub }`, so that one build can run each
// exercise's checks with any set of exercises stubbed.
bool exercise_stubbed(const char* exercise_id);

}  // namespace llm

// A statement: `LLM_EXERCISE_TODO("exNN.M");`. [[noreturn]], so a stubbed
// function that returns a value still compiles without a return statement.
#define LLM_EXERCISE_TODO(exercise_id) ::llm::exercise_not_done(exercise_id, __FILE__, __LINE__)
