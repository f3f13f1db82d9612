// GGUF reader and ggml dequantizer tests. Fixtures in tests/data/gguf/ come from scripts/make_gguf_fixtures.py
// (the Python `gguf` package is the oracle); malformed files are built byte by byte here.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli_run.h"
#include "kvpack/bf16.h"
#include "kvpack/dequant.h"
#include "kvpack/error.h"
#include "kvpack/gguf.h"

using namespace kvpack;

namespace {

const std::string kData = std::string(KVPACK_TEST_DATA) + "/gguf/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// The model for the tests that need it: KVPACK_MODEL or the default path; skip when absent unless required.
std::string model_path() {
  const char* env = std::getenv("KVPACK_MODEL");
  return env && *env ? env : std::string(KVPACK_SOURCE_DIR) + "/models/smollm2-135m-instruct.gguf";
}
bool model_required() {
  const char* r = std::getenv("KVPACK_REQUIRE_MODEL");
  return r && std::string(r) == "1";
}
#define REQUIRE_MODEL()                                                            \
  do {                                                                             \
    if (!std::ifstream(model_path()).good()) {                                     \
      if (model_required()) FAIL() << "model not found: " << model_path();         \
      GTEST_SKIP() << "model not found: " << model_path();                         \
    }                                                                              \
  } while (0)

// Mirrors checksum() in scripts/make_gguf_fixtures.py.
uint64_t checksum(const std::vector<float>& v) {
  uint64_t s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += uint64_t{f32_bits(v[i])} * (uint64_t{i} * 2654435761u + 1u);
  return s;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b, std::string* where) {
  if (a.size() != b.size()) {
    *where = "size " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i)
    if (f32_bits(a[i]) != f32_bits(b[i])) {
      *where = fmt::format("element {}: {} ({:08x}) vs {} ({:08x})", i, a[i], f32_bits(a[i]), b[i], f32_bits(b[i]));
      return false;
    }
  return true;
}

// Builds GGUF bytes by hand for the malformed-file matrix.
struct Builder {
  std::vector<uint8_t> b;
  template <typename T>
  Builder& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Builder& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put(version).put(n_tensors).put(n_kv);
  }
  Builder& kv_u32(std::string_view key, uint32_t v) { return str(key).put<uint32_t>(4).put(v); }
  Builder& kv_str(std::string_view key, std::string_view v) { return str(key).put<uint32_t>(8).str(v); }
  Builder& kv_f32(std::string_view key, float v) { return str(key).put<uint32_t>(6).put(v); }
  Builder& tensor(std::string_view name, std::vector<int64_t> dims, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) put(d);
    return put(type).put(offset);
  }
  Builder& pad(size_t align = 32) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Builder& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

// Expects parsing `bytes` to throw kvpack::Error whose message contains every string in `needles`.
void expect_error(const std::vector<uint8_t>& bytes, std::vector<std::string> needles, const std::string& label) {
  try {
    auto f = GgufFile::from_memory(bytes.data(), bytes.size(), "bad.gguf");
    ADD_FAILURE() << label << ": parsed without error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << label << ": message does not name the file: " << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << label << ": message lacks '" << n << "': " << msg;
  }
}

// A valid small file: 2 metadata pairs, tensors 'a' (F32 [32]) and 'b' (Q8_0 [32, 2]).
Builder valid_file() {
  Builder x;
  x.header(3, 2, 2).kv_str("general.architecture", "llama").kv_u32("test.x", 5);
  x.tensor("a", {32}, 0, 0).tensor("b", {32, 2}, 8, 128).pad();
  x.zeros(128 + 68);
  return x;
}

}  // namespace

// ---------------------------------------------------------------- dequantizers

TEST(GgmlTypes, SizesAndNames) {
  EXPECT_EQ(ggml_block_size(GgmlType::Q4_K), 256);
  EXPECT_EQ(ggml_type_size(GgmlType::Q4_K), 144);
  EXPECT_EQ(ggml_type_size(GgmlType::Q6_K), 210);
  EXPECT_EQ(ggml_type_size(GgmlType::Q4_1), 20);
  EXPECT_EQ(ggml_type_size(GgmlType::Q8_0), 34);
  EXPECT_EQ(ggml_type_size(GgmlType::BF16), 2);
  EXPECT_EQ(ggml_row_size(GgmlType::Q4_1, 576), 18u * 20u);
  EXPECT_EQ(ggml_type_name(GgmlType::Q5_K), "Q5_K");
  EXPECT_EQ(parse_ggml_type("q6_k"), GgmlType::Q6_K);
  EXPECT_FALSE(parse_ggml_type("q7").has_value());
  EXPECT_FALSE(ggml_type_known(4));
  EXPECT_FALSE(ggml_type_known(1000));
  EXPECT_TRUE(ggml_type_known(16));
  EXPECT_FALSE(ggml_type_supported(GgmlType::IQ2_XXS));
  EXPECT_THROW(ggml_block_size(static_cast<GgmlType>(77)), Error);
  EXPECT_THROW(ggml_row_size(GgmlType::Q4_K, 100), Error);
}

// Every dequantizer against the package's numpy dequantization of random blocks: bit-exact.
TEST(Dequant, MatchesGgufPackageBitExact) {
  auto f = GgufFile::open(kData + "dequant.gguf");
  int checked = 0;
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("raw.", 0) != 0) continue;
    const std::string type = t.name.substr(4);
    ASSERT_EQ(ggml_type_name(t.type), type);
    const auto& expect = f.tensor("expect." + type);
    ASSERT_EQ(expect.type, GgmlType::F32);
    ASSERT_EQ(expect.dims, t.dims);
    std::string where;
    EXPECT_TRUE(bitwise_equal(f.dequantize(t), f.dequantize(expect), &where)) << type << ": " << where;
    ++checked;
  }
  EXPECT_EQ(checked, 12);  // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K F16 BF16
}

// The row API accepts unaligned sources (copies per block) with identical results.
TEST(Dequant, UnalignedSourceSameResult) {
  auto f = GgufFile::open(kData + "dequant.gguf");
  for (const char* name : {"raw.Q4_K", "raw.Q8_0", "raw.Q6_K", "raw.F16"}) {
    const auto& t = f.tensor(name);
    std::vector<uint8_t> buf(t.n_bytes + 1);
    std::memcpy(buf.data() + 1, t.data, t.n_bytes);
    std::vector<float> out(static_cast<size_t>(t.n_elements));
    dequantize_row(t.type, buf.data() + 1, out.data(), t.n_elements);
    std::string where;
    EXPECT_TRUE(bitwise_equal(out, f.dequantize(t), &where)) << name << ": " << where;
  }
}

// Q8_K is not in the package; its definition is y = d * q with an fp32 d.
TEST(Dequant, Q8K) {
  std::mt19937 rng(5);
  std::vector<uint8_t> block(292);
  for (auto& x : block) x = static_cast<uint8_t>(rng());
  const float d = -0.0123f;
  std::memcpy(block.data(), &d, 4);
  std::vector<float> out(256);
  dequantize_row(GgmlType::Q8_K, block.data(), out.data(), 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(out[i], d * static_cast<int8_t>(block[4 + i])) << i;
}

TEST(Dequant, RejectsUnsupportedAndBadLength) {
  std::vector<uint8_t> src(1024);
  std::vector<float> dst(256);
  try {
    dequantize_row(GgmlType::IQ2_XXS, src.data(), dst.data(), 256);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(GgmlType::Q4_0, src.data(), dst.data(), 33), Error);
}

// ---------------------------------------------------------------- metadata

TEST(Gguf, MetadataEveryValueTypeV3AndV2) {
  for (const char* file : {"metadata_v3.gguf", "metadata_v2.gguf"}) {
    SCOPED_TRACE(file);
    auto f = GgufFile::open(kData + file);
    EXPECT_EQ(f.version(), std::string(file) == "metadata_v3.gguf" ? 3u : 2u);
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.data_offset() % 64, 0u);
    EXPECT_EQ(f.get_int("test.u8"), 200);
    EXPECT_EQ(f.get_int("test.i8"), -100);
    EXPECT_EQ(f.get_int("test.u16"), 60000);
    EXPECT_EQ(f.get_int("test.i16"), -30000);
    EXPECT_EQ(f.get_int("test.u32"), 4000000000);
    EXPECT_EQ(f.get_int("test.i32"), -2000000000);
    EXPECT_EQ(std::get<uint64_t>(f.find("test.u64")->value), 18000000000000000000ull);
    EXPECT_THROW(f.get_int("test.u64"), Error);  // does not fit int64
    EXPECT_EQ(f.get_int("test.i64"), -9000000000000000000);
    EXPECT_EQ(f.get_float("test.f32"), static_cast<double>(0.1f));
    EXPECT_EQ(f.get_float("test.f64"), -2.5e-300);
    EXPECT_EQ(f.get_float("test.u8"), 200.0);
    EXPECT_TRUE(f.get_bool("test.bool_true", false));
    EXPECT_FALSE(f.get_bool("test.bool_false", true));
    EXPECT_TRUE(f.get_bool("test.absent", true));
    EXPECT_EQ(f.get_string("test.string"), "h\xc3\xa9llo\nw\xc3\xb6rld");
    EXPECT_EQ(f.get_int_array("test.array_i32"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(f.get_int_array("test.array_u8"), (std::vector<int64_t>{1, 2, 255}));
    EXPECT_EQ(f.find("test.array_u8")->elem_type, GgufType::U8);
    EXPECT_EQ(f.get_float_array("test.array_f32"), (std::vector<double>{0.5, -1.25}));
    EXPECT_EQ(f.get_string_array("test.array_str"), (std::vector<std::string>{"a", "", "ccc"}));
    const auto* b = f.find("test.array_bool")->as_array();
    ASSERT_EQ(b->size(), 3u);
    EXPECT_TRUE(std::get<bool>((*b)[0].value));
    EXPECT_FALSE(std::get<bool>((*b)[1].value));
    const GgufValue* nested = f.find("test.nested");
    ASSERT_NE(nested, nullptr);
    EXPECT_EQ(nested->type_string(), "array[array[i32]]");
    const auto& outer = *nested->as_array();
    ASSERT_EQ(outer.size(), 3u);
    EXPECT_EQ(outer[2].as_array()->size(), 3u);
    EXPECT_EQ(*(*outer[2].as_array())[2].as_int(), 6);
    const auto& ns = *f.find("test.nested_str")->as_array();
    EXPECT_EQ(*(*ns[1].as_array())[0].as_string(), "z");
    EXPECT_EQ(nested->summary(), "array[array[i32]] n=3 [array[i32] n=2 [1, 2], array[i32] n=1 [3], array[i32] n=3 "
                                 "[4, 5, 6]]");
    // keys in file order: general.architecture first (GGUFWriter), then general.alignment, then ours.
    auto keys = f.keys();
    ASSERT_GE(keys.size(), 3u);
    EXPECT_EQ(keys[0], "general.architecture");
    EXPECT_EQ(keys[2], "test.u8");
    EXPECT_EQ(keys.size(), 32u);
  }
}

TEST(Gguf, TypedGetterErrors) {
  auto f = GgufFile::open(kData + "metadata_v3.gguf");
  auto msg = [&](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string path = kData + "metadata_v3.gguf";
  EXPECT_EQ(msg([&] { f.get_int("nope.key"); }), path + ": metadata key 'nope.key' is missing");
  EXPECT_EQ(msg([&] { f.get_int("test.string"); }),
            path + ": metadata key 'test.string' has type string, expected an integer");
  EXPECT_EQ(msg([&] { f.get_string("test.u32"); }), path + ": metadata key 'test.u32' has type u32, expected string");
  EXPECT_EQ(msg([&] { f.get_bool("test.u8", false); }), path + ": metadata key 'test.u8' has type u8, expected bool");
  EXPECT_EQ(msg([&] { f.get_string_array("test.array_i32"); }),
            path + ": metadata key 'test.array_i32' has type array[i32], expected array[string]");
  EXPECT_EQ(msg([&] { f.get_int_array("test.array_str"); }),
            path + ": metadata key 'test.array_str' has type array[string], expected array of integers");
  EXPECT_EQ(msg([&] { f.get_float("test.array_f32"); }),
            path + ": metadata key 'test.array_f32' has type array[f32], expected a number");
  EXPECT_FALSE(f.get_int_opt("nope").has_value());
  EXPECT_FALSE(f.get_string_opt("nope").has_value());
  EXPECT_THROW(f.get_int_opt("test.string"), Error);  // present with the wrong type is still an error
  EXPECT_EQ(msg([&] { f.tensor("missing.weight"); }), path + ": tensor 'missing.weight' not found (4 tensors in the file)");
}

TEST(Gguf, SmallFileTensorsAndConfig) {
  auto f = GgufFile::open(kData + "metadata_v3.gguf");
  ASSERT_EQ(f.tensors().size(), 4u);
  const auto& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::F32);
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(emb.n_elements, 2048);
  EXPECT_EQ(emb.n_bytes, 8192u);
  EXPECT_EQ(emb.shape_string(), "[64, 32]");
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u) << t.name;  // mmap is page-aligned
  }
  auto norm = f.dequantize(f.tensor("blk.0.attn_norm.weight"));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(norm[i], static_cast<float>(i));
  const auto& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type, GgmlType::F16);
  std::vector<float> rows(2 * 64);
  f.dequantize_rows(q, 10, 2, rows.data());
  auto all = f.dequantize(q);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(rows[i], all[10 * 64 + i]);
  EXPECT_THROW(f.dequantize_rows(q, 63, 2, rows.data()), Error);
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").type, GgmlType::Q8_0);

  ModelConfig c = model_config_from_gguf(f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.name, "tiny-test");
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.d_ff, 128);
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_EQ(c.max_context, 256);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_eps, static_cast<double>(1e-6f));
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.n_params, 2048 + 64 + 4096 + 4096);
  EXPECT_EQ(c.rope_scaling.type, "none");
}

// A minimal model file: `arch` metadata (+ extra pairs appended by `extra`, counted in n_extra) and tensors
// given as (name, F32 values).
std::vector<uint8_t> model_file(const std::string& arch, int n_extra, const std::function<void(Builder&)>& extra,
                                const std::vector<std::pair<std::string, std::vector<float>>>& tensors) {
  Builder x;
  x.header(3, tensors.size(), 7 + n_extra);
  x.kv_str("general.architecture", arch);
  x.kv_u32(arch + ".block_count", 2).kv_u32(arch + ".context_length", 131072).kv_u32(arch + ".embedding_length", 256);
  x.kv_u32(arch + ".feed_forward_length", 512).kv_u32(arch + ".attention.head_count", 4);
  x.kv_f32(arch + ".rope.freq_base", 500000.0f);
  extra(x);
  uint64_t off = 0;
  for (const auto& [name, v] : tensors) {
    x.tensor(name, {static_cast<int64_t>(v.size())}, 0, off);
    off += (v.size() * 4 + 31) / 32 * 32;
  }
  x.pad();
  for (const auto& [name, v] : tensors) {
    for (float f : v) x.put(f);
    x.pad();
  }
  return x.b;
}

// llama.cpp's converter writes Llama-3.1 RoPE scaling as per-frequency factors (LlamaModel.generate_extra_tensors).
std::vector<float> llama3_rope_factors(int head_dim, double theta, double factor) {
  std::vector<float> out;
  const double old_ctx = 8192, low = 1, high = 4;
  for (int i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(i) / head_dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < old_ctx / high) out.push_back(1.0f);
    else if (wavelen > old_ctx / low) out.push_back(static_cast<float>(factor));
    else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

TEST(GgufConfig, Llama3RopeFactorsTensor) {
  auto vocab = [](Builder& x) { x.kv_u32("llama.vocab_size", 100); };
  const auto b = model_file("llama", 1, vocab, {{"rope_freqs.weight", llama3_rope_factors(64, 500000.0, 8.0)}});
  auto f = GgufFile::from_memory(b.data(), b.size(), "l3.gguf");
  ModelConfig c = model_config_from_gguf(f);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_kv_heads, 4);  // defaults to head_count
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.vocab_size, 100);
}

TEST(GgufConfig, ErrorsNameTheKey) {
  auto msg = [](const std::vector<uint8_t>& b) -> std::string {
    try {
      auto f = GgufFile::from_memory(b.data(), b.size(), "m.gguf");
      (void)model_config_from_gguf(f);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  auto vocab = [](Builder& x) { x.kv_u32("llama.vocab_size", 100); };
  // Factors that are not Llama-3's (one value perturbed) are refused rather than silently mis-modelled.
  auto bad = llama3_rope_factors(64, 500000.0, 8.0);
  bad[0] *= 1.01f;
  EXPECT_NE(msg(model_file("llama", 1, vocab, {{"rope_freqs.weight", bad}})).find("rope_freqs.weight' element 0 "),
            std::string::npos);
  EXPECT_NE(msg(model_file("gpt2", 0, [](Builder&) {}, {})).find("architecture 'gpt2' is not supported"),
            std::string::npos);
  EXPECT_NE(msg(model_file("llama", 2, [](Builder& x) {
              x.kv_u32("llama.vocab_size", 100).kv_str("llama.rope.scaling.type", "yarn");
            }, {})).find("RoPE scaling type 'yarn'"), std::string::npos);
  EXPECT_NE(msg(model_file("llama", 2, [](Builder& x) {
              x.kv_u32("llama.vocab_size", 100).kv_u32("llama.attention.head_count_kv", 3);
            }, {})).find("n_heads (4) is not a multiple of n_kv_heads (3)"), std::string::npos);
  EXPECT_NE(msg(model_file("llama", 2, [](Builder& x) {
              x.kv_u32("llama.vocab_size", 100).kv_str("llama.attention.key_length", "64");
            }, {})).find("metadata key 'llama.attention.key_length' has type string"), std::string::npos);
  // linear scaling and qwen2 biases
  auto lin = model_file("qwen2", 3, [](Builder& x) {
    x.kv_u32("qwen2.vocab_size", 100).kv_str("qwen2.rope.scaling.type", "linear").kv_f32("qwen2.rope.scaling.factor", 4);
  }, {{"output.weight", std::vector<float>(8, 0.5f)}});
  auto f = GgufFile::from_memory(lin.data(), lin.size(), "q.gguf");
  ModelConfig c = model_config_from_gguf(f);
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.attn_bias);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.n_params, 8);
}

// ---------------------------------------------------------------- malformed files

TEST(GgufMalformed, ValidBaseParses) {
  auto x = valid_file();
  auto f = GgufFile::from_memory(x.b.data(), x.b.size(), "ok.gguf");
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.get_int("test.x"), 5);
  EXPECT_EQ(f.tensor("b").n_bytes, 68u);
}

TEST(GgufMalformed, Matrix) {
  auto hdr = [](uint32_t v, uint64_t nt, uint64_t nkv) { Builder x; x.header(v, nt, nkv); return x; };
  {
    std::vector<uint8_t> b = {'G', 'G'};
    expect_error(b, {"too small"}, "2-byte file");
  }
  {
    auto x = valid_file();
    x.b[0] = 'X';
    expect_error(x.b, {"not a GGUF file"}, "bad magic");
  }
  expect_error(hdr(1, 0, 0).b, {"version 1", "not supported"}, "v1");
  expect_error(hdr(4, 0, 0).b, {"unsupported GGUF version 4"}, "v4");
  expect_error(hdr(0x03000000, 0, 0).b, {"big-endian"}, "big-endian");
  expect_error(hdr(3, 0, 1000000000000000000ull).b, {"metadata count 1000000000000000000"}, "kv count 1e18");
  expect_error(hdr(3, 1000000000000000000ull, 0).b, {"tensor count 1000000000000000000"}, "tensor count 1e18");
  {
    auto x = hdr(3, 0, 1);
    x.put<uint64_t>(1000000).b.push_back('a');
    x.zeros(20);
    expect_error(x.b, {"metadata pair #0", "key has length 1000000"}, "key length past EOF");
  }
  {
    auto x = hdr(3, 0, 1);
    x.str("my.key").put<uint32_t>(8).put<uint64_t>(5000).zeros(10);
    expect_error(x.b, {"metadata key 'my.key'", "string value has length 5000"}, "string value past EOF");
  }
  {
    auto x = hdr(3, 0, 1);
    x.str("my.arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1000000000000000000ull).zeros(1000);
    expect_error(x.b, {"metadata key 'my.arr'", "array of 1000000000000000000 u32 elements"}, "array count 1e18");
  }
  {
    auto x = hdr(3, 0, 1);
    x.str("my.arr").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3).str("ok").put<uint64_t>(99).zeros(20);
    expect_error(x.b, {"metadata key 'my.arr'", "array element 1 of 3"}, "string element past EOF");
  }
  {
    auto x = hdr(3, 0, 1);
    x.str("my.key").put<uint32_t>(13).zeros(16);
    expect_error(x.b, {"metadata key 'my.key'", "unknown value type id 13"}, "unknown value type");
  }
  {
    auto x = hdr(3, 0, 1);
    x.str("my.arr").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(1).zeros(16);
    expect_error(x.b, {"metadata key 'my.arr'", "unknown element type id 77"}, "unknown array element type");
  }
  {
    auto x = hdr(3, 0, 1);
    x.str("deep");
    x.put<uint32_t>(9);
    for (int i = 0; i < 100; ++i) x.put<uint32_t>(9).put<uint64_t>(1);
    x.zeros(64);
    expect_error(x.b, {"metadata key 'deep'", "nested more than"}, "deeply nested arrays");
  }
  {
    auto x = hdr(3, 0, 1);
    x.str("flag").put<uint32_t>(7).put<uint8_t>(2).zeros(16);
    expect_error(x.b, {"metadata key 'flag'", "bool value is 2"}, "bad bool");
  }
  {
    auto x = hdr(3, 0, 2);
    x.kv_u32("dup.key", 1).kv_u32("dup.key", 2).zeros(16);
    expect_error(x.b, {"metadata key 'dup.key'", "duplicate key"}, "duplicate key");
  }
  {
    auto x = hdr(3, 0, 1);
    x.kv_u32("general.alignment", 48).zeros(16);
    expect_error(x.b, {"general.alignment", "not a positive power of two"}, "alignment 48");
  }
  {
    auto x = hdr(3, 0, 1);
    x.kv_str("general.alignment", "32").zeros(16);
    expect_error(x.b, {"general.alignment", "expected an integer"}, "alignment string");
  }
  {
    auto x = hdr(3, 2, 0);
    x.tensor("w", {32}, 0, 0).tensor("w", {32}, 0, 128).pad().zeros(256);
    expect_error(x.b, {"tensor 'w'", "duplicate tensor name"}, "duplicate tensor");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("w5", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(64);
    expect_error(x.b, {"tensor 'w5'", "n_dims is 5"}, "n_dims 5");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("neg", {32, -1}, 0, 0).pad().zeros(64);
    expect_error(x.b, {"tensor 'neg'", "negative"}, "negative dim");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("huge", {1ll << 40, 1ll << 40}, 0, 0).pad().zeros(64);
    expect_error(x.b, {"tensor 'huge'", "overflows"}, "element count overflow");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("big", {1ll << 62}, 0, 0).pad().zeros(64);
    expect_error(x.b, {"tensor 'big'", "overflows"}, "byte count overflow");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("t", {32}, 4, 0).pad().zeros(64);
    expect_error(x.b, {"tensor 't'", "unknown ggml type id 4"}, "removed ggml type");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("t", {32}, 500, 0).pad().zeros(64);
    expect_error(x.b, {"tensor 't'", "unknown ggml type id 500"}, "unknown ggml type");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("q", {48, 2}, 12, 0).pad().zeros(512);
    expect_error(x.b, {"tensor 'q'", "multiple of 256"}, "row not multiple of block");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("mis", {8}, 0, 4).pad().zeros(64);
    expect_error(x.b, {"tensor 'mis'", "data offset 4 is not a multiple of the alignment 32"}, "unaligned offset");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("far", {32}, 0, 1ull << 40).pad().zeros(128);
    expect_error(x.b, {"tensor 'far'", "lies outside the file"}, "offset past EOF");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("long", {64}, 0, 0).pad().zeros(100);
    expect_error(x.b, {"tensor 'long'", "lies outside the file"}, "data past EOF");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("wrap", {32}, 0, ~uint64_t{31}).pad().zeros(128);
    expect_error(x.b, {"tensor 'wrap'", "lies outside the file"}, "offset wraps");
  }
  {
    auto x = hdr(3, 2, 0);
    x.tensor("first", {64}, 0, 0).tensor("second", {32}, 0, 128).pad().zeros(256);
    expect_error(x.b, {"tensor 'first'", "overlaps tensor 'second'"}, "overlap");
  }
  {
    auto x = hdr(3, 1, 0);
    x.tensor("", {32}, 0, 0).pad().zeros(128);
    expect_error(x.b, {"empty tensor name"}, "empty name");
  }
  {
    auto x = hdr(3, 1, 0);
    x.str("abcdefgh").put<uint32_t>(2).put<int64_t>(32);  // second dim missing: file ends
    expect_error(x.b, {"tensor 'abcdefgh'", "truncated file", "dimension"}, "truncated dims");
  }
  // Unsupported-but-known types parse, but dequantizing names the tensor and the type.
  {
    auto x = hdr(3, 1, 0);
    x.tensor("iq", {256}, 16, 0).pad().zeros(66);
    auto f = GgufFile::from_memory(x.b.data(), x.b.size(), "iq.gguf");
    try {
      f.dequantize(f.tensor("iq"));
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'iq' has type IQ2_XXS"), std::string::npos) << e.what();
    }
  }
}

// Every prefix of a real file written by GGUFWriter is an error (up to the end of the last tensor's data),
// never a crash, and names the file.
TEST(GgufMalformed, EveryTruncation) {
  const auto bytes = read_bytes(kData + "metadata_v3.gguf");
  auto full = GgufFile::from_memory(bytes.data(), bytes.size(), "t.gguf");
  uint64_t need = 0;
  for (const auto& t : full.tensors()) need = std::max(need, full.data_offset() + t.offset + t.n_bytes);
  ASSERT_LE(need, bytes.size());
  // Every prefix through the tensor infos, then a stride through the data section (each is a plain bounds error).
  for (size_t n = 0; n < bytes.size(); n += n < full.data_offset() + 64 ? 1 : 61) {
    try {
      auto f = GgufFile::from_memory(bytes.data(), n, "t.gguf");
      EXPECT_GE(n, need) << "prefix of " << n << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_LT(n, need);
      ASSERT_EQ(std::string(e.what()).rfind("t.gguf: ", 0), 0u) << e.what();
    }
  }
}

// Random byte corruptions (fixed seed): parse + dequantize + model config either work or throw kvpack::Error.
TEST(GgufMalformed, RandomCorruptionNeverCrashes) {
  const auto orig = read_bytes(kData + "metadata_v3.gguf");
  std::mt19937_64 rng(42);
  int errors = 0, parsed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = orig;
    const int n_flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_flips; ++k) {
      // Mostly hit the metadata/tensor-info region, where the structure is.
      const size_t pos = rng() % std::min<size_t>(b.size(), rng() % 2 ? 1400 : b.size());
      b[pos] = static_cast<uint8_t>(rng());
    }
    try {
      auto f = GgufFile::from_memory(b.data(), b.size(), "c.gguf");
      for (const auto& t : f.tensors())
        if (ggml_type_supported(t.type) && t.n_elements <= (1 << 20)) (void)f.dequantize(t);
      (void)model_config_from_gguf(f);
      ++parsed;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100);
  EXPECT_GT(parsed + errors, 2999);
}

// ---------------------------------------------------------------- the real model

TEST(GgufModel, SmolLM2Structure) {
  REQUIRE_MODEL();
  auto f = GgufFile::open(model_path());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.keys().size(), 33u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token", true));
  const auto& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::Q4_1);
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").dims, (std::vector<int64_t>{576, 192}));
  EXPECT_EQ(f.tensor("output_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);

  ModelConfig c = model_config_from_gguf(f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.d_model, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rms_eps, static_cast<double>(1e-5f));
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.attn_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.n_params, 134515008);
  EXPECT_EQ(c.group_size(), 3);
}

TEST(GgufModel, KnownRowsMatchPackage) {
  REQUIRE_MODEL();
  auto f = GgufFile::open(model_path());
  auto fx = GgufFile::open(kData + "smollm2_rows.gguf");
  std::string where;
  {
    const auto& q = f.tensor("blk.0.attn_q.weight");
    std::vector<float> rows(4 * 576);
    f.dequantize_rows(q, 0, 4, rows.data());
    EXPECT_TRUE(bitwise_equal(rows, fx.dequantize(fx.tensor("blk.0.attn_q.weight.rows0-3")), &where)) << where;
  }
  {
    const auto& e = f.tensor("token_embd.weight");
    const auto ids = fx.get_int_array("token_embd.rows");
    ASSERT_EQ(ids.size(), 5u);
    std::vector<float> rows(ids.size() * 576);
    for (size_t i = 0; i < ids.size(); ++i) f.dequantize_rows(e, ids[i], 1, rows.data() + i * 576);
    EXPECT_TRUE(bitwise_equal(rows, fx.dequantize(fx.tensor("token_embd.weight.rows")), &where)) << where;
  }
}

// The whole model, every tensor, against checksums of the package's dequantization; also times it.
TEST(GgufModel, WholeModelChecksumsMatchPackage) {
  REQUIRE_MODEL();
  auto f = GgufFile::open(model_path());
  std::ifstream in(kData + "smollm2_checksums.json");
  const auto j = nlohmann::json::parse(in);
  const auto& sums = j.at("tensors");
  ASSERT_EQ(sums.size(), f.tensors().size());
  double seconds = 0;
  int64_t elements = 0;
  for (const auto& t : f.tensors()) {
    const auto t0 = std::chrono::steady_clock::now();
    auto v = f.dequantize(t);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    elements += t.n_elements;
    EXPECT_EQ(fmt::format("{:016x}", checksum(v)), sums.at(t.name).get<std::string>()) << t.name;
  }
  std::printf("dequantized %lld weights in %.3f s (%.0f M/s)\n", static_cast<long long>(elements), seconds,
              elements / seconds / 1e6);
}

// ---------------------------------------------------------------- CLI

TEST(GgufCli, InspectJson) {
  const auto r = kvpack::test::run_cli("inspect " + kData + "metadata_v3.gguf --json --tensors");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("version"), 3);
  EXPECT_EQ(j.at("alignment"), 64);
  EXPECT_EQ(j.at("tensors").size(), 4u);
  EXPECT_EQ(j.at("model").at("head_dim"), 16);
  EXPECT_EQ(j.at("metadata").at("test.u8").at("value"), 200);
  EXPECT_EQ(j.at("metadata").at("test.array_str").at("length"), 3);
}

TEST(GgufCli, InspectBadFileFails) {
  const auto r = kvpack::test::run_cli("inspect " + kData + "smollm2_checksums.json", true);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("not a GGUF file"), std::string::npos) << r.out;
}
