#pragma once
// Errors the course reports to the user. Every one carries a message that says
// what was wrong and, where it helps, what to do; executables print it and exit
// with a non-zero status instead of crashing or producing silent garbage.
#include <stdexcept>
#include <string>

namespace llm {

// Bad input: a malformed model or tokenizer file, a token id out of range, a
// prompt longer than the context, an unknown flag value.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The KV cache has no room for the positions a forward pass asked to write.
class KvCacheFullError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A device (CUDA) call failed or no device is present when one was required.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace llm
