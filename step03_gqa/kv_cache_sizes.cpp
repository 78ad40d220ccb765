#include "step03_gqa/kv_cache_sizes.hpp"

#include <cmath>

namespace step03 {

long long sequences_that_fit(double budget_bytes, double bytes_per_sequence) {
  if (bytes_per_sequence <= 0.0) return 0;
  return static_cast<long long>(std::floor(budget_bytes / bytes_per_sequence));
}

}  // namespace step03
