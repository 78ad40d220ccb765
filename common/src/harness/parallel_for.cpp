#include "llm/parallel_for.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace llm {

void parallel_for(std::size_t count, const std::function<void(std::size_t index)>& work, unsigned max_threads) {
  if (count == 0) return;
  const unsigned wanted = max_threads != 0 ? max_threads : std::clamp(std::thread::hardware_concurrency(), 1u, 32u);
  const unsigned threads = static_cast<unsigned>(std::min<std::size_t>(count, wanted));
  std::vector<std::exception_ptr> errors(count);  // [count] what piece i threw, if it threw
  std::atomic<std::size_t> next{0};
  const auto worker = [&] {
    for (std::size_t index = next++; index < count; index = next++) {
      try {
        work(index);
      } catch (...) {
        errors[index] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones running (and this one) share the pieces
    }
  }
  worker();
  for (std::thread& thread : pool) thread.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace llm
