// Byte-level BPE tokenizer: see include/kvpack/tokenizer.h for the pipeline. Reference behaviour is HF `tokenizers`
// (the fixtures in tests/data/tokenizer/ are its output); where llama.cpp and HF differ (Qwen2's NFC normalizer)
// we follow HF, which is what the models were trained with.
#include "kvpack/tokenizer.h"

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include <array>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "kvpack/error.h"
#include "kvpack/gguf.h"

namespace kvpack {
namespace {

// HF's ByteLevel regex (GPT-2). llama.cpp drops the final "|\s+", which is equivalent once gaps become pieces.
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GGUF token types (llama.cpp's llama_token_type).
constexpr int32_t kTypeNormal = 1, kTypeControl = 3, kTypeUserDefined = 4;

// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100.. in order. Tokens are strings over this alphabet.
struct ByteMap {
  std::array<UChar32, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};  // code point -> byte, -1 when not in the alphabet
  std::array<std::string, 256> utf8;   // UTF-8 of to_cp[b]
  ByteMap() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? b : 256 + n++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
      char buf[4];
      int32_t len = 0;
      U8_APPEND_UNSAFE(buf, len, to_cp[b]);
      utf8[b] = std::string(buf, len);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// ICU's \s is [\t\n\f\r\p{Z}]; Oniguruma (HF tokenizers) uses Unicode White_Space, which adds \v and U+0085.
// Rewrite \s / \S so the patterns mean what they mean in the reference.
std::string to_icu_regex(std::string_view re) {
  std::string out;
  for (size_t i = 0; i < re.size(); ++i) {
    if (re[i] == '\\' && i + 1 < re.size()) {
      const char e = re[i + 1];
      if (e == 's') out += R"(\p{White_Space})";
      else if (e == 'S') out += R"(\P{White_Space})";
      else { out += re[i]; out += e; }
      ++i;
    } else {
      out += re[i];
    }
  }
  return out;
}

std::string escape_regex_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  struct Stage {
    enum Kind { kRegex, kDigits } kind = kRegex;
    std::string pattern;                      // as given (for messages)
    std::unique_ptr<icu::RegexPattern> re;    // compiled, shared read-only; each encode makes its own matcher
  };
  struct Added {
    std::string text;
    int32_t id;
    bool special;
  };
  struct MergeVal {
    int32_t rank, id;
  };

  std::string source;
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t> token_to_id;
  std::vector<uint8_t> special;  // control / special added token
  std::vector<uint8_t> added;    // any added token (decoded verbatim, never by the byte map)
  std::unordered_map<uint64_t, MergeVal> merges;  // (left id << 32 | right id) -> rank, merged id
  std::array<int32_t, 256> byte_id{};              // token id of each single byte, -1 when missing
  std::vector<Added> added_list;
  std::array<std::vector<uint32_t>, 256> added_by_first;  // indices into added_list, longest first
  std::string pre_name;
  std::vector<Stage> stages;
  bool nfc = false;
  bool ignore_merges = false;
  int32_t bos = -1, eos = -1;
  bool add_bos = false;
  std::unordered_set<int32_t> eog;
  std::string chat_template;
  std::string template_kind;   // "" when there is no template
  std::string template_error;  // set when the template is present but unsupported
  ChatTemplateInfo template_info;

  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;
  static constexpr size_t kCacheMax = 1 << 18;

  int32_t id_of(std::string_view t) const {
    auto it = token_to_id.find(std::string(t));
    return it == token_to_id.end() ? -1 : it->second;
  }

  void add_regex_stage(std::string_view pattern) {
    Stage s;
    s.pattern = std::string(pattern);
    const std::string icu = to_icu_regex(pattern);
    UErrorCode st = U_ZERO_ERROR;
    UParseError pe;
    s.re.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu), 0, pe, st));
    KVPACK_CHECK(U_SUCCESS(st) && s.re, "{}: pre-tokenizer regex does not compile ({}, at offset {}): {}", source,
                 u_errorName(st), pe.offset, pattern);
    stages.push_back(std::move(s));
  }
  void add_digits_stage() {
    Stage s;
    s.kind = Stage::kDigits;
    s.pattern = "\\p{N} (individual digits)";
    stages.push_back(std::move(s));
  }

  void set_pre(const std::string& pre) {
    pre_name = pre;
    if (pre == "gpt2" || pre == "mpt" || pre == "olmo") {
      add_regex_stage(kGpt2Regex);
    } else if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
      // HF: Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)]; llama.cpp: "\p{N}" then GPT-2.
      add_digits_stage();
      add_regex_stage(kGpt2Regex);
    } else if (pre == "llama-bpe" || pre == "llama3") {
      add_regex_stage(kLlama3Regex);
      ignore_merges = true;  // Llama-3's tokenizer.json sets model.ignore_merges
    } else if (pre == "qwen2") {
      add_regex_stage(kQwen2Regex);
      nfc = true;  // Qwen2's tokenizer.json has an NFC normalizer
    } else {
      fail("{}: tokenizer.ggml.pre '{}' is not supported (supported: smollm, gpt2, llama-bpe, qwen2, starcoder, "
           "refact, mpt, olmo)", source, pre);
    }
  }

  // Builds lookups once tokens/types/merges are in place.
  void finish(const std::vector<std::string>& merge_strs, const std::vector<std::pair<std::string, std::string>>& merge_pairs) {
    const auto& bm = byte_map();
    token_to_id.reserve(tokens.size() * 2);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i].empty()) continue;
      token_to_id.emplace(tokens[i], static_cast<int32_t>(i));  // first id wins for duplicates
    }
    for (int b = 0; b < 256; ++b) byte_id[b] = id_of(bm.utf8[b]);
    merges.reserve((merge_strs.size() + merge_pairs.size()) * 2);
    auto add_merge = [&](std::string_view l, std::string_view r, size_t rank) {
      const int32_t li = id_of(l), ri = id_of(r);
      const int32_t mi = id_of(std::string(l) + std::string(r));
      KVPACK_CHECK(li >= 0 && ri >= 0 && mi >= 0, "{}: merge {} ('{} {}') refers to a token not in the vocabulary",
                   source, rank, l, r);
      const uint64_t key = (uint64_t(uint32_t(li)) << 32) | uint32_t(ri);
      merges.try_emplace(key, MergeVal{static_cast<int32_t>(rank), mi});  // first (highest priority) wins
    };
    size_t rank = 0;
    for (const auto& m : merge_strs) {
      // "a b": the split is at the first space; byte-level tokens never contain a raw space (it is 'Ġ').
      const size_t sp = m.find(' ', 1);
      KVPACK_CHECK(sp != std::string::npos && sp + 1 < m.size(), "{}: merge {} '{}' is not of the form 'left right'",
                   source, rank, m);
      add_merge(std::string_view(m).substr(0, sp), std::string_view(m).substr(sp + 1), rank++);
    }
    for (const auto& [l, r] : merge_pairs) add_merge(l, r, rank++);

    for (size_t i = 0; i < tokens.size(); ++i)
      if (added[i] && !tokens[i].empty())
        added_list.push_back({tokens[i], static_cast<int32_t>(i), special[i] != 0});
    for (uint32_t i = 0; i < added_list.size(); ++i)
      added_by_first[static_cast<uint8_t>(added_list[i].text[0])].push_back(i);
    for (auto& v : added_by_first)
      std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
        return added_list[a].text.size() > added_list[b].text.size();
      });

    // End-of-generation ids: eos plus the well-known end-of-turn tokens when they are special tokens.
    if (eos >= 0) eog.insert(eos);
    for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>", "<|end|>",
                          "<end_of_turn>"}) {
      const int32_t id = id_of(t);
      if (id >= 0 && added[id]) eog.insert(id);
    }

    if (!chat_template.empty()) {
      try {
        template_info = parse_chat_template(chat_template);
        template_kind = template_info.kind;
      } catch (const Error& e) {
        template_error = e.what();  // loading still works; apply_chat_template reports it
      }
    }
  }

  // ---- encoding
  std::vector<int32_t> bpe(std::string_view piece) const;
  void encode_segment(std::string_view seg, std::vector<int32_t>& out) const;
  // Normalizes seg (into storage when it changes) and splits it; returns byte spans of the normalized text.
  std::vector<std::pair<int64_t, int64_t>> split(std::string_view& seg, std::string& storage) const;
};

namespace {

// One candidate merge in the heap: lowest rank first, then leftmost (HF's Word::merge_all order).
struct Cand {
  int32_t rank, pos, left_id, right_id;
  bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

std::vector<int32_t> Tokenizer::Impl::bpe(std::string_view piece) const {
  const auto& bm = byte_map();
  if (ignore_merges) {
    // Llama-3: a piece that is itself a vocabulary token is emitted whole, even if merges would split it.
    std::string mapped;
    for (unsigned char c : piece) mapped += bm.utf8[c];
    const int32_t id = id_of(mapped);
    if (id >= 0 && !added[id]) return {id};
  }
  {
    std::shared_lock lk(cache_mu);
    if (auto it = cache.find(std::string(piece)); it != cache.end()) return it->second;
  }
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> id(n), prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    id[i] = byte_id[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = next[l];
    if (r < 0 || id[l] < 0 || id[r] < 0) return;
    auto it = merges.find((uint64_t(uint32_t(id[l])) << 32) | uint32_t(id[r]));
    if (it != merges.end()) heap.push({it->second.rank, l, id[l], id[r]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int32_t l = c.pos, r = next[l];
    // Stale entry: the left symbol was merged away or either side changed since it was pushed.
    if (id[l] != c.left_id || r < 0 || id[r] != c.right_id) continue;
    id[l] = merges.find((uint64_t(uint32_t(c.left_id)) << 32) | uint32_t(c.right_id))->second.id;
    id[r] = -2;  // dead
    next[l] = next[r];
    if (next[r] >= 0) prev[next[r]] = l;
    push(prev[l]);
    push(l);
  }
  std::vector<int32_t> out;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i])
    if (id[i] >= 0) out.push_back(id[i]);  // a byte missing from the vocabulary is dropped, as HF does without unk
  {
    std::unique_lock lk(cache_mu);
    if (cache.size() < kCacheMax) cache.emplace(std::string(piece), out);
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> Tokenizer::Impl::split(std::string_view& seg, std::string& normalized) const {
  if (nfc) {
    UErrorCode st = U_ZERO_ERROR;
    const icu::Normalizer2* n2 = icu::Normalizer2::getNFCInstance(st);
    KVPACK_CHECK(U_SUCCESS(st), "ICU: NFC normalizer unavailable ({})", u_errorName(st));
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(seg.data(), static_cast<int32_t>(seg.size())));
    if (!n2->isNormalized(u, st)) {
      icu::UnicodeString v = n2->normalize(u, st);
      KVPACK_CHECK(U_SUCCESS(st), "ICU: NFC normalization failed ({})", u_errorName(st));
      v.toUTF8String(normalized);
      seg = normalized;
    }
  }

  // Pieces are byte spans of seg; each stage splits every piece further (HF "Isolated": matches and the gaps
  // between them both become pieces).
  std::vector<std::pair<int64_t, int64_t>> pieces{{0, static_cast<int64_t>(seg.size())}}, next_pieces;
  UErrorCode st = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, seg.data(), static_cast<int64_t>(seg.size()), &st);
  KVPACK_CHECK(U_SUCCESS(st), "ICU: cannot open text ({})", u_errorName(st));
  struct Closer {
    UText* t;
    ~Closer() { utext_close(t); }
  } closer{ut};
  const auto* bytes = reinterpret_cast<const uint8_t*>(seg.data());

  for (const Stage& stage : stages) {
    next_pieces.clear();
    if (stage.kind == Stage::kDigits) {
      for (auto [b, e] : pieces) {
        int64_t run = b;
        int32_t i = static_cast<int32_t>(b);
        while (i < e) {
          const int32_t start = i;
          UChar32 c;
          U8_NEXT(bytes, i, static_cast<int32_t>(e), c);
          if (c >= 0 && (U_GET_GC_MASK(c) & U_GC_N_MASK)) {
            if (run < start) next_pieces.emplace_back(run, start);
            next_pieces.emplace_back(start, i);
            run = i;
          }
        }
        if (run < e) next_pieces.emplace_back(run, e);
      }
    } else {
      std::unique_ptr<icu::RegexMatcher> m(stage.re->matcher(st));
      KVPACK_CHECK(U_SUCCESS(st), "ICU: cannot create regex matcher ({})", u_errorName(st));
      m->reset(ut);
      for (auto [b, e] : pieces) {
        // Opaque region bounds: lookahead cannot see past the piece, as in HF where each piece is its own string.
        m->region(b, e, st);
        int64_t last = b;
        while (m->find(st)) {
          const int64_t ms = m->start64(st), me = m->end64(st);
          if (me <= ms) continue;
          if (last < ms) next_pieces.emplace_back(last, ms);
          next_pieces.emplace_back(ms, me);
          last = me;
        }
        KVPACK_CHECK(U_SUCCESS(st), "ICU: regex matching failed ({}) for pattern {}", u_errorName(st), stage.pattern);
        if (last < e) next_pieces.emplace_back(last, e);
      }
    }
    pieces.swap(next_pieces);
  }
  return pieces;
}

void Tokenizer::Impl::encode_segment(std::string_view seg_in, std::vector<int32_t>& out) const {
  if (seg_in.empty()) return;
  std::string storage;
  std::string_view seg = seg_in;
  for (auto [b, e] : split(seg, storage)) {
    const auto ids = bpe(seg.substr(b, e - b));
    out.insert(out.end(), ids.begin(), ids.end());
  }
}

// ---------------------------------------------------------------------------------------------- construction

Tokenizer Tokenizer::from_vocab(const BpeVocab& v) {
  auto impl = std::make_shared<Impl>();
  impl->source = v.source;
  KVPACK_CHECK(!v.tokens.empty(), "{}: tokenizer has no tokens", v.source);
  KVPACK_CHECK(v.token_types.empty() || v.token_types.size() == v.tokens.size(),
               "{}: {} token types for {} tokens", v.source, v.token_types.size(), v.tokens.size());
  impl->tokens = v.tokens;
  const size_t n = v.tokens.size();
  impl->special.assign(n, 0);
  impl->added.assign(n, 0);
  for (size_t i = 0; i < v.token_types.size(); ++i) {
    impl->special[i] = v.token_types[i] == kTypeControl;
    impl->added[i] = v.token_types[i] == kTypeControl || v.token_types[i] == kTypeUserDefined;
  }
  auto check_id = [&](int32_t id, const char* what) {
    KVPACK_CHECK(id >= -1 && id < static_cast<int64_t>(n), "{}: {} id {} is outside the vocabulary (size {})",
                 v.source, what, id, n);
    return id;
  };
  impl->bos = check_id(v.bos_id, "bos");
  impl->eos = check_id(v.eos_id, "eos");
  impl->add_bos = v.add_bos && impl->bos >= 0;
  if (check_id(v.eot_id, "eot") >= 0) impl->eog.insert(v.eot_id);
  if (check_id(v.eom_id, "eom") >= 0) impl->eog.insert(v.eom_id);
  impl->chat_template = v.chat_template;
  impl->set_pre(v.pre);
  impl->finish(v.merges, {});
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  KVPACK_CHECK(model == "gpt2", "{}: tokenizer.ggml.model is '{}'; kvpack supports byte-level BPE ('gpt2') only",
               f.path(), model);
  BpeVocab v;
  v.source = f.path();
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  v.merges = f.get_string_array("tokenizer.ggml.merges");
  if (f.find("tokenizer.ggml.token_type")) {
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    v.token_types.assign(types.begin(), types.end());
  }
  v.pre = f.get_string_opt("tokenizer.ggml.pre").value_or("default");
  auto id = [&](const char* key) {
    const auto x = f.get_int_opt(key);
    return x ? static_cast<int32_t>(*x) : -1;
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.eot_id = id("tokenizer.ggml.eot_token_id");
  v.eom_id = id("tokenizer.ggml.eom_token_id");
  v.chat_template = f.get_string_opt("tokenizer.chat_template").value_or("");
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  return from_vocab(v);
}

namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVPACK_CHECK(in.good(), "{}: cannot open file", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tokenizer_config.json holds special tokens either as "text" or as {"content": "text", ...}.
std::optional<std::string> special_token_text(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  KVPACK_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "{}: no 'model' object", path);
  const auto& model = j["model"];
  const std::string type = model.value("type", std::string("BPE"));
  KVPACK_CHECK(type == "BPE", "{}: model.type is '{}'; only BPE is supported", path, type);
  KVPACK_CHECK(!model.value("byte_fallback", false), "{}: model.byte_fallback (SentencePiece-style BPE) is not supported", path);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(k);
    KVPACK_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()),
                 "{}: model.{} is not supported", path, k);
  }
  KVPACK_CHECK(model.contains("vocab") && model["vocab"].is_object(), "{}: model.vocab is missing or not an object", path);

  auto impl = std::make_shared<Impl>();
  impl->source = path;
  impl->ignore_merges = model.value("ignore_merges", false);
  // Vocabulary: model.vocab plus added_tokens (which may have ids beyond it).
  std::vector<std::pair<std::string, int64_t>> entries;
  int64_t max_id = -1;
  for (const auto& [tok, idv] : model["vocab"].items()) {
    KVPACK_CHECK(idv.is_number_integer() && idv.get<int64_t>() >= 0 && idv.get<int64_t>() < (int64_t(1) << 31),
                 "{}: model.vocab['{}'] is not a valid id", path, tok);
    entries.emplace_back(tok, idv.get<int64_t>());
    max_id = std::max(max_id, idv.get<int64_t>());
  }
  struct AddedTok {
    std::string content;
    int64_t id;
    bool special;
  };
  std::vector<AddedTok> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      KVPACK_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                       a["content"].is_string(),
                   "{}: an added_tokens entry lacks integer 'id' or string 'content'", path);
      const std::string content = a["content"];
      KVPACK_CHECK(!content.empty(), "{}: added token {} has empty content", path, a["id"].get<int64_t>());
      for (const char* k : {"lstrip", "rstrip", "single_word"})
        KVPACK_CHECK(!a.value(k, false), "{}: added token '{}' sets {}, which kvpack does not implement", path,
                     content, k);
      const int64_t id = a["id"];
      KVPACK_CHECK(id >= 0 && id < (int64_t(1) << 31), "{}: added token '{}' has invalid id {}", path, content, id);
      added.push_back({content, id, a.value("special", false)});
      max_id = std::max(max_id, id);
    }
  }
  KVPACK_CHECK(max_id >= 0, "{}: empty vocabulary", path);
  KVPACK_CHECK(max_id < (int64_t(1) << 24), "{}: vocabulary id {} is implausibly large", path, max_id);
  const size_t n = static_cast<size_t>(max_id + 1);
  impl->tokens.assign(n, std::string());
  impl->special.assign(n, 0);
  impl->added.assign(n, 0);
  for (auto& [tok, id] : entries) impl->tokens[id] = tok;
  for (const auto& a : added) {
    impl->tokens[a.id] = a.content;
    impl->added[a.id] = 1;
    impl->special[a.id] = a.special;
  }

  // Normalizer: none or NFC (Qwen2), possibly inside a Sequence.
  std::function<void(const nlohmann::json&)> normalizer = [&](const nlohmann::json& nj) {
    if (nj.is_null()) return;
    const std::string t = nj.value("type", std::string());
    if (t == "NFC") impl->nfc = true;
    else if (t == "Sequence") for (const auto& x : nj.value("normalizers", nlohmann::json::array())) normalizer(x);
    else fail("{}: normalizer type '{}' is not supported (only NFC)", path, t);
  };
  if (j.contains("normalizer")) normalizer(j["normalizer"]);

  // Pre-tokenizer: ByteLevel / Split / Digits, possibly inside a Sequence.
  std::vector<std::string> pre_desc;
  std::function<void(const nlohmann::json&)> pre = [&](const nlohmann::json& pj) {
    if (pj.is_null()) return;
    const std::string t = pj.value("type", std::string());
    if (t == "Sequence") {
      for (const auto& x : pj.value("pretokenizers", nlohmann::json::array())) pre(x);
    } else if (t == "ByteLevel") {
      KVPACK_CHECK(!pj.value("add_prefix_space", false),
                   "{}: pre_tokenizer ByteLevel.add_prefix_space=true is not supported", path);
      if (pj.value("use_regex", true)) {
        impl->add_regex_stage(kGpt2Regex);
        pre_desc.push_back("bytelevel");
      }
    } else if (t == "Split") {
      const std::string behavior = pj.value("behavior", std::string());
      KVPACK_CHECK(behavior == "Isolated", "{}: pre_tokenizer Split.behavior '{}' is not supported (only Isolated)",
                   path, behavior);
      KVPACK_CHECK(!pj.value("invert", false), "{}: pre_tokenizer Split.invert=true is not supported", path);
      const auto& p = pj.contains("pattern") ? pj["pattern"] : nlohmann::json();
      if (p.contains("Regex") && p["Regex"].is_string()) impl->add_regex_stage(p["Regex"].get<std::string>());
      else if (p.contains("String") && p["String"].is_string())
        impl->add_regex_stage(escape_regex_literal(p["String"].get<std::string>()));
      else fail("{}: pre_tokenizer Split.pattern must hold 'Regex' or 'String'", path);
      pre_desc.push_back("split");
    } else if (t == "Digits") {
      if (pj.value("individual_digits", false)) impl->add_digits_stage();
      else impl->add_regex_stage(R"(\p{N}+)");
      pre_desc.push_back("digits");
    } else {
      fail("{}: pre_tokenizer type '{}' is not supported (ByteLevel, Split, Digits, Sequence)", path, t);
    }
  };
  if (j.contains("pre_tokenizer")) pre(j["pre_tokenizer"]);
  impl->pre_name = "tokenizer.json:";
  for (size_t i = 0; i < pre_desc.size(); ++i) impl->pre_name += (i ? "+" : "") + pre_desc[i];

  // Merges: "a b" strings (older files) or ["a", "b"] pairs (tokenizers >= 0.20).
  std::vector<std::string> merge_strs;
  std::vector<std::pair<std::string, std::string>> merge_pairs;
  if (model.contains("merges")) {
    KVPACK_CHECK(model["merges"].is_array(), "{}: model.merges is not an array", path);
    size_t i = 0;
    for (const auto& m : model["merges"]) {
      if (m.is_string()) {
        KVPACK_CHECK(merge_pairs.empty(), "{}: model.merges mixes strings and pairs", path);
        merge_strs.push_back(m.get<std::string>());
      } else {
        KVPACK_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                     "{}: model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        KVPACK_CHECK(merge_strs.empty(), "{}: model.merges mixes strings and pairs", path);
        merge_pairs.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
      ++i;
    }
  }

  // bos/eos and the chat template live next to tokenizer.json in transformers' layout.
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::optional<std::string> bos_text, eos_text;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    const std::string cpath = (dir / "tokenizer_config.json").string();
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(read_text_file(cpath));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", cpath, e.what());
    }
    bos_text = special_token_text(cfg, "bos_token");
    eos_text = special_token_text(cfg, "eos_token");
    if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) impl->chat_template = cfg["chat_template"];
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) impl->add_bos = cfg["add_bos_token"];
  }
  if (impl->chat_template.empty() && std::filesystem::exists(dir / "chat_template.jinja"))
    impl->chat_template = read_text_file((dir / "chat_template.jinja").string());

  impl->finish(merge_strs, merge_pairs);
  auto resolve = [&](const std::optional<std::string>& t, const char* what) {
    if (!t) return -1;
    const int32_t id = impl->id_of(*t);
    KVPACK_CHECK(id >= 0, "{}: {} '{}' from tokenizer_config.json is not in the vocabulary", path, what, *t);
    return id;
  };
  impl->bos = resolve(bos_text, "bos_token");
  impl->eos = resolve(eos_text, "eos_token");
  impl->add_bos = impl->add_bos && impl->bos >= 0;
  if (impl->eos >= 0) impl->eog.insert(impl->eos);
  return Tokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------------------------- public API

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& im = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && im.bos >= 0) out.push_back(im.bos);
  // Cut out added tokens first (leftmost, then longest), then pre-tokenize and BPE the text between them.
  size_t seg_start = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& cands = im.added_by_first[static_cast<uint8_t>(text[i])];
    const Impl::Added* hit = nullptr;
    for (uint32_t k : cands) {
      const auto& a = im.added_list[k];
      if ((parse_special || !a.special) && text.substr(i, a.text.size()) == a.text) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    im.encode_segment(text.substr(seg_start, i - seg_start), out);
    out.push_back(hit->id);
    i += hit->text.size();
    seg_start = i;
  }
  im.encode_segment(text.substr(seg_start), out);
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::string storage;
  for (auto [b, e] : impl_->split(text, storage)) out.emplace_back(text.substr(b, e - b));
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& im = *impl_;
  KVPACK_CHECK(id >= 0 && id < static_cast<int64_t>(im.tokens.size()), "token id {} is outside the vocabulary (size {})",
               id, im.tokens.size());
  const std::string& t = im.tokens[id];
  if (im.added[id]) return t;
  const auto& bm = byte_map();
  std::string out;
  const auto* p = reinterpret_cast<const uint8_t*>(t.data());
  const int32_t n = static_cast<int32_t>(t.size());
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c >= 0 && c < static_cast<UChar32>(bm.to_byte.size()) && bm.to_byte[c] >= 0)
      out += static_cast<char>(bm.to_byte[c]);
    else
      out.append(t, start, i - start);  // not in the byte alphabet: keep as written
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  KVPACK_CHECK(id >= 0 && id < static_cast<int64_t>(impl_->tokens.size()),
               "token id {} is outside the vocabulary (size {})", id, impl_->tokens.size());
  return impl_->tokens[id];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view t) const {
  const int32_t id = impl_->id_of(t);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos_default() const { return impl_->add_bos; }
bool Tokenizer::is_eog(int32_t id) const { return impl_->eog.count(id) != 0; }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int64_t>(impl_->special.size()) && impl_->special[id];
}
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::pre_tokenizer() const { return impl_->pre_name; }

std::string Tokenizer::chat_template_kind() const {
  if (!impl_->template_error.empty()) fail("{}: {}", impl_->source, impl_->template_error);
  return impl_->template_kind;
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const {
  const Impl& im = *impl_;
  KVPACK_CHECK(!im.chat_template.empty(), "{}: the model has no chat template", im.source);
  if (!im.template_error.empty()) fail("{}: {}", im.source, im.template_error);
  return render_chat(im.template_info, msgs, add_generation_prompt, im.bos >= 0 ? im.tokens[im.bos] : std::string());
}

// ---------------------------------------------------------------------------------------------- streaming

std::string DecodeStream::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  // Emit everything up to the last position where a UTF-8 sequence could still be incomplete.
  const auto* p = reinterpret_cast<const uint8_t*>(pending_.data());
  const size_t n = pending_.size();
  size_t keep_from = n;
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = p[n - back];
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for its lead
    const size_t need = U8_COUNT_TRAIL_BYTES(b) + 1;
    if (b >= 0xC2 && b <= 0xF4 && need > back) keep_from = n - back;
    break;
  }
  std::string out = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return out;
}

std::string DecodeStream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace kvpack
