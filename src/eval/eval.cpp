// `kvpack eval` driver: windowed teacher-forced scoring of every format against bf16, reports (JSON, table, plot).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvpack/error.h"
#include "kvpack/eval.h"
#include "kvpack/progress.h"

namespace kvpack {
namespace {

// Window layout of one text: window w covers targets [start, start + n) of the text.
struct Window {
  int64_t start;
  int n;
};

std::vector<Window> plan_windows(const EvalText& t, const EvalConfig& cfg) {
  const int64_t T = static_cast<int64_t>(t.tokens.size());
  // Without BOS the last token has no next token to predict; with BOS every token is a target.
  const int64_t available = cfg.bos_id >= 0 ? T : T - 1;
  const int64_t positions = std::min<int64_t>(cfg.max_positions, available);
  KVPACK_CHECK(positions > 0, "text '{}' has {} tokens: too short to score any position", t.name, T);
  std::vector<Window> out;
  for (int64_t s = 0; s < positions; s += cfg.window)
    out.push_back({s, static_cast<int>(std::min<int64_t>(cfg.window, positions - s))});
  return out;
}

std::vector<FormatReport> make_reports(const std::vector<Format>& formats, const std::vector<ScoreLog>& logs,
                                       const std::vector<int64_t>& buckets, const std::vector<int64_t>& bins) {
  std::vector<FormatReport> out;
  for (size_t i = 0; i < formats.size(); ++i) {
    FormatReport r;
    r.format = formats[i];
    r.bits_per_element = format_info(formats[i]).bits_per_element;
    r.all = logs[i].stats();
    for (size_t b = 0; b + 1 < buckets.size(); ++b) r.buckets.push_back(logs[i].stats(buckets[b], buckets[b + 1]));
    for (size_t b = 0; b + 1 < bins.size(); ++b) r.plot_bins.push_back(logs[i].stats(bins[b], bins[b + 1]));
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json stats_json(const Stats& s) {
  return {{"positions", s.positions},           {"kl_mean", s.kl_mean},   {"kl_p99", s.kl_p99},
          {"kl_max", s.kl_max},                 {"top1_agreement", s.top1_agreement},
          {"words_changed", 1 - s.top1_agreement}, {"nll_mean", s.nll_mean}, {"delta_nll", s.delta_nll},
          {"ppl", s.ppl}};
}

nlohmann::json format_json(const FormatReport& f, const EvalResult& r) {
  nlohmann::json j = {{"format", format_name(f.format)}, {"bits_per_element", f.bits_per_element}};
  j.update(stats_json(f.all));
  nlohmann::json b = nlohmann::json::array();
  for (size_t i = 0; i < f.buckets.size(); ++i) {
    auto e = stats_json(f.buckets[i]);
    e["lo"] = r.bucket_edges[i];
    e["hi"] = r.bucket_edges[i + 1];
    b.push_back(std::move(e));
  }
  j["buckets"] = std::move(b);
  nlohmann::json p = nlohmann::json::array();
  for (size_t i = 0; i < f.plot_bins.size(); ++i)
    p.push_back({{"lo", r.plot_edges[i]},
                 {"hi", r.plot_edges[i + 1]},
                 {"positions", f.plot_bins[i].positions},
                 {"kl_mean", f.plot_bins[i].kl_mean}});
  j["plot_bins"] = std::move(p);
  return j;
}

std::string edge_label(int64_t e) {
  if (e >= 1024 && e % 1024 == 0) return fmt::format("{}k", e / 1024);
  return fmt::format("{}", e);
}

}  // namespace

EvalResult run_eval(WindowLogits& model, const std::vector<EvalText>& texts, const std::vector<Format>& formats_in,
                    const EvalConfig& cfg) {
  KVPACK_CHECK(cfg.window >= 2, "eval: --window must be at least 2 (got {})", cfg.window);
  KVPACK_CHECK(cfg.max_positions > 0, "eval: --max-positions must be positive (got {})", cfg.max_positions);
  KVPACK_CHECK(!texts.empty(), "eval: no texts given");
  const int V = model.vocab_size();
  KVPACK_CHECK(V > 0, "eval: model reports vocab size {}", V);

  // bf16 is the reference and always the first row; other formats keep the caller's order, duplicates dropped.
  std::vector<Format> formats{Format::bf16};
  for (Format f : formats_in)
    if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);

  std::vector<std::vector<Window>> plans;
  int64_t total_tokens = 0;
  int max_n = 0;
  for (const auto& t : texts) {
    plans.push_back(plan_windows(t, cfg));
    for (const auto& w : plans.back()) total_tokens += int64_t{w.n} * static_cast<int64_t>(formats.size()), max_n = std::max(max_n, w.n);
  }

  EvalResult result;
  result.window = cfg.window;
  int64_t longest = 0;
  for (const auto& p : plans)
    for (const auto& w : p) longest = std::max<int64_t>(longest, w.n);
  result.bucket_edges = default_bucket_edges(longest);
  result.plot_edges = plot_bin_edges(longest);

  // Reference log-probs of one window: [max_n, V] fp32 (8192 x 49152 x 4 B = 1.6 GB for SmolLM2 at full context).
  std::vector<float> ref(static_cast<size_t>(max_n) * static_cast<size_t>(V));
  std::vector<int> ref_arg(static_cast<size_t>(max_n));
  std::vector<ScoreLog> pooled(formats.size());

  Progress progress("eval", total_tokens, cfg.progress);
  int64_t done = 0;
  auto tick = [&](int n) {
    done += n;
    const double t = progress.elapsed_s();
    progress.update(done, fmt::format("{:.0f} tok/s", t > 0 ? static_cast<double>(done) / t : 0.0));
  };

  std::vector<int32_t> input;
  std::vector<int32_t> targets;
  for (size_t ti = 0; ti < texts.size(); ++ti) {
    const auto& text = texts[ti];
    std::vector<ScoreLog> logs(formats.size());
    for (const Window& w : plans[ti]) {
      input.clear();
      targets.clear();
      if (cfg.bos_id >= 0) {
        input.push_back(cfg.bos_id);
        input.insert(input.end(), text.tokens.begin() + w.start, text.tokens.begin() + w.start + w.n - 1);
        targets.assign(text.tokens.begin() + w.start, text.tokens.begin() + w.start + w.n);
      } else {
        input.assign(text.tokens.begin() + w.start, text.tokens.begin() + w.start + w.n);
        targets.assign(text.tokens.begin() + w.start + 1, text.tokens.begin() + w.start + w.n + 1);
      }
      for (int32_t t : targets)
        KVPACK_CHECK(t >= 0 && t < V, "text '{}': token id {} out of range for vocab {}", text.name, t, V);

      int seen = 0;
      model.run(Format::bf16, input, [&](int first, int n, const float* logits) {
        KVPACK_CHECK(first == seen && first + n <= w.n, "eval: logits chunk [{}, {}) out of order", first, first + n);
        for (int i = 0; i < n; ++i) {
          const size_t p = static_cast<size_t>(first + i);
          float* row = ref.data() + p * static_cast<size_t>(V);
          log_softmax(logits + static_cast<size_t>(i) * V, V, row);
          ref_arg[p] = argmax(row, V);
          PositionScore s;
          s.kl = 0;
          s.top1_match = true;
          s.nll_ref = s.nll_fmt = -static_cast<double>(row[targets[p]]);
          logs[0].add(static_cast<int>(p), s);
        }
        seen += n;
        tick(n);
      });
      KVPACK_CHECK(seen == w.n, "eval: bf16 run returned {} of {} positions", seen, w.n);

      for (size_t fi = 1; fi < formats.size(); ++fi) {
        seen = 0;
        model.run(formats[fi], input, [&](int first, int n, const float* logits) {
          KVPACK_CHECK(first == seen && first + n <= w.n, "eval: logits chunk [{}, {}) out of order", first, first + n);
          for (int i = 0; i < n; ++i) {
            const size_t p = static_cast<size_t>(first + i);
            RefPosition rp{ref.data() + p * static_cast<size_t>(V), ref_arg[p]};
            logs[fi].add(static_cast<int>(p), score_position(rp, logits + static_cast<size_t>(i) * V, V, targets[p]));
          }
          seen += n;
          tick(n);
        });
        KVPACK_CHECK(seen == w.n, "eval: {} run returned {} of {} positions", format_name(formats[fi]), seen, w.n);
      }
    }
    result.texts.push_back({text.name, make_reports(formats, logs, result.bucket_edges, result.plot_edges)});
    for (size_t fi = 0; fi < formats.size(); ++fi) pooled[fi].append(logs[fi]);
  }
  if (texts.size() > 1)
    result.texts.push_back({"pooled", make_reports(formats, pooled, result.bucket_edges, result.plot_edges)});
  progress.finish();
  result.seconds = progress.elapsed_s();
  return result;
}

nlohmann::json eval_to_json(const EvalResult& r) {
  nlohmann::json j;
  j["window"] = r.window;
  j["bucket_edges"] = r.bucket_edges;
  j["seconds"] = r.seconds;
  const TextReport& main = r.texts.back();  // pooled when there are several texts
  j["text"] = main.text;
  nlohmann::json formats = nlohmann::json::array();
  for (const auto& f : main.formats) formats.push_back(format_json(f, r));
  j["formats"] = std::move(formats);
  nlohmann::json per_text = nlohmann::json::array();
  for (const auto& t : r.texts) {
    nlohmann::json fs = nlohmann::json::array();
    for (const auto& f : t.formats) fs.push_back(format_json(f, r));
    per_text.push_back({{"text", t.text}, {"formats", std::move(fs)}});
  }
  j["per_text"] = std::move(per_text);
  return j;
}

std::string eval_to_table(const EvalResult& r) {
  std::string out;
  for (const auto& t : r.texts) {
    const int64_t n = t.formats.empty() ? 0 : t.formats[0].all.positions;
    out += fmt::format("== {} ({} positions, window {})\n", t.text, n, r.window);
    out += fmt::format("{:<6} {:>5} {:>10} {:>10} {:>8} {:>8} {:>9} {:>8}\n", "format", "bits", "kl_mean", "kl_p99",
                       "top1", "changed", "dNLL", "ppl");
    for (const auto& f : t.formats)
      out += fmt::format("{:<6} {:>5.2f} {:>10.3e} {:>10.3e} {:>8.4f} {:>8.4f} {:>+9.5f} {:>8.3f}\n",
                         format_name(f.format), f.bits_per_element, f.all.kl_mean, f.all.kl_p99, f.all.top1_agreement,
                         1 - f.all.top1_agreement, f.all.delta_nll, f.all.ppl);
    auto bucket_table = [&](const char* what, auto get, const char* spec) {
      out += fmt::format("{:<6}", what);
      for (size_t b = 0; b + 1 < r.bucket_edges.size(); ++b)
        out += fmt::format(" {:>11}", fmt::format("[{},{})", edge_label(r.bucket_edges[b]), edge_label(r.bucket_edges[b + 1])));
      out += "\n";
      for (const auto& f : t.formats) {
        out += fmt::format("{:<6}", format_name(f.format));
        for (const auto& s : f.buckets) {
          out += ' ';
          out += fmt::format(fmt::runtime(spec), get(s));
        }
        out += "\n";
      }
    };
    out += "mean KL by position bucket\n";
    bucket_table("format", [](const Stats& s) { return s.kl_mean; }, "{:>11.3e}");
    out += "top-1 agreement by position bucket\n";
    bucket_table("format", [](const Stats& s) { return s.top1_agreement; }, "{:>11.4f}");
    out += "delta NLL by position bucket\n";
    bucket_table("format", [](const Stats& s) { return s.delta_nll; }, "{:>+11.5f}");
    out += "\n";
  }
  return out;
}

void check_plotter() {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    fail("plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox); cannot write the --plot PNG");
}

void plot_eval(const EvalResult& r, const std::string& png_path) {
  KVPACK_CHECK(!r.texts.empty(), "plot: no results");
  check_plotter();
  const TextReport& t = r.texts.back();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvpack-plot-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path script = dir / "plot.gp";
  std::ofstream gp(script);
  gp << "set terminal pngcairo size 1100,700 enhanced font 'sans,11'\n";
  gp << "set output '" << png_path << "'\n";
  gp << fmt::format("set title 'KL(bf16 || format) by position, {} ({} positions, window {})'\n", t.text,
                    t.formats.empty() ? 0 : t.formats[0].all.positions, r.window);
  gp << "set logscale xy\nset grid\nset key outside right\n";
  gp << "set xlabel 'position in window (power-of-two bins, bin midpoint)'\nset ylabel 'mean KL (nats)'\n";
  std::string plots;
  int idx = 0;
  for (const auto& f : t.formats) {
    if (f.format == Format::bf16) continue;  // KL 0 by definition: nothing to draw on a log axis
    const fs::path data = dir / fmt::format("{}.dat", idx);
    std::ofstream d(data);
    for (size_t b = 0; b < f.plot_bins.size(); ++b) {
      if (f.plot_bins[b].positions == 0 || f.plot_bins[b].kl_mean <= 0) continue;
      const double mid = 0.5 * static_cast<double>(r.plot_edges[b] + r.plot_edges[b + 1]);
      d << fmt::format("{} {:.9g}\n", mid, f.plot_bins[b].kl_mean);
    }
    plots += fmt::format("{}'{}' using 1:2 with linespoints lw 2 title '{} ({:.2g} bits)'", plots.empty() ? "" : ", ",
                         data.string(), format_name(f.format), f.bits_per_element);
    ++idx;
  }
  KVPACK_CHECK(!plots.empty(), "plot: no non-bf16 format with positive KL to plot");
  gp << "plot " << plots << "\n";
  gp.close();
  const std::string cmd = fmt::format("gnuplot '{}' 2>&1", script.string());
  FILE* p = ::popen(cmd.c_str(), "r");
  KVPACK_CHECK(p != nullptr, "plot: could not start gnuplot");
  std::string msg;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) msg += buf;
  const int rc = ::pclose(p);
  std::error_code ec;
  fs::remove_all(dir, ec);
  KVPACK_CHECK(rc == 0, "plot: gnuplot failed writing {}: {}", png_path, msg);
}

}  // namespace kvpack
