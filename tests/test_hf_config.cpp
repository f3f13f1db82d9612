// HF config.json -> ModelConfig: the published configs of Llama-3.1-8B/70B, Qwen2-7B/1.5B and SmolLM2-135M-Instruct
// (tests/data/hf/), parameter counts from the shapes, and a clear error for every kind of malformed file.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvpack/error.h"
#include "kvpack/hf_config.h"

using namespace kvpack;

namespace {

std::string hf(const std::string& name) { return std::string(KVPACK_TEST_DATA) + "/hf/" + name; }

// A fresh temporary directory per test, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           (std::string("kvpack_hf_") + info->test_suite_name() + "_" + info->name() + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    auto p = path / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Expects an Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected kvpack::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace

TEST(HfConfig, Llama31_8B) {
  HfConfigInfo info = read_hf_config(hf("llama-3.1-8b.json"));
  const ModelConfig& c = info.config;
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_layers, 32);
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // not in the file: hidden_size / num_attention_heads
  EXPECT_EQ(c.d_ff, 14336);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_context, 131072);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-5);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.attn_bias);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.group_size(), 4);
  EXPECT_EQ(c.kv_elements_per_token(), 65536);
  // 8.03 B: embeddings + lm_head 2 x 525,336,576, 32 x 218,112,000 per layer, final norm 4,096.
  EXPECT_EQ(c.n_params, 8030261248);
  EXPECT_EQ(info.torch_dtype, "bfloat16");
  EXPECT_EQ(info.dtype_bytes, 2);
  EXPECT_EQ(c.name, "llama-3.1-8b");  // no _name_or_path: the file stem
}

TEST(HfConfig, Llama31_70B) {
  ModelConfig c = model_config_from_hf_json(hf("llama-3.1-70b.json"));
  EXPECT_EQ(c.n_layers, 80);
  EXPECT_EQ(c.d_model, 8192);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.d_ff, 28672);
  EXPECT_EQ(c.kv_elements_per_token(), 163840);
  EXPECT_EQ(c.n_params, 70553706496);  // the 70.55e9 behind the published 416 GB node budget
}

TEST(HfConfig, Qwen2_7B) {
  HfConfigInfo info = read_hf_config(hf("qwen2-7b.json"));
  const ModelConfig& c = info.config;
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.attn_bias);
  EXPECT_EQ(c.n_layers, 28);
  EXPECT_EQ(c.d_model, 3584);
  EXPECT_EQ(c.n_heads, 28);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.d_ff, 18944);
  EXPECT_EQ(c.vocab_size, 152064);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-6);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.bos_token_id, 151643);
  // 7.62 B; the q/k/v biases add 28 x 4,608.
  EXPECT_EQ(c.n_params, 7615616512);
  EXPECT_EQ(info.dtype_bytes, 2);
}

TEST(HfConfig, Qwen2_1_5B_Tied) {
  ModelConfig c = model_config_from_hf_json(hf("qwen2-1.5b.json"));
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.n_params, 1543714304);
}

TEST(HfConfig, SmolLM2) {
  ModelConfig c = model_config_from_hf_json(hf("smollm2-135m-instruct.json"));
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.d_model, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);  // written as the integer 100000
  EXPECT_EQ(c.rope_scaling.type, "none");    // "rope_scaling": null
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  // Equal to the sum of the tensor element counts in models/smollm2-135m-instruct.gguf.
  EXPECT_EQ(c.n_params, 134515008);
}

TEST(HfConfig, DirectoryNameAndListEos) {
  TempDir t;
  nlohmann::json j = load_json(hf("llama-3.1-8b.json"));
  j["eos_token_id"] = {128001, 128008, 128009};  // as in Llama-3.1-8B-Instruct
  t.write("Llama-3.1-8B-Instruct/config.json", j.dump());
  ModelConfig c = model_config_from_hf_json((t.path / "Llama-3.1-8B-Instruct").string());
  EXPECT_EQ(c.name, "Llama-3.1-8B-Instruct");
  EXPECT_EQ(c.eos_token_id, 128001);

  j["_name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct";
  EXPECT_EQ(model_config_from_hf_json(t.write("x/config.json", j.dump())).name, "meta-llama/Llama-3.1-8B-Instruct");
}

TEST(HfConfig, ExplicitHeadDimAndLegacyRopeType) {
  // Llama-3.2-3B's shape: head_dim given explicitly, tied embeddings, rope_scaling with the older "type" key.
  TempDir t;
  nlohmann::json j = load_json(hf("llama-3.1-8b.json"));
  j["hidden_size"] = 3072;
  j["num_attention_heads"] = 24;
  j["head_dim"] = 128;
  j["intermediate_size"] = 8192;
  j["num_hidden_layers"] = 28;
  j["tie_word_embeddings"] = true;
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  j["rope_scaling"]["factor"] = 32.0;
  ModelConfig c = model_config_from_hf_json(t.write("config.json", j.dump()));
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.n_params, 3212749824);  // Llama-3.2-3B: 3.21 B
}

TEST(HfConfig, DtypeVariants) {
  TempDir t;
  nlohmann::json j = load_json(hf("smollm2-135m-instruct.json"));
  j.erase("torch_dtype");
  EXPECT_EQ(read_hf_config(t.write("a.json", j.dump())).dtype_bytes, 0);
  j["dtype"] = "float32";  // transformers >= 4.56 spelling
  EXPECT_EQ(read_hf_config(t.write("b.json", j.dump())).dtype_bytes, 4);
  j["torch_dtype"] = "float16";
  EXPECT_EQ(read_hf_config(t.write("c.json", j.dump())).dtype_bytes, 2);
}

// count_params against an independent count: the HF tensor list of the model, summed tensor by tensor.
TEST(HfConfig, ParamCountMatchesTensorListOnRandomShapes) {
  std::mt19937 rng(20261202);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  TempDir t;
  for (int trial = 0; trial < 40; ++trial) {
    const int kv = pick(1, 8), group = pick(1, 6), hd = 2 * pick(4, 80), layers = pick(1, 40);
    const bool tied = pick(0, 1) == 1, qwen = pick(0, 1) == 1, explicit_hd = pick(0, 1) == 1;
    // With an explicit head_dim the model width is free (as in Llama-3.2-3B); otherwise it is heads x head_dim.
    const int heads = kv * group, d = explicit_hd ? pick(8, 4096) : heads * hd, ff = pick(1, 5000);
    const int vocab = pick(2, 70000);
    nlohmann::json j = {{"architectures", {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
                        {"hidden_size", d},
                        {"intermediate_size", ff},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", kv},
                        {"vocab_size", vocab},
                        {"max_position_embeddings", 4096},
                        {"tie_word_embeddings", tied}};
    if (explicit_hd) j["head_dim"] = hd;
    ModelConfig c = model_config_from_hf_json(t.write(fmt::format("r{}.json", trial), j.dump()));
    // [out, in] shapes as the checkpoint stores them.
    std::vector<std::vector<int64_t>> tensors = {{vocab, d}, {d}};
    if (!tied) tensors.push_back({vocab, d});
    for (int l = 0; l < layers; ++l) {
      for (auto s : std::vector<std::vector<int64_t>>{{heads * hd, d}, {kv * hd, d}, {kv * hd, d}, {d, heads * hd},
                                                      {ff, d}, {ff, d}, {d, ff}, {d}, {d}})
        tensors.push_back(s);
      if (qwen) tensors.insert(tensors.end(), {{heads * hd}, {kv * hd}, {kv * hd}});
    }
    int64_t total = 0;
    for (const auto& s : tensors) {
      int64_t n = 1;
      for (auto x : s) n *= x;
      total += n;
    }
    EXPECT_EQ(c.n_params, total) << j.dump();
    EXPECT_EQ(c.head_dim, hd);
    EXPECT_EQ(c.kv_elements_per_token(), int64_t{2} * layers * kv * hd);
  }
}

TEST(HfConfig, MalformedFixturesGiveClearErrors) {
  struct Case {
    std::string file;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"bad-missing-layers.json", {"bad-missing-layers.json", "num_hidden_layers", "missing"}},
      {"bad-kv-heads-string.json", {"bad-kv-heads-string.json", "num_key_value_heads", "integer", "string"}},
      {"bad-negative-hidden.json", {"bad-negative-hidden.json", "hidden_size", "positive", "-4096"}},
      {"bad-zero-vocab.json", {"bad-zero-vocab.json", "vocab_size", "positive"}},
      {"bad-float-layers.json", {"bad-float-layers.json", "num_hidden_layers", "integer", "32.5"}},
      {"bad-arch.json", {"bad-arch.json", "MixtralForCausalLM", "not supported"}},
      {"bad-rope-scaling.json", {"bad-rope-scaling.json", "rope_scaling", "low_freq_factor", "missing"}},
      {"bad-rope-type.json", {"bad-rope-type.json", "yarn", "not supported"}},
      {"bad-gqa.json", {"bad-gqa.json", "n_heads (32)", "n_kv_heads (5)"}},
      {"bad-truncated.json", {"bad-truncated.json", "not valid JSON"}},
      {"bad-not-object.json", {"bad-not-object.json", "JSON object", "array"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    expect_error([&] { model_config_from_hf_json(hf(c.file)); }, c.parts);
  }
}

TEST(HfConfig, MoreBadInputs) {
  expect_error([] { model_config_from_hf_json(hf("does-not-exist.json")); }, {"does-not-exist.json", "cannot open"});
  TempDir t;
  expect_error([&] { model_config_from_hf_json(t.path.string()); }, {"config.json", "cannot open"});  // empty dir
  expect_error([&] { model_config_from_hf_json(t.write("empty.json", "")); }, {"empty.json", "not valid JSON"});
  nlohmann::json j = load_json(hf("llama-3.1-8b.json"));
  auto with = [&](const char* k, nlohmann::json v) {
    nlohmann::json x = j;
    x[k] = std::move(v);
    return t.write(std::string("w_") + k + ".json", x.dump());
  };
  expect_error([&] { model_config_from_hf_json(with("num_attention_heads", 0)); }, {"num_attention_heads", "positive"});
  expect_error([&] { model_config_from_hf_json(with("hidden_act", "gelu")); }, {"hidden_act", "gelu"});
  expect_error([&] { model_config_from_hf_json(with("attention_bias", true)); }, {"attention_bias"});
  expect_error([&] { model_config_from_hf_json(with("tie_word_embeddings", "yes")); }, {"tie_word_embeddings"});
  expect_error([&] { model_config_from_hf_json(with("rope_theta", -1.0)); }, {"rope_theta", "positive"});
  expect_error([&] { model_config_from_hf_json(with("rope_scaling", 8)); }, {"rope_scaling", "object"});
  expect_error([&] { model_config_from_hf_json(with("eos_token_id", "</s>")); }, {"eos_token_id"});
  expect_error([&] { model_config_from_hf_json(with("architectures", nlohmann::json::array())); }, {"architectures"});
  expect_error([&] { model_config_from_hf_json(with("hidden_size", 4097)); }, {"head_dim", "4097"});
  expect_error([&] { model_config_from_hf_json(with("vocab_size", 1e12)); }, {"vocab_size", "integer"});
  expect_error([&] { model_config_from_hf_json(with("vocab_size", int64_t{1} << 40)); }, {"vocab_size", "large"});
  // A number beyond double's range is a JSON error, not an escaping nlohmann exception (found by fuzz_hf_config).
  std::string big = j.dump();
  big.replace(big.find("\"rms_norm_eps\":") + 15, 0, "1e500000,\"x\":");
  expect_error([&] { model_config_from_hf_json(t.write("big.json", big)); }, {"big.json", "not valid JSON", "1e500000"});
  nlohmann::json q = load_json(hf("qwen2-7b.json"));
  q["use_sliding_window"] = true;
  expect_error([&] { model_config_from_hf_json(t.write("q.json", q.dump())); }, {"use_sliding_window"});
}
