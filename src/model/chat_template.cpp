// Native chat templates. Instead of a Jinja engine we recognise the template families kvpack serves (ChatML as used
// by SmolLM2 and Qwen2, and Llama-3) and render them in C++; tests/test_tokenizer.cpp checks the output against
// transformers' apply_chat_template on the real templates (tests/data/tokenizer/chat.json).
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include "kvpack/error.h"
#include "kvpack/tokenizer.h"

namespace kvpack {
namespace {

// Python's str.isspace(), which Jinja's `trim` filter uses: bidi class WS, B or S, or general category Zs.
// (Differs from ICU's White_Space: U+001C..U+001F count, U+0085 counts via bidi B.)
bool python_isspace(UChar32 c) {
  const auto dir = u_charDirection(c);
  return dir == U_WHITE_SPACE_NEUTRAL || dir == U_BLOCK_SEPARATOR || dir == U_SEGMENT_SEPARATOR ||
         u_charType(c) == U_SPACE_SEPARATOR;
}

// Jinja `| trim` (Python str.strip()) on UTF-8; invalid bytes count as non-space.
std::string python_strip(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = static_cast<int32_t>(s.size());
  int32_t i = 0, first = -1, last_end = 0;
  while (i < n) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c < 0 || !python_isspace(c)) {
      if (first < 0) first = start;
      last_end = i;
    }
  }
  if (first < 0) return {};
  return std::string(s.substr(first, last_end - first));
}

// Unescape what a Jinja string literal may hold in a default system prompt ("\n", "\'", "\\").
std::string jinja_unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char e = s[++i];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    } else {
      out += s[i];
    }
  }
  return out;
}

// ChatML templates that insert a default system prompt hold it as a literal "<|im_start|>system\n...<|im_end|>";
// templates that only forward messages[0]['content'] have an expression there instead, which we reject.
std::optional<std::string> find_default_system(std::string_view t) {
  static constexpr std::string_view kHead = "<|im_start|>system";
  size_t pos = 0;
  while ((pos = t.find(kHead, pos)) != std::string_view::npos) {
    size_t body = pos + kHead.size();
    pos = body;
    if (t.substr(body, 1) == "\n") body += 1;
    else if (t.substr(body, 2) == "\\n") body += 2;
    else continue;
    const size_t end = t.find("<|im_end|>", body);
    if (end == std::string_view::npos) continue;
    const std::string_view cand = t.substr(body, end - body);
    // An expression ("' + messages[0]['content'] + '") is not a literal prompt.
    if (cand.empty() || cand.find("messages") != std::string_view::npos || cand.find_first_of("{}") != std::string_view::npos ||
        cand.find("' +") != std::string_view::npos || cand.find("+ '") != std::string_view::npos)
      continue;
    return jinja_unescape(cand);
  }
  return std::nullopt;
}

}  // namespace

ChatTemplateInfo parse_chat_template(std::string_view tmpl) {
  ChatTemplateInfo info;
  KVPACK_CHECK(!tmpl.empty(), "chat template: the model has no chat template (tokenizer.chat_template is empty)");
  if (tmpl.find("<|im_start|>") != std::string_view::npos) {
    info.kind = "chatml";
    info.default_system = find_default_system(tmpl);
    return info;
  }
  if (tmpl.find("<|start_header_id|>") != std::string_view::npos) {
    // Llama-3.1+ templates always emit a system block with "Cutting Knowledge Date" and a date string, and tool
    // handling; rendering them natively is not implemented (yet), so refuse rather than render something else.
    KVPACK_CHECK(tmpl.find("Cutting Knowledge Date") == std::string_view::npos,
                 "chat template: Llama-3.1-style template (dates/tools) is not supported; only Llama-3 and ChatML");
    info.kind = "llama3";
    return info;
  }
  fail("chat template: unknown template (supported: ChatML with <|im_start|>, Llama-3 with <|start_header_id|>); "
       "it begins: \"{}\"", tmpl.substr(0, 80));
}

std::string render_chat(const ChatTemplateInfo& info, const std::vector<ChatMessage>& msgs,
                        bool add_generation_prompt, std::string_view bos_text) {
  // transformers refuses an empty conversation; so do we, with the same meaning.
  KVPACK_CHECK(!msgs.empty(), "chat template: cannot apply a chat template to an empty conversation");
  std::string out;
  if (info.kind == "chatml") {
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (i == 0 && msgs[0].role != "system" && info.default_system)
        out += "<|im_start|>system\n" + *info.default_system + "<|im_end|>\n";
      out += "<|im_start|>" + msgs[i].role + "\n" + msgs[i].content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  if (info.kind == "llama3") {
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (i == 0) out += bos_text;
      out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" + python_strip(msgs[i].content) +
             "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
  }
  fail("chat template: unknown template kind '{}'", info.kind);
}

}  // namespace kvpack
