// `kvpack ruler`: RULER-style retrieval suite; every format answers the same seeded prompts (see eval.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
#include "kvpack/progress.h"
#include "kvpack/tokenizer.h"

namespace {

struct Opts {
  std::string model, calib, formats = "bf16", lengths = "2048,4096,8192", tasks = "all", dump;
  std::vector<std::string> haystacks{"data/eval-a.txt", "data/eval-b.txt"};
  int samples = 10, max_new = 48;
  uint64_t seed = 1;
  std::string json_path;
  CLI::Option* json_opt = nullptr;
  kvpack::RulerDifficulty difficulty;
  bool quiet = false;
  std::string quantize = "kv";
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPACK_CHECK(f.good(), "{}: cannot open haystack text file", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<int> parse_lengths(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVPACK_CHECK(used == item.size() && v > 0, "--lengths: '{}' is not a positive integer", item);
    out.push_back(v);
  }
  KVPACK_CHECK(!out.empty(), "--lengths: empty list");
  return out;
}

int run(const Opts& o) {
  const auto kinds = kvpack::parse_quantized_kinds(o.quantize);
  const auto model = kvpack::LlamaModel::load(o.model);
  const auto& cfg = model.config();
  const auto formats = kvpack::parse_format_list(o.formats);
  const auto tasks = kvpack::parse_ruler_tasks(o.tasks);
  const auto lengths = parse_lengths(o.lengths);
  const int max_ctx = cfg.max_context > 0 ? static_cast<int>(cfg.max_context) : 8192;
  for (int l : lengths) KVPACK_CHECK(l <= max_ctx, "--lengths: {} exceeds the model's context {}", l, max_ctx);

  std::optional<kvpack::Calibration> calib;
  if (!o.calib.empty()) calib = kvpack::Calibration::load(o.calib, cfg);
  for (auto f : formats) {
    KVPACK_CHECK(!kvpack::format_info(f).calibrated || calib, "format {} needs a calibration file (--calib FILE.kvcal)",
                 kvpack::format_name(f));
    (void)kvpack::make_codec(f, cfg, calib ? &*calib : nullptr);
  }

  std::vector<std::string> hay;
  for (const auto& p : o.haystacks) hay.push_back(read_file(p));
  const auto& tok = model.tokenizer();
  const int bos = model.add_bos() ? 1 : 0;
  auto counter = [&](const std::string& user, const std::string& prefix) -> int64_t {
    return static_cast<int64_t>(tok.encode(tok.apply_chat_template({{"user", user}}, true) + prefix, false, true).size()) + bos;
  };
  kvpack::Progress gen_progress("ruler: generating prompts", 1, !o.quiet);
  const auto samples = kvpack::generate_ruler(hay, tasks, lengths, o.samples, o.seed, counter, o.difficulty);
  gen_progress.finish(fmt::format("{} prompts", samples.size()));

  if (!o.dump.empty()) {
    nlohmann::json d = nlohmann::json::array();
    for (const auto& s : samples)
      d.push_back({{"task", kvpack::ruler_task_name(s.task)},
                   {"length", s.length},
                   {"index", s.index},
                   {"user", s.user},
                   {"answer_prefix", s.answer_prefix},
                   {"gold", s.gold},
                   {"gold_continuation", s.gold_continuation}});
    std::ofstream f(o.dump);
    KVPACK_CHECK(f.good(), "{}: cannot write prompts", o.dump);
    f << d.dump(1) << "\n";
  }

  auto rm = kvpack::make_model_ruler(model, calib ? &*calib : nullptr, max_ctx, kinds);
  kvpack::RulerConfig rc;
  rc.max_new_tokens = o.max_new;
  rc.progress = !o.quiet;
  auto result = kvpack::run_ruler(*rm, samples, formats, rc);
  result.seed = o.seed;
  result.samples = o.samples;

  const bool json_stdout = o.json_opt->count() > 0 && (o.json_path.empty() || o.json_path == "-");
  if (o.json_opt->count() > 0) {
    auto j = kvpack::ruler_to_json(result);
    j["model"] = o.model;
    j["calib"] = o.calib;
    j["quantized"] = kvpack::quantized_kinds_name(kinds);
    j["haystacks"] = o.haystacks;
    const auto& d = o.difficulty;
    j["difficulty"] = {{"multikey_distractors", d.multikey_distractors}, {"multivalue_values", d.multivalue_values},
                       {"multiquery_keys", d.multiquery_keys},           {"vt_hops", d.vt_hops},
                       {"cwe_top", d.cwe_top},                           {"cwe_freq_common", d.cwe_freq_common},
                       {"cwe_freq_rare", d.cwe_freq_rare}};
    if (json_stdout) {
      fmt::print("{}\n", j.dump(2));
    } else {
      std::ofstream f(o.json_path);
      KVPACK_CHECK(f.good(), "{}: cannot write JSON", o.json_path);
      f << j.dump(2) << "\n";
    }
  }
  fmt::print(json_stdout ? stderr : stdout, "{}{:.1f} s\n", kvpack::ruler_to_table(result), result.seconds);
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  app->add_option("--model", o->model, "Model (.gguf or HF directory)")->required();
  app->add_option("--calib", o->calib, "Calibration file FILE.kvcal (needed by fp8 and the q formats)");
  app->add_option("--formats", o->formats, "Comma list of formats, or 'all' (bf16 always runs: it is the reference)");
  app->add_option("--lengths", o->lengths, "Prompt lengths in tokens, comma list");
  app->add_option("--samples", o->samples, "Samples per (task, length)")->check(kvpack::cli::at_least(1));
  app->add_option("--seed", o->seed, "Generator seed");
  app->add_option("--tasks", o->tasks, "Comma list of tasks, or 'all'");
  app->add_option("--haystack", o->haystacks, "Held-out text(s) the haystacks are cut from");
  app->add_option("--max-new", o->max_new, "Greedy answer tokens at most (at least the gold length + 8)");
  app->add_option("--distractors", o->difficulty.multikey_distractors, "niah_multikey: distractor needles");
  app->add_option("--values", o->difficulty.multivalue_values, "niah_multivalue: values per key");
  app->add_option("--queries", o->difficulty.multiquery_keys, "niah_multiquery: keys asked at once");
  app->add_option("--hops", o->difficulty.vt_hops, "variable_tracking: assignments after the first");
  app->add_option("--cwe-top", o->difficulty.cwe_top, "common_words: words asked for");
  app->add_option("--dump-prompts", o->dump, "Write the generated prompts and gold answers as JSON");
  o->json_opt = app->add_option("--json", o->json_path, "Write JSON to FILE (or stdout when no FILE is given)")
                    ->expected(0, 1);
  app->add_option("--quantize", o->quantize,
                  "Which of the cache the formats quantise: kv (default), or k / v only with the other in bf16 "
                  "(diagnostic)")
      ->check(CLI::IsMember({"kv", "k", "v"}));
  app->add_flag("--quiet", o->quiet, "No progress bar");
  return [o] { return run(*o); };
}

const bool registered = kvpack::cli::register_command(
    "ruler", "RULER-style retrieval suite: exact-match accuracy and gold-span KL per task and format", setup);

}  // namespace
