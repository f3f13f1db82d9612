// Byte-level BPE tokenizer (GPT-2 / Llama-3 / Qwen2 / SmolLM2 style) and native chat templates.
//
// Built from GGUF metadata (tokenizer.ggml.*) or from a Hugging Face tokenizer.json; encoding matches the HF
// `tokenizers` library exactly for the supported pre-tokenizers (tests/test_tokenizer.cpp checks ids against
// fixtures made by scripts/make_tokenizer_fixtures.py). Pipeline of encode():
//   1. added/special tokens are cut out first (leftmost-longest match; special ones only when parse_special),
//   2. the rest is NFC-normalized when the tokenizer asks for it (Qwen2),
//   3. split into pieces by the pre-tokenizer regexes (ICU, so \p{L} / \p{N} / lookahead follow Unicode),
//   4. each piece's bytes are mapped to GPT-2's byte alphabet and merged by BPE merge rank (results cached).
// A Tokenizer is immutable after construction apart from its internal cache, and is safe to use from several
// threads at once. Copies are cheap (shared state).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvpack {

class GgufFile;

struct ChatMessage {
  std::string role, content;
};

// Everything a byte-level BPE tokenizer is made of, in GGUF terms. from_gguf() fills it from tokenizer.ggml.*;
// it is public so tests and tools can build a tokenizer from any source.
struct BpeVocab {
  std::string source;                   // file name used in error messages
  std::vector<std::string> tokens;      // id -> token text in byte-level form ("Ġthe")
  std::vector<int32_t> token_types;     // GGUF token types (1 normal, 3 control, 4 user-defined, ...); may be empty
  std::vector<std::string> merges;      // "left right", highest priority first
  std::string pre = "gpt2";             // tokenizer.ggml.pre: smollm, gpt2, llama-bpe (llama3), qwen2, default
  int32_t bos_id = -1, eos_id = -1, eot_id = -1, eom_id = -1;
  bool add_bos = false;                 // tokenizer.ggml.add_bos_token: whether prompts should start with BOS
  std::string chat_template;            // empty when the model has none
};

class Tokenizer {
 public:
  // From GGUF metadata; requires tokenizer.ggml.model == "gpt2". Throws kvpack::Error naming the file and key.
  static Tokenizer from_gguf(const GgufFile& f);
  // From an HF tokenizer.json (model.type BPE, byte-level). bos/eos and the chat template come from a
  // tokenizer_config.json (and chat_template.jinja) next to it when present.
  static Tokenizer from_tokenizer_json(const std::string& path);
  static Tokenizer from_vocab(const BpeVocab& v);

  // parse_special: control/special added tokens written in the text become their ids; when false they are
  // tokenized as plain text (user-defined, non-special added tokens are always matched, as in HF and llama.cpp).
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool parse_special = true) const;
  // Steps 2-3 only (no added-token matching, no BPE): the normalized text's pieces, as bytes. For tests/tools.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  // Bytes of the ids concatenated; may end in (or hold) a partial UTF-8 sequence. Use DecodeStream for streaming.
  std::string decode(std::span<const int32_t> ids) const;
  // Token text as stored in the vocabulary (byte-level form, e.g. "Ġthe"; added tokens as written).
  std::string token_text(int32_t id) const;
  // Bytes one token stands for (decode of just this id).
  std::string token_bytes(int32_t id) const;
  std::optional<int32_t> token_id(std::string_view token_text) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when none
  int32_t eos_id() const;  // -1 when none
  // Whether the model expects BOS at the start of a prompt (GGUF tokenizer.ggml.add_bos_token; tokenizer.json:
  // tokenizer_config.json add_bos_token). false for SmolLM2. encode() never adds BOS on its own.
  bool add_bos_default() const;
  bool is_eog(int32_t id) const;  // end of generation: eos, eot, <|im_end|>, <|eot_id|>, <|endoftext|>, ...
  bool is_special(int32_t id) const;  // control / special added token

  // Renders the model's chat template natively (ChatML: SmolLM2, Qwen2; Llama-3). Output equals transformers'
  // apply_chat_template(messages, tokenize=False, add_generation_prompt=...). Throws for an unknown template,
  // a model without one, or an empty conversation.
  std::string apply_chat_template(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const;
  const std::string& chat_template() const;
  // "chatml", "llama3", or "" when the template is absent; throws for a template kvpack cannot render.
  std::string chat_template_kind() const;
  const std::string& pre_tokenizer() const;  // e.g. "smollm"

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Streaming detokenizer: push ids one at a time and get back only complete UTF-8 characters; a partial sequence
// is held until its continuation bytes arrive (invalid bytes are passed through once they cannot complete).
class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& tok) : tok_(&tok) {}
  std::string push(int32_t id);
  std::string flush();  // whatever is pending, complete or not

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

// Chat template rendering without a Jinja engine; used by Tokenizer::apply_chat_template.
// kind: "chatml" or "llama3" (see chat_template_kind); bos_text is the BOS token text (Llama-3 prepends it).
struct ChatTemplateInfo {
  std::string kind;                           // "chatml", "llama3"
  std::optional<std::string> default_system;  // ChatML: system prompt inserted when the first message isn't system
};
ChatTemplateInfo parse_chat_template(std::string_view tmpl);  // throws kvpack::Error for unknown templates
std::string render_chat(const ChatTemplateInfo& info, const std::vector<ChatMessage>& msgs,
                        bool add_generation_prompt, std::string_view bos_text);

}  // namespace kvpack
