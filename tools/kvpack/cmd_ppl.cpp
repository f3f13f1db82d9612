// `kvpack ppl`: perplexity of a model over a text with the CPU reference runner (non-overlapping windows, each
// starting from an empty KV cache; see include/kvpack/text_eval.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include "command.h"
#include "kvpack/error.h"
#include "kvpack/llama.h"
#include "kvpack/progress.h"
#include "kvpack/text_eval.h"
#include "kvpack/tokenizer.h"

namespace {

struct Opts {
  std::string model, text, kv = "bf16";
  int window = 0, chunk = 256;
  int64_t max_tokens = 0;
  bool json = false, quiet = false;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPACK_CHECK(f.good(), "{}: cannot open text file", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

int run(const Opts& o) {
  const auto t_load = std::chrono::steady_clock::now();
  const auto model = kvpack::LlamaModel::load(o.model);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const std::string text = read_file(o.text);
  // Plain text: special-token spellings in the document are text, not control tokens.
  auto tokens = model.tokenizer().encode(text, /*add_bos=*/false, /*parse_special=*/false);
  KVPACK_CHECK(!tokens.empty(), "{}: the text tokenizes to nothing", o.text);
  if (o.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > o.max_tokens) tokens.resize(o.max_tokens);

  std::unique_ptr<kvpack::KvCodec> codec;
  if (o.kv == "fp32")
    codec = kvpack::make_fp32_codec();
  else
    KVPACK_CHECK(o.kv == "bf16", "--kv must be bf16 or fp32, got '{}'", o.kv);

  kvpack::ScoreOptions so;
  so.window = o.window;
  so.codec = codec.get();
  so.chunk = o.chunk;
  kvpack::Progress progress("ppl", static_cast<int64_t>(tokens.size()), !o.quiet);
  // Running NLL in the progress line, so a long run shows where it is heading.
  double nll_sum = 0;
  int64_t scored = 0;
  const auto r = kvpack::score_text(model, tokens, so, [&](const kvpack::TokenScore& s) {
    nll_sum += s.nll;
    ++scored;
    if (scored % 64 == 0)
      progress.update(scored, fmt::format("{:.0f} tok/s ppl {:.3f}", scored / progress.elapsed_s(),
                                          std::exp(nll_sum / scored)));
  });
  progress.finish(fmt::format("{:.0f} tok/s", r.tokens / std::max(r.seconds, 1e-9)));

  const double tps = r.tokens / std::max(r.seconds, 1e-9);
  if (o.json) {
    nlohmann::json j = {{"ppl", r.ppl},
                        {"mean_nll", r.mean_nll},
                        {"tokens", r.tokens},
                        {"text_tokens", tokens.size()},
                        {"windows", r.windows},
                        {"window", r.window},
                        {"seconds", r.seconds},
                        {"load_seconds", load_s},
                        {"tokens_per_second", tps},
                        {"kv", o.kv},
                        {"bos", model.add_bos() ? model.bos_id() : -1},
                        {"model", o.model},
                        {"text", o.text}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("model    {}\ntext     {} ({} tokens scored in {} window(s) of {})\nkv       {}\n", o.model, o.text,
               r.tokens, r.windows, r.window, o.kv);
    fmt::print("ppl      {:.4f}\nmean NLL {:.5f} nats/token\nseconds  {:.1f} ({:.1f} tok/s; load {:.1f} s)\n", r.ppl,
               r.mean_nll, r.seconds, tps, load_s);
  }
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  app->add_option("--model", o->model, "Model: .gguf file or HF directory (needs a GGUF tokenizer)")->required();
  app->add_option("--text", o->text, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  app->add_option("--window", o->window, "Tokens per window incl. BOS (default: model context, at most 8192)")
      ->check(kvpack::cli::at_least(0));
  app->add_option("--max-tokens", o->max_tokens, "Score only the first N text tokens")
      ->check(kvpack::cli::at_least<int64_t>(0));
  app->add_option("--kv", o->kv, "KV cache precision: bf16 (default) or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  app->add_option("--chunk", o->chunk, "Prefill chunk in tokens (memory vs. speed)")->check(kvpack::cli::at_least(1));
  app->add_flag("--json", o->json, "Print JSON");
  app->add_flag("--quiet", o->quiet, "No progress bar");
  return [o] { return run(*o); };
}

const bool registered = kvpack::cli::register_command("ppl", "Perplexity of a model over a text (CPU reference)", setup);

}  // namespace
