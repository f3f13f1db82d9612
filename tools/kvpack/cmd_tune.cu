// `kvpack tune`: measure (num_splits, stages) candidates per (format, shape, batch, context) on this GPU and save
// the best as a tuning table (JSON keyed by GPU name and library version) that plan_decode() reads.
#include <fmt/format.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../../src/cuda/bench_harness.cuh"
#include "command.h"
#include "kvpack/cuda_runtime_info.h"
#include "kvpack/decode.h"
#include "kvpack/error.h"
#include "kvpack/formats.h"

namespace {

struct Opts {
  std::string formats = "bf16,fp8,int4,int4h,q4,q3.5,q3";
  std::string shapes = "32/8/128,8/1/128";
  std::string batches = "1,8,16,32,64";
  std::string contexts = "8192,32768,65536,131072";
  int page_size = 16;
  int iters = 7;
  bool every = false;  // print every candidate's time, not only the best
  std::string out = "kvpack_tuning.json";
};

std::vector<long long> numbers(const std::string& s) {
  std::vector<long long> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

int run_tune(const Opts& o) {
  KVPACK_CHECK(kvpack::cuda::device_count() > 0, "tune: no CUDA GPU found");
  namespace kb = kvpack::bench;
  kvpack::TuningTable table;
  table.gpu = kb::device_summary().name;
  table.version = kvpack::library_version();
  const auto batches = numbers(o.batches);
  const auto contexts = numbers(o.contexts);
  const int max_b = static_cast<int>(*std::max_element(batches.begin(), batches.end()));
  const long long max_c = *std::max_element(contexts.begin(), contexts.end());
  std::stringstream ss(o.shapes);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int qo = 0, kv = 0, d = 0;
    KVPACK_CHECK(std::sscanf(item.c_str(), "%d/%d/%d", &qo, &kv, &d) == 3, "--shapes: '{}' is not QO/KV/HEAD_DIM", item);
    for (kvpack::Format f : kvpack::parse_format_list(o.formats)) {
      if (!kvpack::paged_format_supported(f)) continue;
      kvpack::DecodeShape ds{f, qo, kv, d, o.page_size};
      kb::DecodeBench bench(ds, max_b, max_c, 7);
      for (long long b : batches)
        for (long long c : contexts) {
          const int max_chunks = static_cast<int>((c + kvpack::kChunkTokens - 1) / kvpack::kChunkTokens);
          kvpack::TuneEntry best;
          best.median_us = 1e30;
          // Regular kernel: CTAs per (sequence, kv head) x pipeline depth (256: since v21's two-level merge, a 128k
          // sequence at batch 1 gains from two CTAs per SM). Lean kernel (q4 / q3.5 / q3): leaf mode (one CTA per chunk, the
          // split count not read), then warp mode with warps per (sequence, kv head) in multiples of its 4 warps per
          // CTA up to one per chunk; its ring depth is fixed (stages is not read).
          const bool lean = std::string(kvpack::decode_kernel_name(f)) == "lean";
          const std::vector<int> regular_splits{1, 2, 4, 8, 16, 32, 64, 128, 256};
          const std::vector<int> lean_splits{4, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256};
          const std::vector<int> regular_stages{2, 3, 4}, lean_stages{3};
          auto measure = [&](int splits, int stages, int leaf) {
            kb::DecodeTiming t;
            try {
              t = bench.time_decode(static_cast<int>(b), c, splits, stages, nullptr, o.iters, false, false, leaf);
            } catch (const kvpack::Error&) {
              return;  // e.g. not enough shared memory for this depth
            }
            if (o.every)
              fmt::print("  {:<6} {}q/{}kv/{} b={} ctx={}: {} {:.1f} us\n", kvpack::format_name(f), qo, kv, d, b, c,
                         leaf == 1 ? std::string("leaf mode") : fmt::format("splits {} stages {}", splits, stages),
                         t.median_us);
            if (t.median_us < best.median_us) {
              best = kvpack::TuneEntry{f,      qo,     kv,     d, o.page_size, static_cast<int>(b), c,
                                       splits, stages, t.median_us, kvpack::decode_kernel_name(f), leaf};
            }
          };
          if (lean) measure(lean_splits.front(), lean_stages.front(), 1);
          for (int splits : lean ? lean_splits : regular_splits) {
            if (splits > (lean ? kvpack::lean_default_splits(max_chunks) : max_chunks)) break;  // one per chunk
            for (int stages : lean ? lean_stages : regular_stages) measure(splits, stages, lean ? 0 : -1);
          }
          fmt::print("{:<6} {}q/{}kv/{} b={} ctx={}: {} kernel, {} {:.1f} us\n", kvpack::format_name(f), qo, kv, d, b,
                     c, best.kernel,
                     best.leaf == 1 ? std::string("leaf mode")
                                    : fmt::format("splits {} stages {}", best.num_splits, best.stages),
                     best.median_us);
          table.entries.push_back(best);
        }
    }
  }
  table.save(o.out);
  fmt::print("wrote {} entries to {}\n", table.entries.size(), o.out);
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  app->add_option("--formats", o->formats, "Formats (comma list or 'all')");
  app->add_option("--shapes", o->shapes, "Shapes QO/KV/HEAD_DIM, comma separated");
  app->add_option("--batch", o->batches, "Batch buckets, comma separated");
  app->add_option("--context", o->contexts, "Context buckets (tokens), comma separated");
  app->add_option("--page-size", o->page_size, "Tokens per page");
  app->add_option("--iters", o->iters, "Timed samples per candidate");
  app->add_flag("--every", o->every, "Print every candidate's time, not only each bucket's best");
  app->add_option("-o,--out", o->out, "Output JSON");
  return [o] { return run_tune(*o); };
}
const bool registered = kvpack::cli::register_command("tune", "Build the decode tuning table on this GPU", setup);

}  // namespace
