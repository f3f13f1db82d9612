#include "kvpack/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

namespace kvpack {

int hardware_threads() {
  static const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}

void parallel_items(int64_t n, int threads, const std::function<void(int64_t)>& fn,
                    const std::function<void(int64_t)>& after_item) {
  if (n <= 0) return;
  const int64_t nt = std::min<int64_t>(std::max(threads, 1), n);
  std::atomic<int64_t> done{0};
  // The lowest failing item so far: items above it are skipped, items below it still run, so the lowest failing
  // item of all always runs and is the one reported.
  std::atomic<int64_t> failed_at{std::numeric_limits<int64_t>::max()};
  std::mutex mu;
  std::exception_ptr error;
  // Thread t runs items t, t + nt, t + 2 nt, ... (a fixed assignment: a range split gives each thread its range even
  // when the helpers start late).
  auto work = [&](int64_t t) {
    for (int64_t i = t; i < n && i < failed_at.load(std::memory_order_relaxed); i += nt) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < failed_at) failed_at = i, error = std::current_exception();
        return;
      }
      const int64_t d = ++done;
      if (t == 0 && after_item) after_item(d);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(nt - 1));
  int64_t started = 1;
  try {
    for (; started < nt; ++started) pool.emplace_back(work, started);
  } catch (...) {  // a thread that cannot start: the caller runs its items below
  }
  try {
    work(0);
    for (int64_t t = started; t < nt; ++t) work(t);
  } catch (...) {  // after_item threw: stop the others, then report it
    failed_at = -1;
    for (auto& t : pool) t.join();
    throw;
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace kvpack
