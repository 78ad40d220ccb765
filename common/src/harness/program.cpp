#include "llm/harness/program.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "llm/errors.hpp"

extern char** environ;

namespace llm {

namespace {

// Both ends of a pipe, closed when the object goes.
struct Pipe {
  std::array<int, 2> fds = {-1, -1};  // [read end, write end]
  Pipe() {
    if (::pipe(fds.data()) != 0) throw InputError(fmt::format("cannot make a pipe: {}", std::strerror(errno)));
  }
  ~Pipe() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  void close_end(int end) {
    ::close(fds[end]);
    fds[end] = -1;
  }
};

}  // namespace

ProgramOutput run_program(const std::vector<std::string>& argv) {
  Pipe out_pipe, err_pipe;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe.fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe.fds[1], STDERR_FILENO);
  for (const Pipe* pipe : {&out_pipe, &err_pipe})
    for (int fd : pipe->fds) posix_spawn_file_actions_addclose(&actions, fd);
  std::vector<char*> args;  // [argv.size() + 1], null-terminated
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  // A bare name ("python3") is looked up on PATH, as a shell would; a path is run as it is.
  const bool bare_name = argv[0].find('/') == std::string::npos;
  const int spawn_error = bare_name ? posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ)
                                    : posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error != 0)
    throw InputError(fmt::format("cannot run {}: {}", argv[0], std::strerror(spawn_error)));
  out_pipe.close_end(1);
  err_pipe.close_end(1);

  // Both pipes drained together: a program that fills one while we block on
  // the other would wait forever.
  ProgramOutput output;
  std::array<pollfd, 2> open = {pollfd{out_pipe.fds[0], POLLIN, 0}, pollfd{err_pipe.fds[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks = {&output.out, &output.err};
  while (open[0].fd >= 0 || open[1].fd >= 0) {
    if (::poll(open.data(), open.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (std::size_t i = 0; i < open.size(); ++i) {
      if (open[i].fd < 0 || open[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(open[i].fd, buffer, sizeof(buffer));
      if (n > 0)
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR)
        open[i].fd = -1;  // end of file (poll skips a negative fd)
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    output.how_it_ended = fmt::format("exit status {}", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    output.how_it_ended = fmt::format("killed by signal {}", WTERMSIG(status));
  return output;
}

std::string command_line(const std::vector<std::string>& argv) { return fmt::format("{}", fmt::join(argv, " ")); }

std::string last_lines(const std::string& text, int lines) {
  std::size_t start = text.size();
  if (start > 0 && text[start - 1] == '\n') --start;  // a final newline ends the last line, it starts none
  for (int seen = 0; seen < lines && start > 0; ++seen) {
    const std::size_t newline = text.rfind('\n', start - 1);
    start = newline == std::string::npos ? 0 : newline;
  }
  return text.substr(start == 0 ? 0 : start + 1);
}

}  // namespace llm
