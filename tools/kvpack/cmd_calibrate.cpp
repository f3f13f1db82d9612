// `kvpack calibrate`: fit every calibrated KV format (fp8 scales, q4, q3.5, q3) on a model's activations over
// calibration text and write FILE.kvcal (see docs/FORMATS.md for its tensors).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "command.h"
#include "kvpack/calibration.h"
#include "kvpack/error.h"
#include "kvpack/llama.h"
#include "kvpack/tokenizer.h"

namespace {

struct Opts {
  std::string model, out;
  std::vector<std::string> texts;
  int window = 8192, windows = 2;
  bool quiet = false;
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPACK_CHECK(f.good(), "{}: cannot open text file", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

int run(const Opts& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto model = kvpack::LlamaModel::load(o.model);
  KVPACK_CHECK(o.window > 8 && o.window <= model.config().max_context,
               "--window {} must be in (8, {}] (the model's context)", o.window, model.config().max_context);
  // Texts are tokenized separately and concatenated; windows are consecutive, non-overlapping and start with BOS
  // when the model uses one, like the evaluation windows.
  std::vector<int32_t> all;
  for (const auto& t : o.texts) {
    auto ids = model.tokenizer().encode(read_text(t), /*add_bos=*/false, /*parse_special=*/false);
    KVPACK_CHECK(!ids.empty(), "{}: the text tokenizes to nothing", t);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  const bool bos = model.add_bos() && model.bos_id() >= 0;
  const size_t per = static_cast<size_t>(o.window - (bos ? 1 : 0));
  std::vector<std::vector<int32_t>> windows;
  for (size_t i = 0; i < all.size() && static_cast<int>(windows.size()) < o.windows; i += per) {
    std::vector<int32_t> w;
    if (bos) w.push_back(model.bos_id());
    w.insert(w.end(), all.begin() + i, all.begin() + std::min(all.size(), i + per));
    if (w.size() < per / 2 && !windows.empty()) break;  // drop a short tail once there is a full window
    windows.push_back(std::move(w));
  }
  size_t n_tok = 0;
  for (const auto& w : windows) n_tok += w.size();
  if (!o.quiet)
    fmt::print(stderr, "calibrate: {} window(s), {} tokens (window {}) from {} text token(s)\n", windows.size(), n_tok,
               o.window, all.size());
  auto cal = kvpack::calibrate(model, windows, !o.quiet);
  std::string texts;
  for (const auto& t : o.texts) texts += (texts.empty() ? "" : ",") + std::filesystem::path(t).filename().string();
  cal.info()["texts"] = texts;
  cal.info()["window"] = std::to_string(o.window);
  cal.save(o.out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {} ({} bytes) in {:.1f} s: {} windows, {} tokens, formats fp8,q4,q3.5,q3\n", o.out,
             std::filesystem::file_size(o.out), secs, windows.size(), n_tok);
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  app->add_option("--model", o->model, "Model (.gguf file or HF directory)")->required();
  app->add_option("--text", o->texts, "Calibration text (repeatable; never evaluation text)")->required();
  app->add_option("-o,--output", o->out, "Output calibration file (.kvcal)")->required();
  app->add_option("--window", o->window, "Tokens per calibration window (default 8192)");
  app->add_option("--windows", o->windows, "Number of windows (default 2)");
  app->add_flag("--quiet", o->quiet, "No progress output");
  return [o] { return run(*o); };
}

const bool registered =
    kvpack::cli::register_command("calibrate", "Fit the calibrated KV formats on a model and write FILE.kvcal", setup);
}  // namespace
