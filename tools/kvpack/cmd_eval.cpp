// `kvpack eval`: teacher-forced quality of every KV format against the bf16 cache on held-out texts (see eval.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "command.h"
#include "kvpack/calibration.h"
#include "kvpack/codec.h"
#include "kvpack/error.h"
#include "kvpack/eval.h"
#include "kvpack/llama.h"
#include "kvpack/tokenizer.h"

namespace {

struct Opts {
  std::string model, calib, formats = "all", plot;
  std::vector<std::string> texts;
  int window = 0;
  int64_t max_positions = 32768;
  std::string json_path;
  CLI::Option* json_opt = nullptr;
  bool quiet = false;
  std::string quantize = "kv";
  std::string v_format;  // empty: each row's format on V too
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPACK_CHECK(f.good(), "{}: cannot open text file", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Tokenizes only as much of the text as the positions need (BPE over 400 KB costs seconds); falls back to the
// whole text when the prefix is short of tokens.
std::vector<int32_t> tokenize_prefix(const kvpack::Tokenizer& tok, const std::string& text, int64_t need) {
  size_t chars = static_cast<size_t>(std::max<int64_t>(need, 1)) * 8;
  for (;;) {
    const bool whole = chars >= text.size();
    size_t cut = std::min(chars, text.size());
    if (!whole) {  // end at a paragraph/line break so no word is split
      const size_t nl = text.rfind('\n', cut);
      if (nl != std::string::npos && nl > cut / 2) cut = nl;
    }
    auto ids = tok.encode(std::string_view(text).substr(0, cut), false, false);
    if (whole || static_cast<int64_t>(ids.size()) >= need) return ids;
    chars *= 2;
  }
}

int run(const Opts& o) {
  if (!o.plot.empty()) kvpack::check_plotter();
  const auto kinds = kvpack::parse_quantized_kinds(o.quantize);
  const auto model = kvpack::LlamaModel::load(o.model);
  const auto& cfg = model.config();
  const auto formats = kvpack::parse_format_list(o.formats);

  std::optional<kvpack::Calibration> calib;
  if (!o.calib.empty()) calib = kvpack::Calibration::load(o.calib, cfg);
  std::optional<kvpack::Format> v_format;
  if (!o.v_format.empty()) {
    v_format = kvpack::parse_format(o.v_format);
    KVPACK_CHECK(v_format.has_value(), "--v-format: '{}' is not a format", o.v_format);
  }
  // Fail before hours of compute, not after the first window: every codec must be constructible.
  auto need = formats;
  if (v_format) need.push_back(*v_format);
  for (auto f : need) {
    KVPACK_CHECK(!kvpack::format_info(f).calibrated || calib, "format {} needs a calibration file (--calib FILE.kvcal)",
                 kvpack::format_name(f));
    (void)kvpack::make_codec(f, cfg, calib ? &*calib : nullptr);
  }

  kvpack::EvalConfig ec;
  const int64_t ctx = cfg.max_context > 0 ? std::min<int64_t>(cfg.max_context, 8192) : 8192;
  ec.window = o.window > 0 ? o.window : static_cast<int>(ctx);
  KVPACK_CHECK(cfg.max_context <= 0 || ec.window <= cfg.max_context, "--window {} exceeds the model's context {}",
               ec.window, cfg.max_context);
  ec.max_positions = o.max_positions;
  ec.bos_id = model.add_bos() ? model.bos_id() : -1;
  ec.progress = !o.quiet;

  std::vector<kvpack::EvalText> texts;
  for (const auto& path : o.texts) {
    kvpack::EvalText t;
    t.name = std::filesystem::path(path).stem().string();
    t.tokens = tokenize_prefix(model.tokenizer(), read_file(path), o.max_positions + 1);
    KVPACK_CHECK(t.tokens.size() >= 2, "{}: the text tokenizes to {} tokens; nothing to score", path, t.tokens.size());
    if (!o.quiet && static_cast<int64_t>(t.tokens.size()) < o.max_positions + 1)
      fmt::print(stderr, "note: {} has only {} tokens; scoring all of them\n", path, t.tokens.size());
    texts.push_back(std::move(t));
  }

  auto wl = kvpack::make_model_window_logits(model, calib ? &*calib : nullptr, kinds, v_format);
  auto result = kvpack::run_eval(*wl, texts, formats, ec);
  // --v-format: a row's cache is half its format (K) and half the V format: report the mean of the two.
  if (v_format)
    for (auto& t : result.texts)
      for (auto& f : t.formats)
        if (f.format != kvpack::Format::bf16)
          f.bits_per_element = 0.5 * (kvpack::format_info(f.format).bits_per_element +
                                      kvpack::format_info(*v_format).bits_per_element);

  const bool json_stdout = o.json_opt->count() > 0 && (o.json_path.empty() || o.json_path == "-");
  auto j = kvpack::eval_to_json(result);
  j["model"] = o.model;
  j["calib"] = o.calib;
  j["quantized"] = kvpack::quantized_kinds_name(kinds);
  if (v_format) j["v_format"] = kvpack::format_name(*v_format);
  j["texts"] = o.texts;
  if (o.json_opt->count() > 0) {
    if (json_stdout) {
      fmt::print("{}\n", j.dump(2));
    } else {
      std::ofstream f(o.json_path);
      KVPACK_CHECK(f.good(), "{}: cannot write JSON", o.json_path);
      f << j.dump(2) << "\n";
    }
  }
  // The table goes to stdout unless JSON took it.
  if (v_format)
    fmt::print(json_stdout ? stderr : stdout, "V stored in {} for every row but bf16 (--v-format)\n",
               kvpack::format_name(*v_format));
  fmt::print(json_stdout ? stderr : stdout, "{}", kvpack::eval_to_table(result));
  fmt::print(json_stdout ? stderr : stdout, "{:.1f} s\n", result.seconds);
  if (!o.plot.empty()) kvpack::plot_eval(result, o.plot);
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  app->add_option("--model", o->model, "Model (.gguf or HF directory)")->required();
  app->add_option("--calib", o->calib, "Calibration file FILE.kvcal (needed by fp8 and the q formats)");
  app->add_option("--text", o->texts, "Held-out text file(s); several allowed (reported per text and pooled)")
      ->required();
  app->add_option("--formats", o->formats, "Comma list of formats, or 'all' (bf16 is always the reference row)");
  app->add_option("--max-positions", o->max_positions, "Positions scored per text")
      ->check(kvpack::cli::at_least<int64_t>(1));
  app->add_option("--window", o->window, "Tokens per window (default: the model's context, at most 8192)");
  o->json_opt = app->add_option("--json", o->json_path, "Write JSON to FILE (or stdout when no FILE is given)")
                    ->expected(0, 1);
  app->add_option("--plot", o->plot, "Write a PNG of KL by position for all formats (needs gnuplot)");
  app->add_option("--quantize", o->quantize,
                  "Which of the cache the formats quantise: kv (default), or k / v only with the other in bf16 "
                  "(diagnostic)")
      ->check(CLI::IsMember({"kv", "k", "v"}));
  app->add_option("--v-format", o->v_format,
                  "Store V in this format instead of each row's (rows keep their format on K; a design diagnostic, "
                  "e.g. --formats q4 --v-format q3: q4 keys with q3 values)");
  app->add_flag("--quiet", o->quiet, "No progress bar");
  return [o] { return run(*o); };
}

const bool registered =
    kvpack::cli::register_command("eval", "Teacher-forced KL / top-1 / NLL of each KV format vs bf16 on held-out text", setup);

}  // namespace
