// Quality-harness tests on synthetic logits: exact KL / top-1 / NLL values, aggregation, windowing, reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "kvpack/error.h"
#include "kvpack/eval.h"

using namespace kvpack;

namespace {

// KL(p || q) of two logit vectors in long double, straight from the definition (the oracle).
long double kl_oracle(const std::vector<float>& a, const std::vector<float>& b) {
  auto lse = [](const std::vector<float>& x) {
    long double m = x[0];
    for (float v : x) m = std::max<long double>(m, v);
    long double s = 0;
    for (float v : x) s += std::exp(static_cast<long double>(v) - m);
    return m + std::log(s);
  };
  const long double la = lse(a), lb = lse(b);
  long double kl = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const long double lp = a[i] - la, lq = b[i] - lb;
    kl += std::exp(lp) * (lp - lq);
  }
  return kl;
}

std::vector<float> random_logits(std::mt19937_64& rng, int n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);  // values only; exactness is checked against the oracle
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

PositionScore score(const std::vector<float>& ref_logits, const std::vector<float>& fmt_logits, int target) {
  const int V = static_cast<int>(ref_logits.size());
  std::vector<float> lp(ref_logits.size());
  log_softmax(ref_logits.data(), V, lp.data());
  return score_position({lp.data(), argmax(lp.data(), V)}, fmt_logits.data(), V, target);
}

}  // namespace

TEST(EvalMetrics, LogSoftmaxKnownValues) {
  // logits log(1), log(2), log(3), log(4) + 7: probabilities 0.1, 0.2, 0.3, 0.4 whatever the shift.
  std::vector<float> x{std::log(1.0f) + 7, std::log(2.0f) + 7, std::log(3.0f) + 7, std::log(4.0f) + 7};
  std::vector<float> out(4);
  const double lse = log_softmax(x.data(), 4, out.data());
  EXPECT_NEAR(lse, 7 + std::log(10.0), 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], std::log((i + 1) / 10.0), 1e-6);
}

TEST(EvalMetrics, TwoTokenKlClosedForm) {
  // p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3).
  const auto s = score({0.0f, 0.0f}, {0.0f, std::log(3.0f)}, 1);
  EXPECT_NEAR(s.kl, 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_TRUE(s.top1_match == false);  // ref argmax 0 (first on ties), fmt argmax 1
  EXPECT_NEAR(s.nll_ref, std::log(2.0), 1e-7);
  EXPECT_NEAR(s.nll_fmt, -std::log(0.75), 1e-7);
}

TEST(EvalMetrics, IdenticalLogitsGiveExactlyZero) {
  std::mt19937_64 rng(7);
  for (int rep = 0; rep < 5; ++rep) {
    const auto a = random_logits(rng, 49152, 4.0f);
    const auto s = score(a, a, 123);
    EXPECT_EQ(s.kl, 0.0);  // exact: both sides go through the same rounding
    EXPECT_TRUE(s.top1_match);
    EXPECT_EQ(s.nll_ref, s.nll_fmt);
  }
}

TEST(EvalMetrics, KlMatchesOracleOnRandomLogits) {
  std::mt19937_64 rng(11);
  for (float noise : {1e-3f, 1e-2f, 1e-1f, 1.0f}) {
    const auto a = random_logits(rng, 49152, 3.0f);
    auto b = a;
    std::normal_distribution<float> nd(0.0f, noise);
    for (auto& x : b) x += nd(rng);
    const auto s = score(a, b, 5);
    const double want = static_cast<double>(kl_oracle(a, b));
    // Float log-probs limit the absolute accuracy to ~1e-6 of the per-term magnitudes.
    EXPECT_NEAR(s.kl, want, 2e-6 + 1e-4 * want) << "noise " << noise;
    EXPECT_GT(s.kl, 0.0);
  }
}

TEST(EvalMetrics, TopOneAndArgmaxTies) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 3, 2}.data(), 4), 1);
  const auto s = score({0, 5, 1}, {0, 4, 1}, 0);
  EXPECT_TRUE(s.top1_match);
  const auto t = score({0, 5, 1}, {0, 4, 6}, 0);
  EXPECT_FALSE(t.top1_match);
}

TEST(EvalMetrics, RejectsNaNLogitsAndBadTarget) {
  std::vector<float> nan(4, std::nanf(""));
  std::vector<float> out(4);
  EXPECT_THROW(log_softmax(nan.data(), 4, out.data()), Error);
  EXPECT_THROW(score({0, 1, 2}, {0, 1, 2}, 3), Error);
}

TEST(EvalMetrics, QuantileNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(quantile(v, 0.99), 99.0);
  EXPECT_EQ(quantile(v, 1.0), 100.0);
  EXPECT_EQ(quantile(v, 0.0), 1.0);
  EXPECT_EQ(quantile({}, 0.5), 0.0);
  std::vector<double> w;
  for (int i = 1; i <= 1000; ++i) w.push_back(i);
  EXPECT_EQ(quantile(w, 0.99), 990.0);
}

TEST(EvalMetrics, ScoreLogStatsAndBuckets) {
  ScoreLog log;
  // positions 0..9: kl = pos, top1 matches on even positions, nll_ref 1, nll_fmt 1 + pos/10
  for (int p = 0; p < 10; ++p) {
    PositionScore s;
    s.kl = p;
    s.top1_match = p % 2 == 0;
    s.nll_ref = 1;
    s.nll_fmt = 1 + p / 10.0;
    log.add(p, s);
  }
  const Stats all = log.stats();
  EXPECT_EQ(all.positions, 10);
  EXPECT_DOUBLE_EQ(all.kl_mean, 4.5);
  EXPECT_DOUBLE_EQ(all.kl_p99, 9);
  EXPECT_DOUBLE_EQ(all.kl_max, 9);
  EXPECT_DOUBLE_EQ(all.top1_agreement, 0.5);
  EXPECT_NEAR(all.delta_nll, 0.45, 1e-12);
  EXPECT_NEAR(all.ppl, std::exp(1.45), 1e-12);
  const Stats b = log.stats(2, 5);  // positions 2, 3, 4
  EXPECT_EQ(b.positions, 3);
  EXPECT_DOUBLE_EQ(b.kl_mean, 3);
  EXPECT_NEAR(b.top1_agreement, 2.0 / 3.0, 1e-15);
  EXPECT_EQ(log.stats(20, 30).positions, 0);
}

TEST(EvalMetrics, BucketEdges) {
  EXPECT_EQ(default_bucket_edges(8192), (std::vector<int64_t>{0, 64, 512, 2048, 4096, 8192}));
  EXPECT_EQ(default_bucket_edges(2048), (std::vector<int64_t>{0, 64, 512, 2048}));
  EXPECT_EQ(default_bucket_edges(100), (std::vector<int64_t>{0, 64, 100}));
  EXPECT_EQ(plot_bin_edges(8), (std::vector<int64_t>{0, 1, 2, 4, 8}));
  EXPECT_EQ(plot_bin_edges(10), (std::vector<int64_t>{0, 1, 2, 4, 8, 10}));
}

namespace {

// Deterministic toy "model": logits at each position depend on the window's tokens so far; every format other than
// bf16 adds a format-specific perturbation, so its KL against bf16 is known to be > 0 and exactly reproducible.
class ToyModel final : public WindowLogits {
 public:
  explicit ToyModel(int vocab, int chunk) : V_(vocab), chunk_(chunk) {}
  int vocab_size() const override { return V_; }
  void run(Format f, std::span<const int32_t> tokens,
           const std::function<void(int, int, const float*)>& cb) override {
    calls.push_back({f, static_cast<int>(tokens.size()), tokens.empty() ? -1 : tokens[0]});
    const int n = static_cast<int>(tokens.size());
    std::vector<float> buf;
    for (int first = 0; first < n; first += chunk_) {
      const int m = std::min(chunk_, n - first);
      buf.assign(static_cast<size_t>(m) * V_, 0.0f);
      for (int i = 0; i < m; ++i) logits(f, tokens.subspan(0, static_cast<size_t>(first + i + 1)), buf.data() + static_cast<size_t>(i) * V_);
      cb(first, m, buf.data());
    }
  }
  // Logits of the last token of `prefix` under format f.
  void logits(Format f, std::span<const int32_t> prefix, float* out) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : prefix) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    std::mt19937_64 rng(h);
    for (int j = 0; j < V_; ++j) out[j] = static_cast<float>(static_cast<double>(rng() >> 40) / (1 << 22));
    if (f != Format::bf16) {
      std::mt19937_64 noise(h ^ (static_cast<uint64_t>(f) * 0x9e3779b97f4a7c15ull));
      const double scale = 0.05 * static_cast<int>(f);
      for (int j = 0; j < V_; ++j) out[j] += static_cast<float>(scale * (static_cast<double>(noise() >> 40) / (1 << 24) - 0.5));
    }
  }
  struct Call {
    Format f;
    int n, first_token;
  };
  std::vector<Call> calls;

 private:
  int V_, chunk_;
};

std::vector<int32_t> toy_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

}  // namespace

TEST(EvalDriver, WindowsTargetsAndExactReference) {
  constexpr int V = 97;
  ToyModel model(V, 7);  // chunk 7: windows arrive in several uneven chunks
  const std::vector<EvalText> texts{{"a", toy_tokens(100, V, 1)}, {"b", toy_tokens(60, V, 2)}};
  EvalConfig cfg;
  cfg.window = 32;
  cfg.max_positions = 70;
  cfg.progress = false;
  const EvalResult r = run_eval(model, texts, {Format::int4, Format::q3, Format::int4}, cfg);

  ASSERT_EQ(r.texts.size(), 3u);  // a, b, pooled
  EXPECT_EQ(r.texts[0].text, "a");
  EXPECT_EQ(r.texts[2].text, "pooled");
  ASSERT_EQ(r.texts[0].formats.size(), 3u);  // bf16 added first, duplicate int4 dropped
  EXPECT_EQ(r.texts[0].formats[0].format, Format::bf16);
  EXPECT_EQ(r.texts[0].formats[1].format, Format::int4);
  EXPECT_EQ(r.texts[0].formats[2].format, Format::q3);
  // Text a: 70 positions in windows of 32, 32, 6. Text b: only 59 positions have a next token.
  EXPECT_EQ(r.texts[0].formats[0].all.positions, 70);
  EXPECT_EQ(r.texts[1].formats[0].all.positions, 59);
  EXPECT_EQ(r.texts[2].formats[1].all.positions, 129);
  // Window starts of text a: 0, 32, 64, for each of the 3 formats.
  ASSERT_EQ(model.calls.size(), 3u * 3u + 2u * 3u);
  EXPECT_EQ(model.calls[0].n, 32);
  EXPECT_EQ(model.calls[3].first_token, texts[0].tokens[32]);
  EXPECT_EQ(model.calls[6].n, 6);
  EXPECT_EQ(model.calls[6].first_token, texts[0].tokens[64]);

  const auto& bf = r.texts[0].formats[0].all;
  EXPECT_EQ(bf.kl_mean, 0.0);
  EXPECT_EQ(bf.top1_agreement, 1.0);
  EXPECT_EQ(bf.delta_nll, 0.0);
  const auto& i4 = r.texts[0].formats[1].all;
  const auto& q3 = r.texts[0].formats[2].all;
  EXPECT_GT(i4.kl_mean, 0.0);
  EXPECT_GT(q3.kl_mean, i4.kl_mean);  // larger perturbation
  EXPECT_GE(i4.kl_p99, i4.kl_mean);
  EXPECT_DOUBLE_EQ(r.texts[0].formats[1].bits_per_element, 4.5);

  // Recompute text a's bf16 NLL and int4 KL by brute force from the toy model: the driver must match exactly.
  double nll = 0, kl = 0;
  std::vector<float> a(V), b(V), lp(V);
  for (int s = 0; s < 70; s += 32) {
    const int n = std::min(32, 70 - s);
    for (int i = 0; i < n; ++i) {
      std::span<const int32_t> prefix(texts[0].tokens.data() + s, static_cast<size_t>(i + 1));
      model.logits(Format::bf16, prefix, a.data());
      model.logits(Format::int4, prefix, b.data());
      log_softmax(a.data(), V, lp.data());
      const int target = texts[0].tokens[static_cast<size_t>(s + i + 1)];
      nll += -lp[static_cast<size_t>(target)];
      kl += score_position({lp.data(), argmax(lp.data(), V)}, b.data(), V, target).kl;
    }
  }
  EXPECT_NEAR(bf.nll_mean, nll / 70, 1e-12);
  EXPECT_NEAR(i4.kl_mean, kl / 70, 1e-12);

  // Buckets for a longest window of 32: [0,32) only; plot bins 0,1,2,4,8,16,32.
  EXPECT_EQ(r.bucket_edges, (std::vector<int64_t>{0, 32}));
  EXPECT_EQ(r.plot_edges.size(), 7u);
  int64_t in_bins = 0;
  for (const auto& s : r.texts[0].formats[1].plot_bins) in_bins += s.positions;
  EXPECT_EQ(in_bins, 70);
}

TEST(EvalDriver, BosWindowsScoreEveryToken) {
  constexpr int V = 50;
  ToyModel model(V, 64);
  const std::vector<EvalText> texts{{"a", toy_tokens(40, V, 3)}};
  EvalConfig cfg;
  cfg.window = 16;
  cfg.max_positions = 1000;
  cfg.bos_id = 49;
  cfg.progress = false;
  const EvalResult r = run_eval(model, texts, {Format::int4}, cfg);
  EXPECT_EQ(r.texts.size(), 1u);  // no pooled row for one text
  EXPECT_EQ(r.texts[0].formats[0].all.positions, 40);  // with BOS every token is a target
  EXPECT_EQ(model.calls[0].first_token, 49);
  EXPECT_EQ(model.calls[0].n, 16);
}

TEST(EvalDriver, JsonTableAndErrors) {
  constexpr int V = 64;
  ToyModel model(V, 16);
  const std::vector<EvalText> texts{{"a", toy_tokens(80, V, 4)}};
  EvalConfig cfg;
  cfg.window = 40;
  cfg.max_positions = 79;
  cfg.progress = false;
  const EvalResult r = run_eval(model, texts, {Format::q4}, cfg);
  const nlohmann::json j = eval_to_json(r);
  ASSERT_EQ(j["formats"].size(), 2u);
  for (const char* key : {"format", "bits_per_element", "kl_mean", "kl_p99", "top1_agreement", "positions"})
    EXPECT_TRUE(j["formats"][1].contains(key)) << key;
  EXPECT_EQ(j["formats"][1]["format"], "q4");
  EXPECT_EQ(j["formats"][1]["positions"], 79);
  EXPECT_DOUBLE_EQ(j["formats"][1]["bits_per_element"].get<double>(), 4.0);
  EXPECT_EQ(j["formats"][1]["buckets"].size(), 1u);
  const std::string table = eval_to_table(r);
  EXPECT_NE(table.find("q4"), std::string::npos);
  EXPECT_NE(table.find("mean KL by position bucket"), std::string::npos);

  EvalConfig bad = cfg;
  bad.window = 1;
  EXPECT_THROW(run_eval(model, texts, {Format::q4}, bad), Error);
  try {
    run_eval(model, {{"tiny", {1}}}, {Format::q4}, cfg);
    FAIL() << "expected an error for a one-token text";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny"), std::string::npos);
  }
}

TEST(EvalDriver, PlotWritesPng) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot not installed";
  constexpr int V = 64;
  ToyModel model(V, 16);
  EvalConfig cfg;
  cfg.window = 64;
  cfg.max_positions = 64;
  cfg.progress = false;
  const EvalResult r = run_eval(model, {{"a", toy_tokens(100, V, 5)}}, {Format::int4, Format::q4}, cfg);
  const auto png = std::filesystem::temp_directory_path() / "kvpack_test_eval_plot.png";
  plot_eval(r, png.string());
  std::ifstream in(png, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  std::filesystem::remove(png);
}

// ---- end to end on SmolLM2 (skipped without the model unless KVPACK_REQUIRE_MODEL=1)

#include "kvpack/llama.h"
#include "kvpack/tokenizer.h"

namespace {

std::string eval_model_path() {
  const char* p = std::getenv("KVPACK_MODEL");
  return p && *p ? p : std::string(KVPACK_SOURCE_DIR) + "/models/smollm2-135m-instruct.gguf";
}

const LlamaModel* eval_model() {
  static std::unique_ptr<LlamaModel> m = [] {
    std::unique_ptr<LlamaModel> p;
    if (std::filesystem::exists(eval_model_path())) p = std::make_unique<LlamaModel>(LlamaModel::load(eval_model_path()));
    return p;
  }();
  return m.get();
}

}  // namespace

#define EVAL_NEED_MODEL()                                                            \
  do {                                                                               \
    if (!eval_model()) {                                                             \
      const char* r = std::getenv("KVPACK_REQUIRE_MODEL");                           \
      if (r && std::string(r) == "1") FAIL() << "model not found: " << eval_model_path(); \
      GTEST_SKIP() << "model not found: " << eval_model_path();                      \
    }                                                                                \
  } while (0)

TEST(EvalModel, Bf16TwiceIsExactlyZeroAndInt4IsNot) {
  EVAL_NEED_MODEL();
  const LlamaModel& m = *eval_model();
  const std::string text =
      "Debian is a free operating system for your computer. The packages are maintained by volunteers who care "
      "about stability, and every release is tested for months before it is published for everyone to use.";
  auto tokens = m.tokenizer().encode(text, false, false);
  ASSERT_GE(tokens.size(), 33u);
  tokens.resize(33);
  auto wl = make_model_window_logits(m, nullptr);
  const int V = wl->vocab_size();
  // Two independent bf16 runs of the same window: the runner is deterministic, so KL is exactly 0 everywhere.
  std::vector<float> first(static_cast<size_t>(32) * V), lp(static_cast<size_t>(V));
  wl->run(Format::bf16, std::span<const int32_t>(tokens).first(32), [&](int p, int n, const float* l) {
    std::copy(l, l + static_cast<size_t>(n) * V, first.begin() + static_cast<long>(p) * V);
  });
  wl->run(Format::bf16, std::span<const int32_t>(tokens).first(32), [&](int p, int n, const float* l) {
    for (int i = 0; i < n; ++i) {
      log_softmax(first.data() + static_cast<size_t>(p + i) * V, V, lp.data());
      const auto s = score_position({lp.data(), argmax(lp.data(), V)}, l + static_cast<size_t>(i) * V, V, tokens[p + i + 1]);
      EXPECT_EQ(s.kl, 0.0) << "position " << p + i;
      EXPECT_TRUE(s.top1_match);
    }
  });
  EvalConfig cfg;
  cfg.window = 16;
  cfg.max_positions = 32;
  cfg.progress = false;
  const EvalResult r = run_eval(*wl, {{"snippet", tokens}}, {Format::bf16, Format::int4}, cfg);
  ASSERT_EQ(r.texts[0].formats.size(), 2u);
  const Stats& bf = r.texts[0].formats[0].all;
  const Stats& i4 = r.texts[0].formats[1].all;
  EXPECT_EQ(bf.positions, 32);
  EXPECT_EQ(bf.kl_mean, 0.0);
  EXPECT_GT(bf.ppl, 1.0);
  EXPECT_LT(bf.ppl, 1000.0);
  EXPECT_GT(i4.kl_mean, 0.0);
  EXPECT_GT(i4.top1_agreement, 0.5);
}

// The first 33 tokens of a sentence (empty when it has fewer), scored in 16-token windows (32 positions): the
// smallest real-model runs of the eval harness.
namespace {
std::vector<int32_t> snippet_tokens(const LlamaModel& m, const char* text) {
  auto t = m.tokenizer().encode(text, false, false);
  if (t.size() < 33) return {};
  t.resize(33);
  return t;
}
// int4's mean KL on the snippet (bf16 checked to be the exact reference), for the diagnostics' options.
double snippet_int4_kl(const LlamaModel& m, const std::vector<int32_t>& tokens, QuantizedKinds q,
                       std::optional<Format> v_format = std::nullopt) {
  EvalConfig cfg;
  cfg.window = 16;
  cfg.max_positions = 32;
  cfg.progress = false;
  auto wl = make_model_window_logits(m, nullptr, q, v_format);
  const EvalResult r = run_eval(*wl, {{"snippet", tokens}}, {Format::bf16, Format::int4}, cfg);
  EXPECT_EQ(r.texts[0].formats[0].all.kl_mean, 0.0);  // bf16 is never quantised or split
  return r.texts[0].formats[1].all.kl_mean;
}
}  // namespace

// --quantize k / v: the format on one half of the cache, bf16 on the other. Each half alone changes the logits, the
// two differ from each other and from both halves together, and bf16 stays the exact reference.
TEST(EvalModel, QuantizeOnlyKOrOnlyV) {
  EVAL_NEED_MODEL();
  EXPECT_EQ(parse_quantized_kinds("k"), QuantizedKinds::k);
  EXPECT_EQ(std::string(quantized_kinds_name(QuantizedKinds::v)), "v");
  try {
    parse_quantized_kinds("kq");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'kq'"), std::string::npos) << e.what();
  }
  const LlamaModel& m = *eval_model();
  const auto tokens = snippet_tokens(m,
      "Debian is a free operating system for your computer. The packages are maintained by volunteers who care "
      "about stability, and every release is tested for months before it is published for everyone to use.");
  ASSERT_EQ(tokens.size(), 33u);
  double kl[3];
  for (QuantizedKinds q : {QuantizedKinds::kv, QuantizedKinds::k, QuantizedKinds::v}) {
    kl[static_cast<int>(q)] = snippet_int4_kl(m, tokens, q);
    EXPECT_GT(kl[static_cast<int>(q)], 0.0) << quantized_kinds_name(q);
  }
  EXPECT_NE(kl[0], kl[1]);
  EXPECT_NE(kl[0], kl[2]);
  EXPECT_NE(kl[1], kl[2]);
}

// --v-format: rows keep their format on K and store V in another. The row's own format on V is the plain run, bit
// for bit; bf16 on V is --quantize k; another format differs from both.
TEST(EvalModel, VFormatStoresValuesInAnotherFormat) {
  EVAL_NEED_MODEL();
  const LlamaModel& m = *eval_model();
  const auto tokens = snippet_tokens(m,
      "The packages are maintained by volunteers who care about stability, and every release is tested for months "
      "before it is published. Security updates reach the stable release through a separate archive.");
  ASSERT_EQ(tokens.size(), 33u);
  auto kl_of = [&](QuantizedKinds q, std::optional<Format> v) { return snippet_int4_kl(m, tokens, q, v); };
  const double plain = kl_of(QuantizedKinds::kv, std::nullopt);
  EXPECT_EQ(kl_of(QuantizedKinds::kv, Format::int4), plain);
  EXPECT_EQ(kl_of(QuantizedKinds::kv, Format::bf16), kl_of(QuantizedKinds::k, std::nullopt));
  const double mixed = kl_of(QuantizedKinds::kv, Format::int4h);
  EXPECT_GT(mixed, 0.0);
  EXPECT_NE(mixed, plain);
}

TEST(EvalModel, RulerEndToEndTinyPrompt) {
  EVAL_NEED_MODEL();
  const LlamaModel& m = *eval_model();
  const auto& tok = m.tokenizer();
  std::string hay;
  for (int i = 0; i < 40; ++i)
    hay += "The administrator checks the logs every morning and writes a short report for the team. ";
  hay += "\n\nThe backup server keeps copies of every database for thirty days before they are removed.\n\n";
  auto counter = [&](const std::string& user, const std::string& prefix) -> int64_t {
    return static_cast<int64_t>(tok.encode(tok.apply_chat_template({{"user", user}}, true) + prefix, false, true).size());
  };
  const auto samples = generate_ruler({hay}, {RulerTask::niah_number}, {320}, 1, 3, counter);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_LE(counter(samples[0].user, samples[0].answer_prefix), 320 - 64);
  auto rm = make_model_ruler(m, nullptr, 512);
  RulerConfig cfg;
  cfg.progress = false;
  cfg.max_new_tokens = 12;
  const RulerResult r = run_ruler(*rm, samples, {Format::int4}, cfg);
  ASSERT_EQ(r.records.size(), 2u);
  EXPECT_EQ(r.records[0].format, Format::bf16);
  EXPECT_EQ(r.records[0].gold_kl, 0.0);
  EXPECT_GT(r.records[0].gold_tokens, 0);
  EXPECT_GE(r.records[1].gold_kl, 0.0);
  EXPECT_FALSE(r.records[0].answer.empty());
  EXPECT_GT(r.records[0].gold_nll, 0.0);
}
