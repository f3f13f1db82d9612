// End to end on SmolLM2 (skipped without the model unless KVPACK_REQUIRE_MODEL=1): a short calibration, the file
// round trip, and every format's codec inside the runner (KL of the next-token distribution vs bf16).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvpack/calibration.h"
#include "kvpack/codec.h"
#include "kvpack/error.h"
#include "kvpack/llama.h"
#include "kvpack/tokenizer.h"

using namespace kvpack;

namespace {
std::string model_path() {
  const char* p = std::getenv("KVPACK_MODEL");
  return p && *p ? p : std::string(KVPACK_SOURCE_DIR) + "/models/smollm2-135m-instruct.gguf";
}
bool model_required() {
  const char* r = std::getenv("KVPACK_REQUIRE_MODEL");
  return r && std::string(r) == "1";
}
std::vector<int32_t> text_tokens(const LlamaModel& m, const std::string& file, size_t skip, size_t n) {
  std::ifstream f(std::string(KVPACK_SOURCE_DIR) + "/data/" + file);
  std::stringstream s;
  s << f.rdbuf();
  auto ids = m.tokenizer().encode(s.str().substr(0, 40000), false, false);
  EXPECT_GE(ids.size(), skip + n);
  return {ids.begin() + skip, ids.begin() + skip + n};
}
std::vector<double> log_softmax_last(const std::vector<float>& logits) {
  double mx = -1e300, sum = 0;
  for (float v : logits) mx = std::max(mx, double(v));
  for (float v : logits) sum += std::exp(v - mx);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - mx - std::log(sum);
  return out;
}
}  // namespace

TEST(CalibModel, ShortCalibrationRoundTripAndCodecsInTheRunner) {
  if (!std::ifstream(model_path()).good()) {
    if (model_required()) FAIL() << "model not found: " << model_path();
    GTEST_SKIP() << "model not found: " << model_path();
  }
  const LlamaModel model = LlamaModel::load(model_path());
  const ModelConfig& c = model.config();
  // Two short windows of calibration text (the real calibration uses 2 x 8192 tokens).
  std::vector<std::vector<int32_t>> windows;
  for (int w = 0; w < 2; ++w) {
    auto t = text_tokens(model, "calib.txt", 200 * w, 120);
    if (model.add_bos()) t.insert(t.begin(), model.bos_id());
    windows.push_back(t);
  }
  const Calibration cal = calibrate(model, windows, false);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvpack_calib_model_" + std::to_string(::getpid()) + ".kvcal")).string();
  cal.save(path);
  const Calibration back = Calibration::load(path, c);
  std::filesystem::remove(path);
  EXPECT_EQ(back.q(Format::q4).fwd, cal.q(Format::q4).fwd);
  for (float s : back.fp8_scales()) EXPECT_GT(s, 0.0f);

  // Held-out text: KL of the last position's distribution, each format vs bf16.
  auto eval = text_tokens(model, "eval-a.txt", 0, 48);
  auto run = [&](Format f) {
    auto codec = make_codec(f, c, &back);
    LlamaSession s(model, 64, codec.get());
    return log_softmax_last(s.forward_last(eval));
  };
  const auto ref = run(Format::bf16);
  std::map<Format, double> kl;
  for (Format f : {Format::fp8, Format::int4h, Format::q4, Format::q3}) {
    const auto lp = run(f);
    double k = 0;
    for (size_t i = 0; i < lp.size(); ++i) k += std::exp(ref[i]) * (ref[i] - lp[i]);
    EXPECT_TRUE(std::isfinite(k)) << format_name(f);
    EXPECT_GE(k, -1e-9) << format_name(f);
    kl[f] = k;
  }
  // Loose sanity bounds for a 48-token window (real numbers: docs/QUALITY.md): nothing is broken.
  EXPECT_LT(kl[Format::fp8], 0.05);
  EXPECT_LT(kl[Format::q4], 0.5);
  EXPECT_LT(kl[Format::q3], 1.0);
}

TEST(CalibModel, TooShortCalibrationTextIsAClearErrorNotACrash) {
  if (!std::ifstream(model_path()).good()) {
    if (model_required()) FAIL() << "model not found: " << model_path();
    GTEST_SKIP() << "model not found: " << model_path();
  }
  const LlamaModel model = LlamaModel::load(model_path());
  // 40 tokens: 36 after the sinks, fewer than head_dim = 64 (until 2026-12-05 the fit threw inside a worker thread
  // and the process aborted with "terminate called without an active exception").
  std::vector<std::vector<int32_t>> windows{text_tokens(model, "calib.txt", 0, 40)};
  try {
    calibrate(model, windows, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use a longer calibration text"), std::string::npos) << e.what();
  }
}
