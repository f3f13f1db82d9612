// Benchmark harness shared by `kvpack bench` and `kvpack tune` (not public API).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "decode_internal.cuh"
#include "kvpack/decode.h"

namespace kvpack::bench {

struct DeviceSummary {
  std::string name;
  int sms = 0;
  size_t l2_bytes = 0;
  size_t mem_bytes = 0;
};
DeviceSummary device_summary();

// Streaming read bandwidth of the GPU (TB/s, bytes read / time), 16-byte loads, median of `iters` over a buffer of
// `bytes` (several times L2). The ceiling every kernel's bandwidth is compared with, measured in the same run.
double measure_read_bandwidth_tbs(size_t bytes, int iters);

struct DecodeTiming {
  double median_us = 0, min_us = 0;
  double bytes = 0;          // bytes the format must read: codes + metadata of every token, K and V
  double bandwidth_tbs = 0;  // bytes / median time
  int num_splits = 0, stages = 0;
  int leaf = -1;             // the plan's DecodePlan::leaf
  // The lean path's launch as the launcher chose it (lean_last_launch: mode, mixed grid, preparation, merge, warps,
  // CTAs per SM); empty when the plan ran the regular kernel.
  std::optional<LeanLaunchInfo> lean;
  int rotations = 0;         // distinct caches rotated over so L2 cannot serve them
  std::string plan_source;
  std::string timing;        // "graph": replays of a CUDA graph of the rotation's launches; "eager": stream launches
};

struct WriteTiming {
  double median_us = 0;
  double bytes = 0;  // bf16 read + codes/metadata written
  double bandwidth_tbs = 0;
};

// One page pool of (format, shape) big enough for max_batch x max_context tokens per K and V, filled through the
// write path with random bf16 values; pages are assigned in a shuffled order (a serving pool's), or in pool order
// when !shuffle_pages (each sequence's pages contiguous: a measurement of what page scatter costs).
class DecodeBench {
 public:
  DecodeBench(const DecodeShape& shape, int max_batch, int64_t max_context, uint64_t seed, bool shuffle_pages = true);
  ~DecodeBench();
  DecodeBench(const DecodeBench&) = delete;
  DecodeBench& operator=(const DecodeBench&) = delete;
  // splits/stages = 0: plan_decode() (the table when given and matching, else the built-in one, else the fallback),
  // or plan_decode_fallback() when `fallback`. Timed as CUDA-graph replays of the rotation's launches (as a server
  // replays its decode step, and as bench/flashinfer/fi_bench.py times FlashInfer), or as eager launches when `eager`
  // or when the capture fails (DecodeTiming::timing says which).
  // leaf >= 0 sets the plan's lean-kernel mode (DecodePlan::leaf; q4 / q3.5 / q3 only).
  // with_write: time a whole decode step of one layer instead, as a server runs it: the write of one new token per
  // sequence (fresh bf16 K/V into each sequence's last position, write_kv) and then attention over the context,
  // both in the same graph (or eager stream), so the write's launch and tail overlap as they would in serving.
  DecodeTiming time_decode(int batch, int64_t context, int splits, int stages, const TuningTable* table, int iters,
                           bool fallback = false, bool eager = false, int leaf = -1, bool with_write = false);
  WriteTiming time_write(int num_tokens, int iters);
  double fill_ms() const { return fill_ms_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double fill_ms_ = 0;
};

}  // namespace kvpack::bench
