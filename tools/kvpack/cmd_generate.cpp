// `kvpack generate`: greedy decoding with the CPU reference runner, streaming text as it is produced.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

#include "command.h"
#include "kvpack/error.h"
#include "kvpack/llama.h"
#include "kvpack/tokenizer.h"

namespace {

struct Opts {
  std::string model, prompt, system, kv = "bf16";
  int max_new = 64, context = 0;
  bool chat = false, json = false;
};

int run(const Opts& o) {
  const auto model = kvpack::LlamaModel::load(o.model);
  const auto& tok = model.tokenizer();
  std::string text = o.prompt;
  if (o.chat) {
    std::vector<kvpack::ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.prompt});
    text = tok.apply_chat_template(msgs, /*add_generation_prompt=*/true);
  }
  // The chat template spells its control tokens out, so they must parse as specials; a raw prompt is plain text.
  const auto prompt = tok.encode(text, /*add_bos=*/model.add_bos() && !o.chat, /*parse_special=*/o.chat);
  KVPACK_CHECK(!prompt.empty(), "the prompt tokenizes to nothing");
  std::unique_ptr<kvpack::KvCodec> codec;
  if (o.kv == "fp32") codec = kvpack::make_fp32_codec();
  const int ctx = o.context > 0 ? o.context : static_cast<int>(prompt.size()) + o.max_new;
  KVPACK_CHECK(static_cast<int>(prompt.size()) < ctx, "prompt of {} tokens does not fit --context {}", prompt.size(), ctx);
  kvpack::LlamaSession session(model, ctx, codec.get());

  kvpack::DecodeStream stream(tok);
  const auto t0 = std::chrono::steady_clock::now();
  double first_s = 0;
  std::string out;
  const auto ids = session.generate_greedy(prompt, o.max_new, [&](int32_t id) {
    if (first_s == 0)
      first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (model.is_eog(id)) return;  // do not print the end marker
    const std::string piece = stream.push(id);
    out += piece;
    if (!o.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  });
  const std::string rest = stream.flush();
  out += rest;
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double decode_tps = ids.size() > 1 ? (ids.size() - 1) / std::max(total_s - first_s, 1e-9) : 0.0;
  if (o.json) {
    nlohmann::json j = {{"text", out},
                        {"prompt_tokens", prompt.size()},
                        {"generated_ids", ids},
                        {"generated_tokens", ids.size()},
                        {"stopped_at_eog", !ids.empty() && model.is_eog(ids.back())},
                        {"prefill_seconds", first_s},
                        {"seconds", total_s},
                        {"decode_tokens_per_second", decode_tps},
                        {"kv", o.kv},
                        {"model", o.model}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}\n", rest);
    fmt::print(stderr, "[{} prompt tokens, {} generated, prefill {:.2f} s, {:.1f} tok/s decode]\n", prompt.size(),
               ids.size(), first_s, decode_tps);
  }
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  app->add_option("--model", o->model, "Model: .gguf file (carries the tokenizer)")->required();
  app->add_option("--prompt", o->prompt, "Prompt text")->required();
  app->add_flag("--chat", o->chat, "Wrap the prompt as a user message in the model's chat template");
  app->add_option("--system", o->system, "System message (with --chat)");
  app->add_option("--max-new-tokens", o->max_new, "Tokens to generate at most")->check(kvpack::cli::at_least(1));
  app->add_option("--context", o->context, "KV cache size (default: prompt + max-new-tokens)")
      ->check(kvpack::cli::at_least(0));
  app->add_option("--kv", o->kv, "KV cache precision: bf16 (default) or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  app->add_flag("--json", o->json, "Print JSON at the end instead of streaming");
  return [o] { return run(*o); };
}

const bool registered = kvpack::cli::register_command("generate", "Greedy text generation (CPU reference)", setup);

}  // namespace
