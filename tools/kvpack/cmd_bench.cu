// `kvpack bench`: decode attention and write-path timings on the GPU, JSON rows + a table.
// Every row of one run shares run_id, the GPU name and the streaming read bandwidth measured in the same run.
#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "../../src/cuda/bench_harness.cuh"
#include "command.h"
#include "kvpack/cuda_runtime_info.h"
#include "kvpack/decode.h"
#include "kvpack/error.h"
#include "kvpack/formats.h"

namespace {

struct Shape {
  int qo, kv, d;
};

std::vector<Shape> parse_shapes(const std::string& s) {
  std::vector<Shape> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Shape sh{};
    if (std::sscanf(item.c_str(), "%d/%d/%d", &sh.qo, &sh.kv, &sh.d) != 3)
      kvpack::fail(fmt::runtime("--shapes: '{}' is not QO/KV/HEAD_DIM (e.g. 32/8/128)"), item);
    out.push_back(sh);
  }
  return out;
}

template <class T>
std::vector<T> parse_list(const std::string& s, const char* what) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      long long v = std::stoll(item, &pos);
      char suf = pos < item.size() ? item[pos] : 0;
      if (suf == 'k' || suf == 'K') v *= 1024;
      out.push_back(static_cast<T>(v));
    } catch (const std::exception&) {
      kvpack::fail(fmt::runtime("{}: '{}' is not a number"), what, item);
    }
  }
  return out;
}

std::string make_run_id() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", std::gmtime(&t));
  return buf;
}

struct Opts {
  std::string formats = "bf16,fp8,int4,int4h,q4,q3.5,q3";
  std::string shapes = "32/8/128,8/1/128";
  std::string batches = "1,8,16,32,64";
  std::string contexts = "8k,32k,64k,128k";
  int page_size = 16;
  int iters = 20;
  int splits = 0, stages = 0;
  std::string table_path;
  std::string json_path;
  double probe_gb = 4.0;
  bool eager = false;
  bool step = false;
  int leaf = -1;
  std::string pages = "shuffled";
};

int run_bench(const Opts& o) {
  KVPACK_CHECK(kvpack::cuda::device_count() > 0, "bench: no CUDA GPU found");
  namespace kb = kvpack::bench;
  const auto dev = kb::device_summary();
  const std::string run_id = make_run_id();
  std::unique_ptr<kvpack::TuningTable> table;
  const bool fallback = o.table_path == "fallback";
  if (!o.table_path.empty() && !fallback)
    table = std::make_unique<kvpack::TuningTable>(kvpack::TuningTable::load(o.table_path));
  const double read_bw = kb::measure_read_bandwidth_tbs(size_t(o.probe_gb * 1e9), 20);
  fmt::print("gpu {} ({} SMs, L2 {} MB), streaming read {:.3f} TB/s, run {}\n", dev.name, dev.sms,
             dev.l2_bytes >> 20, read_bw, run_id);
  auto formats = kvpack::parse_format_list(o.formats);
  auto shapes = parse_shapes(o.shapes);
  auto batches = parse_list<int>(o.batches, "--batch");
  auto contexts = parse_list<int64_t>(o.contexts, "--context");
  const int max_b = *std::max_element(batches.begin(), batches.end());
  const int64_t max_c = *std::max_element(contexts.begin(), contexts.end());

  nlohmann::json rows = nlohmann::json::array();
  auto base_row = [&](kvpack::Format f, const Shape& sh) {
    return nlohmann::json{{"format", kvpack::format_name(f)}, {"num_qo_heads", sh.qo}, {"num_kv_heads", sh.kv},
                          {"head_dim", sh.d}, {"page_size", o.page_size}, {"gpu", dev.name},
                          {"read_bw_tbs", read_bw}, {"run_id", run_id}, {"impl", "kvpack"}, {"page_order", o.pages}};
  };
  // (shape, batch, context) -> fp8 median, for the speedups
  std::map<std::tuple<int, int, int, int, int64_t>, double> fp8_us;
  std::map<std::tuple<int, int, int, int, int64_t>, double> fp8_step_us;  // the same for --step rows
  for (const auto& sh : shapes) {
    for (kvpack::Format f : formats) {
      if (!kvpack::paged_format_supported(f)) {
        fmt::print("{:<6} {}q/{}kv/{}: not supported by the paged kernels yet, skipped\n", kvpack::format_name(f), sh.qo,
                   sh.kv, sh.d);
        continue;
      }
      kvpack::DecodeShape ds{f, sh.qo, sh.kv, sh.d, o.page_size};
      kb::DecodeBench bench(ds, max_b, max_c, 42, o.pages == "shuffled");
      fmt::print("{:<6} {}q/{}kv/{} pool filled in {:.1f} ms\n", kvpack::format_name(f), sh.qo, sh.kv, sh.d,
                 bench.fill_ms());
      for (int b : batches) {
        for (int64_t c : contexts) {
          const int leaf = std::string(kvpack::decode_kernel_name(f)) == "lean" ? o.leaf : -1;
          auto t = bench.time_decode(b, c, o.splits, o.stages, table.get(), o.iters, fallback, o.eager, leaf);
          auto row = base_row(f, sh);
          row.update({{"kind", "decode"}, {"batch", b}, {"context", c}, {"median_us", t.median_us},
                      {"min_us", t.min_us}, {"bandwidth_tbs", t.bandwidth_tbs}, {"bytes", t.bytes},
                      {"frac_read_bw", t.bandwidth_tbs / read_bw}, {"num_splits", t.num_splits},
                      {"stages", t.stages}, {"plan", t.plan_source}, {"rotations", t.rotations},
                      {"kernel", t.lean ? "lean" : kvpack::decode_kernel_name(f)}, {"timing", t.timing}});
          if (t.leaf >= 0) row["leaf"] = t.leaf == 1;
          // The lean launcher's choices (bench/NOTES.md v48: mixed grid, preparation split; v50-v52: kernel instance).
          const char* instance = !t.lean                  ? ""
                                 : t.lean->instance == 1 ? "leaf-only"
                                 : t.lean->instance == 2 ? "warp-only"
                                 : t.lean->instance == 3 ? "group"
                                                         : "general";
          if (const auto& li = t.lean)
            row.update({{"lean_mode", li->leaf == 1 ? "leaf" : li->mix > 0 ? "mixed" : "warp"},
                        {"lean_mix", li->mix}, {"prep_ctas", li->prep_ctas}, {"merge_slices", li->merge_slices},
                        {"lean_warps", li->splits}, {"lean_ctas_per_sm", li->ctas_per_sm}, {"lean_instance", instance}});
          if (f == kvpack::Format::fp8) fp8_us[{sh.qo, sh.kv, sh.d, b, c}] = t.median_us;
          rows.push_back(row);
          if (o.step) {
            // The whole decode step of one layer (write of one token per sequence, then attention) in one graph.
            auto st = bench.time_decode(b, c, o.splits, o.stages, table.get(), o.iters, fallback, o.eager, leaf, true);
            auto srow = base_row(f, sh);
            srow.update({{"kind", "step"}, {"batch", b}, {"context", c}, {"median_us", st.median_us},
                         {"min_us", st.min_us}, {"attention_us", t.median_us}, {"num_tokens", b},
                         {"bandwidth_tbs", st.bandwidth_tbs}, {"bytes", st.bytes},  // the cache's bytes / step time
                         {"timing", st.timing}, {"step_api", "decode_step"},
                         {"step_overlap", kvpack::decode_step_overlaps(f)},
                         {"write_kernel", kvpack::write_kernel_name(f, sh.kv, sh.d, b)}});
            if (f == kvpack::Format::fp8) fp8_step_us[{sh.qo, sh.kv, sh.d, b, c}] = st.median_us;
            rows.push_back(srow);
            fmt::print("{:<6} {:>2}q/{}kv/{:<3} b={:<3} ctx={:<6} {:>10.1f} us step (write {} tokens + attention)\n",
                       kvpack::format_name(f), sh.qo, sh.kv, sh.d, b, c, st.median_us, b);
          }
          fmt::print("{:<6} {:>2}q/{}kv/{:<3} b={:<3} ctx={:<6} {:>10.1f} us {:>6.3f} TB/s ({:>5.1f}% of read) {} {}\n",
                     kvpack::format_name(f), sh.qo, sh.kv, sh.d, b, c, t.median_us, t.bandwidth_tbs,
                     100 * t.bandwidth_tbs / read_bw, t.timing,
                     !t.lean ? fmt::format("splits {} stages {}", t.num_splits, t.stages)
                     : t.lean->leaf == 1
                         ? fmt::format("lean {}, leaf mode, prep {} merge {}", instance, t.lean->prep_ctas,
                                       t.lean->merge_slices)
                         : fmt::format("lean {}, warps {}{}, prep {} merge {}", instance, t.lean->splits,
                                       t.lean->mix ? fmt::format(" mixed {}", t.lean->mix) : "", t.lean->prep_ctas,
                                       t.lean->merge_slices));
        }
        // Write path: one decode step (one token per sequence) and a prefill of 64k tokens, for one layer.
        for (int n : {b, 65536}) {
          if (n == 65536 && b != batches.front()) continue;
          auto w = bench.time_write(n, o.iters);
          auto row = base_row(f, sh);
          row.update({{"kind", "write"}, {"batch", b}, {"num_tokens", n}, {"context", 0}, {"median_us", w.median_us},
                      {"bandwidth_tbs", w.bandwidth_tbs}, {"bytes", w.bytes}, {"frac_read_bw", w.bandwidth_tbs / read_bw},
                      {"write_kernel", kvpack::write_kernel_name(f, sh.kv, sh.d, n)}});
          rows.push_back(row);
          fmt::print("{:<6} write {:>6} tokens {:>10.2f} us {:>6.3f} TB/s\n", kvpack::format_name(f), n, w.median_us,
                     w.bandwidth_tbs);
        }
      }
    }
  }
  for (auto& r : rows) {
    if (r["kind"] != "decode" && r["kind"] != "step") continue;
    const auto& ref = r["kind"] == "decode" ? fp8_us : fp8_step_us;
    auto it = ref.find({r["num_qo_heads"].get<int>(), r["num_kv_heads"].get<int>(), r["head_dim"].get<int>(),
                           r["batch"].get<int>(), r["context"].get<int64_t>()});
    if (it != ref.end()) r["speedup_vs_fp8"] = it->second / r["median_us"].get<double>();
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    KVPACK_CHECK(f.good(), "bench: cannot write {}", o.json_path);
    f << rows.dump(1) << "\n";
    fmt::print("wrote {} rows to {}\n", rows.size(), o.json_path);
  }
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  app->add_option("--formats", o->formats, "Formats (comma list or 'all')");
  app->add_option("--shapes", o->shapes, "Shapes QO/KV/HEAD_DIM, comma separated");
  app->add_option("--batch", o->batches, "Batch sizes, comma separated");
  app->add_option("--context", o->contexts, "Context lengths, comma separated (8k = 8192)");
  app->add_option("--page-size", o->page_size, "Tokens per page (16, 32, 64, 128)");
  app->add_option("--iters", o->iters, "Timed samples per configuration (median reported)");
  app->add_option("--splits", o->splits, "Force num_splits (0 = plan)");
  app->add_option("--stages", o->stages, "Force pipeline stages (with --splits)");
  app->add_option("--table", o->table_path,
                  "Tuning table JSON from `kvpack tune` (default: the running GPU's built-in table, if any); "
                  "'fallback': the fallback plans");
  app->add_option("--json", o->json_path, "Write JSON rows here");
  app->add_option("--probe-gb", o->probe_gb, "Size of the read-bandwidth probe buffer (GB)");
  app->add_option("--leaf", o->leaf,
                  "q4 / q3.5 / q3 (lean kernel): 1 = leaf mode, 0 = warp mode, -1 = the plan's choice (tuned entry or rule)")
      ->check(CLI::Range(-1, 1));
  app->add_option("--pages", o->pages,
                  "Page order of every sequence: 'shuffled' (a serving pool's, default) or 'contiguous' (each sequence's "
                  "pages in pool order; rows' \"page_order\")")
      ->check(CLI::IsMember({"shuffled", "contiguous"}));
  app->add_flag("--step", o->step,
                "Also time each cell's whole decode step of one layer: the write of one new token per sequence, then "
                "attention, in one graph (rows with \"kind\": \"step\" and their \"speedup_vs_fp8\" over fp8's step)");
  app->add_flag("--eager", o->eager,
                "Time eager stream launches instead of CUDA-graph replays of the launches (rows' \"timing\")");
  return [o] { return run_bench(*o); };
}
const bool registered = kvpack::cli::register_command("bench", "Time decode attention and the write path on the GPU", setup);

}  // namespace
