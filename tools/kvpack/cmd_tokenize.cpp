// `kvpack tokenize`: tokenize a text (or a one-message chat prompt) with a model's tokenizer and print the ids,
// and each token's piece.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unicode/utf8.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "kvpack/error.h"
#include "kvpack/gguf.h"
#include "kvpack/tokenizer.h"

namespace {

// Quoted piece for the table: whole UTF-8 characters as they are, control and stray bytes (a token may hold part
// of a character) as escapes.
std::string escape_piece(const std::string& b) {
  std::string out = "\"";
  const auto* p = reinterpret_cast<const uint8_t*>(b.data());
  const int32_t n = static_cast<int32_t>(b.size());
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '"' || c == '\\') out += "\\" + std::string(1, static_cast<char>(c));
    else if (c < 0 || c < 0x20 || c == 0x7f)
      for (int32_t k = start; k < i; ++k) out += fmt::format("\\x{:02x}", p[k]);
    else out.append(b, start, i - start);
  }
  return out + "\"";
}

struct Opts {
  std::string model, text, file, tokenizer_json;
  bool chat = false, json = false, bos = false, no_special = false, ids_only = false;
};

kvpack::cli::Runner setup(CLI::App* app) {
  auto o = std::make_shared<Opts>();
  auto* src = app->add_option_group("source", "Where the tokenizer comes from");
  src->add_option("--model", o->model, "GGUF model file (its tokenizer.ggml.* metadata)");
  src->add_option("--tokenizer-json", o->tokenizer_json, "HF tokenizer.json (tokenizer_config.json beside it)");
  src->require_option(1);
  auto* in = app->add_option_group("input", "What to tokenize");
  in->add_option("--text", o->text, "Text to tokenize");
  in->add_option("--file", o->file, "File whose bytes are tokenized");
  in->require_option(1);
  app->add_flag("--chat", o->chat, "Wrap the text as one user message in the model's chat template "
                                   "(with the assistant generation prompt)");
  app->add_flag("--bos", o->bos, "Prepend the BOS token (when the model has one)");
  app->add_flag("--no-special", o->no_special, "Tokenize special-token text such as <|im_end|> as plain text");
  app->add_flag("--ids-only", o->ids_only, "Print only the ids, space-separated");
  app->add_flag("--json", o->json, "Print JSON: {n_tokens, ids, pieces, text}");
  return [o] {
    kvpack::Tokenizer tok = [&] {
      if (!o->model.empty()) return kvpack::Tokenizer::from_gguf(kvpack::GgufFile::open(o->model));
      return kvpack::Tokenizer::from_tokenizer_json(o->tokenizer_json);
    }();
    std::string text = o->text;
    if (!o->file.empty()) {
      std::ifstream f(o->file, std::ios::binary);
      KVPACK_CHECK(f.good(), "{}: cannot open file", o->file);
      std::ostringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    }
    if (o->chat) text = tok.apply_chat_template({{"user", text}}, /*add_generation_prompt=*/true);
    const auto ids = tok.encode(text, o->bos, !o->no_special);

    if (o->json) {
      // Pieces are bytes and may split a UTF-8 character; the dump replaces invalid bytes with U+FFFD.
      nlohmann::json pieces = nlohmann::json::array();
      for (int32_t id : ids) pieces.push_back(tok.token_bytes(id));
      const nlohmann::json out = {{"n_tokens", ids.size()}, {"ids", ids}, {"pieces", pieces}, {"text", text}};
      fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return 0;
    }
    if (o->ids_only) {
      fmt::print("{}\n", fmt::join(ids, " "));
      return 0;
    }
    fmt::print("{} tokens\n", ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
      fmt::print("{:>6} {:>7}  {}{}\n", i, ids[i], escape_piece(tok.token_bytes(ids[i])),
                 tok.is_special(ids[i]) ? "  (special)" : "");
    return 0;
  };
}

const bool registered =
    kvpack::cli::register_command("tokenize", "Tokenize a text with a model's tokenizer (ids and pieces)", setup);

}  // namespace
