// Tokenizer tests against HF `tokenizers` / transformers reference output (tests/data/tokenizer, made by
// scripts/make_tokenizer_fixtures.py). Every flavour (smollm2, gpt2, llama3, qwen2) is a patch of the SmolLM2
// tokenizer.json; the patch applied here is the one the script applies before it computed the reference ids.
#include <gtest/gtest.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "kvpack/error.h"
#include "kvpack/gguf.h"
#include "kvpack/tokenizer.h"

namespace fs = std::filesystem;
using kvpack::Tokenizer;
using nlohmann::json;

namespace {

const fs::path kDir = fs::path(KVPACK_TEST_DATA) / "tokenizer";


std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << p;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
const json& load_json(const std::string& name) {
  static std::map<std::string, json> cache;
  static std::mutex mu;
  std::lock_guard lk(mu);
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, json::parse(slurp(kDir / name))).first;
  return it->second;
}
const json& texts() { return load_json("texts.json"); }

fs::path scratch_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("kvpack_tok_{}_{}", name, ::getpid());
  fs::create_directories(d);
  return d;
}

// Writes the flavour's tokenizer.json + tokenizer_config.json (same patch as apply_flavour() in the script).
fs::path write_flavour(const std::string& flavour) {
  json j = load_json("smollm2/tokenizer.json");
  json cfg = load_json("smollm2/tokenizer_config.json");
  const json& p = load_json("flavours.json").at(flavour);
  if (p.contains("pre_tokenizer")) j["pre_tokenizer"] = p["pre_tokenizer"];
  if (p.contains("normalizer")) j["normalizer"] = p["normalizer"];
  if (p.value("ignore_merges", false)) j["model"]["ignore_merges"] = true;
  if (p.value("merges_as_strings", false)) {
    json m = json::array();
    for (const auto& pr : j["model"]["merges"]) m.push_back(pr[0].get<std::string>() + " " + pr[1].get<std::string>());
    j["model"]["merges"] = m;
  }
  if (p.contains("extra_added_tokens"))
    for (const auto& a : p["extra_added_tokens"]) j["added_tokens"].push_back(a);
  if (p.contains("tokenizer_config"))
    for (const auto& [k, v] : p["tokenizer_config"].items()) cfg[k] = v;
  const fs::path d = scratch_dir(flavour);
  std::ofstream(d / "tokenizer.json") << j.dump();
  std::ofstream(d / "tokenizer_config.json") << cfg.dump();
  return d / "tokenizer.json";
}

const Tokenizer& flavour(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  static std::mutex mu;
  std::lock_guard lk(mu);
  auto it = cache.find(name);
  if (it == cache.end()) {
    const fs::path p = write_flavour(name);
    it = cache.emplace(name, Tokenizer::from_tokenizer_json(p.string())).first;
    fs::remove_all(p.parent_path());
  }
  return it->second;
}

std::string model_path() {
  const char* e = std::getenv("KVPACK_MODEL");
  return e ? e : std::string(KVPACK_SOURCE_DIR) + "/models/smollm2-135m-instruct.gguf";
}
bool require_model() {
  const char* e = std::getenv("KVPACK_REQUIRE_MODEL");
  return e && std::string(e) == "1";
}
#define SKIP_WITHOUT_MODEL()                                                       \
  do {                                                                             \
    if (!fs::exists(model_path())) {                                               \
      if (require_model()) FAIL() << "model missing: " << model_path();            \
      GTEST_SKIP() << "model not found: " << model_path();                         \
    }                                                                              \
  } while (0)

std::vector<int32_t> ids_of(const json& a) { return a.get<std::vector<int32_t>>(); }

std::string nfc(const std::string& s) {
  UErrorCode st = U_ZERO_ERROR;
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  std::string out;
  icu::Normalizer2::getNFCInstance(st)->normalize(u, st).toUTF8String(out);
  return out;
}

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  int32_t i = 0, n = static_cast<int32_t>(s.size());
  while (i < n) {
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c < 0) return false;
  }
  return true;
}

class TokenizerFlavour : public ::testing::TestWithParam<std::string> {};

// Exact ids for every fixture text, with and without special-token parsing.
TEST_P(TokenizerFlavour, MatchesReferenceIds) {
  const Tokenizer& tok = flavour(GetParam());
  const json& exp = load_json("expected_" + GetParam() + ".json");
  size_t n_ids = 0;
  for (const auto& [name, text] : texts().items()) {
    const std::string s = text.get<std::string>();
    const auto want = ids_of(exp["special"][name]);
    EXPECT_EQ(tok.encode(s), want) << GetParam() << " text '" << name << "' (parse_special)";
    EXPECT_EQ(tok.encode(s, false, false), ids_of(exp["nospecial"][name]))
        << GetParam() << " text '" << name << "' (no parse_special)";
    n_ids += want.size();
  }
  EXPECT_GT(n_ids, 10000u);
}

// GPT-2's byte -> code point alphabet, written out independently of the library as the test's oracle.
std::string to_byte_alphabet(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174))) {
      int n = 0;
      for (int x = 0; x < b; ++x)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174))) ++n;
      cp = 256 + n;
    }
    char buf[4];
    int32_t len = 0;
    U8_APPEND_UNSAFE(buf, len, cp);
    out.append(buf, len);
  }
  return out;
}

// The pre-tokenizer pieces themselves (ICU regexes vs HF's Oniguruma ones), independent of what BPE can merge:
// e.g. Llama-3's \p{N}{1,3} vs Qwen2's \p{N} give the same ids with SmolLM2's single-digit vocabulary.
TEST_P(TokenizerFlavour, PreTokenizerPiecesMatchReference) {
  const Tokenizer& tok = flavour(GetParam());
  const json& exp = load_json("expected_" + GetParam() + ".json");
  for (const auto& [name, text] : texts().items()) {
    // The reference cut the text at 4000 code points.
    const std::string full = text.get<std::string>();
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(full);
    std::string cut;
    u.tempSubString(0, u.moveIndex32(0, std::min<int32_t>(4000, u.countChar32()))).toUTF8String(cut);
    std::vector<std::string> got;
    for (const auto& p : tok.pre_tokenize(cut)) got.push_back(to_byte_alphabet(p));
    EXPECT_EQ(got, exp["pieces"][name].get<std::vector<std::string>>()) << GetParam() << " text '" << name << "'";
  }
}

TEST_P(TokenizerFlavour, DecodeInvertsEncode) {
  const Tokenizer& tok = flavour(GetParam());
  for (const auto& [name, text] : texts().items()) {
    if (name == "missing_bytes") continue;  // bytes absent from the vocabulary are dropped (checked by ids)
    const std::string s = text.get<std::string>();
    const std::string want = GetParam() == "qwen2" ? nfc(s) : s;  // Qwen2 normalizes to NFC before splitting
    EXPECT_EQ(tok.decode(tok.encode(s)), want) << name;
    EXPECT_EQ(tok.decode(tok.encode(s, false, false)), want) << name;
  }
}

TEST_P(TokenizerFlavour, ChatTemplateMatchesTransformers) {
  const Tokenizer& tok = flavour(GetParam());
  for (const auto& c : load_json("chat.json").at(GetParam())) {
    std::vector<kvpack::ChatMessage> msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    const std::string got = tok.apply_chat_template(msgs, c["gen"].get<bool>());
    EXPECT_EQ(got, c["text"].get<std::string>()) << GetParam() << " case " << c["name"];
    EXPECT_EQ(tok.encode(got), ids_of(c["ids"])) << GetParam() << " case " << c["name"];
  }
  EXPECT_THROW(tok.apply_chat_template({}, true), kvpack::Error);
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerFlavour, ::testing::Values("smollm2", "gpt2", "llama3", "qwen2"),
                         [](const auto& info) { return info.param; });

// Random bytes, valid UTF-8 or not, survive encode -> decode exactly when every byte is in the vocabulary
// (SmolLM2 lacks 21 byte tokens, e.g. 0xFF and 0xF1; see the missing_bytes fixture).
TEST(Tokenizer, RandomBytesRoundTrip) {
  const Tokenizer& tok = flavour("smollm2");
  std::mt19937 rng(1234);
  const std::vector<std::string> pool = {"a", "Z", " ", "  ", "\n", "\t", "7", "42", "é", "日", "👋", "'s", "<|im_end|>",
                                         "\xe2\x80", "\xc3", "\x80", "\r\n", "ſ", "٣", "\xf0\x9f", "."};
  for (int iter = 0; iter < 300; ++iter) {
    std::string s;
    const int len = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < len; ++i) s += pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    for (bool special : {true, false}) {
      const auto ids = tok.encode(s, false, special);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
      ASSERT_EQ(tok.decode(ids), s) << "iteration " << iter;
    }
  }
}

TEST(Tokenizer, DecodeStreamEmitsOnlyWholeCharacters) {
  const Tokenizer& tok = flavour("smollm2");
  const std::string s = texts()["emoji"].get<std::string>() + texts()["cjk"].get<std::string>() +
                        texts()["combining"].get<std::string>();
  kvpack::DecodeStream ds(tok);
  std::string all;
  int partial_tokens = 0;
  for (int32_t id : tok.encode(s)) {
    const std::string piece = ds.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << "token " << id;
    if (!valid_utf8(tok.token_bytes(id))) ++partial_tokens;
    all += piece;
  }
  all += ds.flush();
  EXPECT_EQ(all, s);
  EXPECT_GT(partial_tokens, 0) << "the text should exercise tokens that split a UTF-8 character";
}

TEST(Tokenizer, SpecialTokensAndIds) {
  const Tokenizer& tok = flavour("smollm2");
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.is_eog(2));
  EXPECT_TRUE(tok.is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(tok.is_eog(1));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_EQ(tok.token_text(1), "<|im_start|>");
  EXPECT_EQ(tok.token_id("<|im_end|>"), 2);
  EXPECT_EQ(tok.encode("hi", true), (std::vector<int32_t>{1, tok.encode("hi")[0]}));
  EXPECT_EQ(tok.encode("<|im_end|>"), std::vector<int32_t>{2});
  EXPECT_GT(tok.encode("<|im_end|>", false, false).size(), 1u);
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
  EXPECT_THROW(tok.token_text(-1), kvpack::Error);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{49152}), kvpack::Error);
  EXPECT_EQ(tok.chat_template_kind(), "chatml");

  const Tokenizer& l3 = flavour("llama3");
  EXPECT_EQ(l3.vocab_size(), 49157);
  EXPECT_EQ(l3.token_text(l3.bos_id()), "<|begin_of_text|>");
  EXPECT_TRUE(l3.is_eog(*l3.token_id("<|eot_id|>")));
  EXPECT_EQ(l3.chat_template_kind(), "llama3");
  EXPECT_EQ(flavour("qwen2").bos_id(), -1);
}

TEST(ChatTemplate, UnknownAndUnsupportedTemplatesAreErrors) {
  EXPECT_THROW(kvpack::parse_chat_template("{{ messages }}"), kvpack::Error);
  EXPECT_THROW(kvpack::parse_chat_template(""), kvpack::Error);
  EXPECT_THROW(kvpack::parse_chat_template("<|start_header_id|> Cutting Knowledge Date: ..."), kvpack::Error);
  const auto info = kvpack::parse_chat_template(
      "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}");
  EXPECT_EQ(info.kind, "chatml");
  EXPECT_FALSE(info.default_system.has_value());
  try {
    kvpack::parse_chat_template("[INST] {{ x }} [/INST]");
    FAIL();
  } catch (const kvpack::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown template"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, BadTokenizerJsonGivesClearErrors) {
  const fs::path d = scratch_dir("bad");
  auto expect_error = [&](const std::string& content, const std::string& needle) {
    std::ofstream(d / "tokenizer.json") << content;
    try {
      Tokenizer::from_tokenizer_json((d / "tokenizer.json").string());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const kvpack::Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("tokenizer.json"), std::string::npos) << w;
      EXPECT_NE(w.find(needle), std::string::npos) << w;
    }
  };
  expect_error("{not json", "not valid JSON");
  expect_error(R"({"model": {"type": "Unigram", "vocab": {}}})", "only BPE");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c"]}})", "merge 0");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Whitespace"}})",
               "Whitespace");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}})", "merges[0]");
  fs::remove_all(d);
  EXPECT_THROW(Tokenizer::from_tokenizer_json("/nonexistent/tokenizer.json"), kvpack::Error);
}

// GGUF-style vocabularies (token list + types + "a b" merges + tokenizer.ggml.pre name) for each pre-tokenizer,
// built from the fixture; they must give the same ids as the corresponding HF flavour.
TEST(Tokenizer, GgufPreTokenizerNamesMatchHfFlavours) {
  const json& base = load_json("smollm2/tokenizer.json");
  kvpack::BpeVocab v;
  v.source = "fixture";
  v.tokens.resize(base["model"]["vocab"].size());
  v.token_types.assign(v.tokens.size(), 1);
  for (const auto& [t, id] : base["model"]["vocab"].items()) v.tokens[id.get<size_t>()] = t;
  for (const auto& a : base["added_tokens"]) v.token_types[a["id"].get<size_t>()] = 3;
  for (const auto& m : base["model"]["merges"]) v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  const std::map<std::string, std::string> pre_to_flavour = {
      {"smollm", "smollm2"}, {"gpt2", "gpt2"}, {"llama-bpe", "llama3"}, {"qwen2", "qwen2"}};
  for (const auto& [pre, flav] : pre_to_flavour) {
    kvpack::BpeVocab w = v;
    w.pre = pre;
    if (flav == "llama3")
      for (const auto& a : load_json("flavours.json")["llama3"]["extra_added_tokens"]) {
        w.tokens.push_back(a["content"]);
        w.token_types.push_back(3);
      }
    const Tokenizer tok = Tokenizer::from_vocab(w);
    EXPECT_EQ(tok.pre_tokenizer(), pre);
    const json& exp = load_json("expected_" + flav + ".json");
    for (const auto& [name, text] : texts().items())
      EXPECT_EQ(tok.encode(text.get<std::string>()), ids_of(exp["special"][name])) << pre << " text " << name;
  }
  kvpack::BpeVocab bad = v;
  bad.pre = "falcon";
  EXPECT_THROW(Tokenizer::from_vocab(bad), kvpack::Error);
}

// The real model file: GGUF-built and tokenizer.json-built SmolLM2 tokenizers agree on every text and template.
TEST(Tokenizer, GgufMatchesTokenizerJson) {
  SKIP_WITHOUT_MODEL();
  const auto f = kvpack::GgufFile::open(model_path());
  const Tokenizer g = Tokenizer::from_gguf(f);
  const Tokenizer& j = flavour("smollm2");
  EXPECT_EQ(g.vocab_size(), j.vocab_size());
  EXPECT_EQ(g.bos_id(), j.bos_id());
  EXPECT_EQ(g.eos_id(), j.eos_id());
  EXPECT_EQ(g.pre_tokenizer(), "smollm");
  EXPECT_EQ(g.chat_template(), j.chat_template());
  EXPECT_FALSE(g.add_bos_default());  // SmolLM2: tokenizer.ggml.add_bos_token = false
  const json& exp = load_json("expected_smollm2.json");
  for (const auto& [name, text] : texts().items()) {
    const std::string s = text.get<std::string>();
    EXPECT_EQ(g.encode(s), ids_of(exp["special"][name])) << name;
    EXPECT_EQ(g.encode(s, false, false), ids_of(exp["nospecial"][name])) << name;
    if (name != "missing_bytes") EXPECT_EQ(g.decode(g.encode(s)), s) << name;
  }
  for (const auto& c : load_json("chat.json").at("smollm2")) {
    std::vector<kvpack::ChatMessage> msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    EXPECT_EQ(g.apply_chat_template(msgs, c["gen"].get<bool>()), c["text"].get<std::string>()) << c["name"];
  }
  for (int32_t id = 0; id < g.vocab_size(); ++id) ASSERT_EQ(g.token_text(id), j.token_text(id)) << id;
}

// One Tokenizer shared by several threads (the BPE cache is the only shared mutable state).
TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  const Tokenizer& tok = flavour("gpt2");
  const std::string s = texts()["eval-b"].get<std::string>();
  const auto want = ids_of(load_json("expected_gpt2.json")["special"]["eval-b"]);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t) th.emplace_back([&, t] { got[t] = tok.encode(s.substr(0, 5000 * (t + 1))); });
  for (auto& x : th) x.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], tok.encode(s.substr(0, 5000 * (t + 1)))) << t;
  EXPECT_EQ(tok.encode(s), want);
}

// A 400 KB text must tokenize in well under a few seconds (the BPE cache makes repeated words free).
TEST(Tokenizer, LargeTextIsFast) {
  const fs::path p = fs::path(KVPACK_SOURCE_DIR) / "data" / "eval-a.txt";
  if (!fs::exists(p)) GTEST_SKIP() << "no " << p;
  const std::string s = slurp(p);
  const fs::path tj = write_flavour("smollm2");  // a fresh tokenizer: cold BPE cache
  const Tokenizer tok = Tokenizer::from_tokenizer_json(tj.string());
  fs::remove_all(tj.parent_path());
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(s);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ perf ] encode %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n", s.size(), ids.size(), sec,
              s.size() / sec / 1e6);
  EXPECT_EQ(tok.decode(ids), s);
  EXPECT_LT(sec, 3.0);
}

}  // namespace
