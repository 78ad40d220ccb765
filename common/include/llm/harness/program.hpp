#pragma once
// Running another program and capturing what it prints: for the steps that
// time an outside program beside their own code (step 06's llama-bench,
// step 02's PyTorch SDPA).
#include <string>
#include <vector>

namespace llm {

// What a finished program printed, and how it ended.
struct ProgramOutput {
  std::string out;           // stdout
  std::string err;           // stderr
  std::string how_it_ended;  // empty after exit status 0, else "exit status 3", "killed by signal 9"
};

// Runs `argv` (argv[0] a path to an executable, or a bare name looked up on
// PATH; no shell, so a file name with spaces or quotes needs no quoting) with
// stdout and stderr captured apart, and waits for it. Throws llm::InputError
// when it cannot start.
ProgramOutput run_program(const std::vector<std::string>& argv);

// argv as one line, its words joined by spaces (for messages and records;
// nothing is quoted, since no shell ever reads it).
std::string command_line(const std::vector<std::string>& argv);

// The last `lines` lines of `text` (a log's end says why a program failed).
std::string last_lines(const std::string& text, int lines);

}  // namespace llm
