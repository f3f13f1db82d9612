// One exception-safe way to spread independent items over threads (calibration fit, model dequantisation, the
// runner's row splits, perplexity's log-sum-exps).
#pragma once
#include <cstdint>
#include <functional>

namespace kvpack {

// Runs fn(i) for every i in [0, n) on up to `threads` threads, the calling thread being one of them (thread t runs
// items t, t + T, t + 2T, ... in order). If fn throws, items above the failing one are skipped, every thread is
// joined, and the exception of the lowest failing item is rethrown on the calling thread: never std::terminate, and
// which error the caller sees does not depend on thread timing. after_item(done), if given, runs on the calling
// thread after each item that thread ran, with the number of items finished by all threads (a progress bar is
// single-threaded).
void parallel_items(int64_t n, int threads, const std::function<void(int64_t)>& fn,
                    const std::function<void(int64_t)>& after_item = {});

// The machine's hardware threads (at least 1; read once).
int hardware_threads();

}  // namespace kvpack
