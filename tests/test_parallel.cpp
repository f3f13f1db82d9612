// parallel_items: every item once, errors rethrown on the caller (never std::terminate), the lowest failing item's
// error whatever the thread timing, progress on the calling thread only.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvpack/error.h"
#include "kvpack/parallel.h"

using namespace kvpack;

TEST(ParallelItems, RunsEveryItemOnce) {
  for (int threads : {0, 1, 3, 8, 64}) {
    std::vector<std::atomic<int>> hits(1000);
    parallel_items(1000, threads, [&](int64_t i) { ++hits[static_cast<size_t>(i)]; });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << threads << " threads";
  }
  parallel_items(0, 4, [](int64_t) { FAIL() << "no items"; });
  parallel_items(-3, 4, [](int64_t) { FAIL() << "no items"; });
}

TEST(ParallelItems, RethrowsTheLowestFailingItemsError) {
  // Items 37 and 500 fail; item 37 is slow, so 500's error usually comes first in time. The caller must see 37's.
  for (int rep = 0; rep < 20; ++rep) {
    try {
      parallel_items(1000, 4, [&](int64_t i) {
        if (i == 37) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          fail("item {} failed", i);
        }
        if (i == 500) throw std::runtime_error("item 500 failed");
      });
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "item 37 failed");
    }
  }
  // On one thread the items after a failure never run.
  int ran = 0;
  EXPECT_THROW(parallel_items(100, 1, [&](int64_t i) {
    ++ran;
    if (i == 9) fail("item 9");
  }), Error);
  EXPECT_EQ(ran, 10);
}

TEST(ParallelItems, ProgressRunsOnTheCallingThreadWithGrowingCounts) {
  const auto caller = std::this_thread::get_id();
  int64_t last = 0, calls = 0;
  parallel_items(200, 4, [](int64_t) { std::this_thread::sleep_for(std::chrono::microseconds(50)); },
                 [&](int64_t done) {
                   EXPECT_EQ(std::this_thread::get_id(), caller);
                   EXPECT_GT(done, last);
                   EXPECT_LE(done, 200);
                   last = done;
                   ++calls;
                 });
  EXPECT_GT(calls, 0);
  // A throwing progress callback stops the work and reaches the caller too.
  EXPECT_THROW(parallel_items(200, 4, [](int64_t) {}, [](int64_t) { throw std::runtime_error("bar"); }),
               std::runtime_error);
}
