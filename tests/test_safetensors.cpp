// safetensors reader/writer: fixtures written by torch + python safetensors (scripts/make_safetensors_fixtures.py),
// malformed files (committed and made here by corrupting good bytes), exhaustive fp8 decode, writer round trip and
// a byte-exact golden file that python safetensors is checked to read.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <random>
#include <set>

#include "kvpack/bf16.h"
#include "kvpack/error.h"
#include "kvpack/safetensors.h"

using namespace kvpack;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(KVPACK_TEST_DATA) + "/safetensors";

std::vector<uint8_t> read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A fresh empty directory per test.
fs::path temp_dir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::path(testing::TempDir()) / fmt::format("kvpack_st_{}_{}_{}", ::getpid(), info->name(), rand());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Builds a file image: 8-byte length, header text, data bytes.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes, std::optional<uint64_t> hlen = {}) {
  std::vector<uint8_t> out(8);
  const uint64_t n = hlen.value_or(header.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0x5a);
  return out;
}

// Runs f, expects a kvpack::Error whose message contains every needle; returns the message.
template <typename F>
std::string expect_error(F&& f, std::initializer_list<std::string_view> needles) {
  try {
    f();
  } catch (const Error& e) {
    std::string m = e.what();
    for (auto n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message: " << m << "\nmissing: " << n;
    return m;
  }
  ADD_FAILURE() << "expected a kvpack::Error";
  return {};
}

std::string parse_error(const std::string& header, size_t data_bytes, std::initializer_list<std::string_view> n) {
  auto img = image(header, data_bytes);
  return expect_error([&] { SafetensorsFile::from_memory(img.data(), img.size(), "mem.safetensors"); }, n);
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return f32_bits(a) == f32_bits(b);  // also distinguishes -0 from +0
}

template <typename T>
std::vector<T> values(const StTensor& t) {
  EXPECT_EQ(t.n_bytes % sizeof(T), 0u);
  std::vector<T> v(t.n_bytes / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data, t.n_bytes);
  return v;
}

}  // namespace

TEST(Safetensors, DtypeTable) {
  const std::pair<StDtype, std::pair<std::string_view, size_t>> want[] = {
      {StDtype::F64, {"F64", 8}},    {StDtype::F32, {"F32", 4}},         {StDtype::F16, {"F16", 2}},
      {StDtype::BF16, {"BF16", 2}},  {StDtype::F8_E4M3, {"F8_E4M3", 1}}, {StDtype::F8_E5M2, {"F8_E5M2", 1}},
      {StDtype::I64, {"I64", 8}},    {StDtype::I32, {"I32", 4}},         {StDtype::I16, {"I16", 2}},
      {StDtype::I8, {"I8", 1}},      {StDtype::U8, {"U8", 1}},           {StDtype::BOOL, {"BOOL", 1}}};
  for (const auto& [d, ns] : want) {
    EXPECT_EQ(st_dtype_name(d), ns.first);
    EXPECT_EQ(st_dtype_size(d), ns.second);
  }
  EXPECT_TRUE(st_dtype_is_float(StDtype::F8_E5M2));
  EXPECT_FALSE(st_dtype_is_float(StDtype::BOOL));
}

// All 256 codes of each fp8 type against torch's float8_e4m3fn / float8_e5m2 -> float32.
TEST(Safetensors, Fp8ExhaustiveAgainstTorch) {
  auto f = SafetensorsFile::open(kDir + "/f8_all.safetensors");
  for (auto [name, dtype, fn] : {std::tuple{"e4m3", StDtype::F8_E4M3, &f8_e4m3_to_f32},
                                 std::tuple{"e5m2", StDtype::F8_E5M2, &f8_e5m2_to_f32}}) {
    const StTensor& q = f.tensor(name);
    ASSERT_EQ(q.dtype, dtype);
    ASSERT_EQ(q.numel(), 256);
    auto ref = values<float>(f.tensor(std::string(name) + ".as_f32"));
    auto got = to_float(q);
    ASSERT_EQ(ref.size(), 256u);
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
      ASSERT_EQ(q.data[c], c);
      EXPECT_TRUE(same_float(fn(static_cast<uint8_t>(c)), ref[c])) << name << " code " << c << ": " << ref[c];
      EXPECT_TRUE(same_float(got[c], ref[c])) << name << " code " << c;
      nans += std::isnan(ref[c]);
    }
    EXPECT_EQ(nans, dtype == StDtype::F8_E4M3 ? 2 : 6);  // e4m3fn: +-0x7f; e5m2: 3 mantissas x 2 signs
  }
  EXPECT_EQ(f8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8_e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(f8_e5m2_to_f32(0x7c), INFINITY);
  EXPECT_EQ(f8_e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
}

TEST(Safetensors, DtypesFixture) {
  const std::string path = kDir + "/dtypes.safetensors";
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"source", "kvpack"}}));
  EXPECT_EQ(f.tensors().size(), 19u);
  // tensors() is in data order, tiling the data section.
  for (size_t i = 1; i < f.tensors().size(); ++i)
    EXPECT_EQ(f.tensors()[i - 1].data + f.tensors()[i - 1].n_bytes, f.tensors()[i].data);

  auto base = values<float>(f.tensor("f32"));
  ASSERT_EQ(base.size(), 15u);
  EXPECT_EQ(f.tensor("f32").shape, (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(same_float(to_float(f.tensor("f32"))[1], -0.0f));
  for (const char* k : {"f64", "f16", "bf16", "f8_e4m3", "f8_e5m2"}) {
    const StTensor& t = f.tensor(k);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 5})) << k;
    auto ref = values<float>(f.tensor(std::string(k) + ".as_f32"));
    auto got = to_float(t);
    std::vector<float> into(t.numel());
    to_float_into(t, into.data());
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_TRUE(same_float(got[i], ref[i])) << k << "[" << i << "] " << got[i] << " vs torch " << ref[i];
      EXPECT_TRUE(same_float(into[i], ref[i])) << k << "[" << i << "]";
    }
  }
  EXPECT_EQ(values<int64_t>(f.tensor("i64")),
            (std::vector<int64_t>{-(1LL << 62), -1, 0, 1, 1LL << 40, 1LL << 62}));
  EXPECT_EQ(f.tensor("i64").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values<int32_t>(f.tensor("i32")), (std::vector<int32_t>{-6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(values<int16_t>(f.tensor("i16")), (std::vector<int16_t>{-32768, -1, 0, 32767}));
  EXPECT_EQ(values<int8_t>(f.tensor("i8")), (std::vector<int8_t>{-128, -1, 0, 127}));
  EXPECT_EQ(values<uint8_t>(f.tensor("u8")), (std::vector<uint8_t>{0, 1, 128, 255}));
  EXPECT_EQ(f.tensor("bool").dtype, StDtype::BOOL);
  EXPECT_EQ(values<uint8_t>(f.tensor("bool")), (std::vector<uint8_t>{1, 0, 1}));

  const StTensor& s = f.tensor("scalar");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(to_float(s), std::vector<float>{2.5f});
  const StTensor& e = f.tensor("empty");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.n_bytes, 0u);
  EXPECT_TRUE(to_float(e).empty());

  EXPECT_EQ(f.find("nope"), nullptr);
  expect_error([&] { f.tensor("nope"); }, {path, "'nope'"});
  expect_error([&] { to_float(f.tensor("i32")); }, {"'i32'", "I32", "not a floating-point"});
  expect_error([&] { to_float(f.tensor("bool")); }, {"'bool'", "BOOL"});

  // Copies share the mapping: the view outlives the original object.
  const StTensor* kept;
  std::optional<SafetensorsFile> copy;
  {
    auto g = SafetensorsFile::open(path);
    copy = g;
  }
  kept = &copy->tensor("i8");
  EXPECT_EQ(values<int8_t>(*kept)[0], -128);
}

TEST(Safetensors, FromMemoryUnalignedBuffer) {
  auto bytes = read_bytes(kDir + "/dtypes.safetensors");
  std::vector<uint8_t> buf(bytes.size() + 1);
  std::memcpy(buf.data() + 1, bytes.data(), bytes.size());  // every tensor now misaligned
  auto f = SafetensorsFile::from_memory(buf.data() + 1, bytes.size(), "buffer");
  EXPECT_EQ(f.path(), "buffer");
  auto a = to_float(f.tensor("f64"));
  auto b = values<float>(f.tensor("f64.as_f32"));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_float(a[i], b[i]));
}

TEST(Safetensors, ShardedCheckpoint) {
  const std::string dir = kDir + "/sharded";
  for (const std::string& p : {dir, dir + "/model.safetensors.index.json"}) {
    auto m = SafetensorsModel::open(p);
    EXPECT_EQ(m.names(), (std::vector<std::string>{"lm_head.bias", "model.embed.weight", "model.layers.0.w",
                                                   "model.layers.1.w"}));
    EXPECT_EQ(m.files().size(), 2u);
    EXPECT_EQ(m.metadata().at("total_size"), std::to_string(4 * 3 * 2 + 9 * 4 + 9 * 4 + 4 * 4));
    EXPECT_EQ(to_float(m.tensor("lm_head.bias")), (std::vector<float>{0, 1, 2, 3}));
    const StTensor& emb = m.tensor("model.embed.weight");
    EXPECT_EQ(emb.dtype, StDtype::BF16);
    EXPECT_EQ(emb.shape, (std::vector<int64_t>{4, 3}));
    // Same bytes as opening the shard directly.
    auto shard = SafetensorsFile::open(dir + "/model-00002-of-00002.safetensors");
    EXPECT_EQ(values<float>(m.tensor("model.layers.1.w")), values<float>(shard.tensor("model.layers.1.w")));
    EXPECT_EQ(m.find("missing"), nullptr);
    expect_error([&] { m.tensor("missing"); }, {p, "'missing'"});
    // Copies stay valid after the original is gone.
    auto copy = std::make_unique<SafetensorsModel>(m);
    m = SafetensorsModel{};
    EXPECT_EQ(to_float(copy->tensor("lm_head.bias"))[3], 3.0f);
  }
}

TEST(Safetensors, ModelFromSingleFileAndDirectory) {
  auto d = temp_dir();
  write_safetensors((d / "model.safetensors").string(), {st_f32_tensor("w", {2}, {1, 2})}, {{"k", "v"}});
  for (const auto& p : {d.string(), (d / "model.safetensors").string()}) {
    auto m = SafetensorsModel::open(p);
    EXPECT_EQ(m.names(), std::vector<std::string>{"w"});
    EXPECT_EQ(m.metadata().at("k"), "v");
  }
  // Without model.safetensors or an index, every *.safetensors is loaded; a name in two files is an error.
  auto d2 = temp_dir();
  write_safetensors((d2 / "a.safetensors").string(), {st_f32_tensor("x", {1}, {1})}, {});
  write_safetensors((d2 / "b.safetensors").string(), {st_f32_tensor("y", {1}, {2})}, {});
  EXPECT_EQ(SafetensorsModel::open(d2.string()).names(), (std::vector<std::string>{"x", "y"}));
  write_safetensors((d2 / "c.safetensors").string(), {st_f32_tensor("x", {1}, {3})}, {});
  expect_error([&] { SafetensorsModel::open(d2.string()); }, {"'x'", "a.safetensors", "c.safetensors"});
  expect_error([&] { SafetensorsModel::open(temp_dir().string()); }, {"no model.safetensors"});
  expect_error([&] { SafetensorsModel::open((d / "nothing").string()); }, {"nothing", "no such file"});
  fs::remove_all(d);
  fs::remove_all(d2);
}

TEST(Safetensors, BrokenCheckpoints) {
  expect_error([&] { SafetensorsModel::open(kDir + "/sharded_missing_shard"); },
               {"model.safetensors.index.json", "model-00003-of-00003.safetensors", "missing", "'x'"});
  expect_error([&] { SafetensorsModel::open(kDir + "/sharded_missing_tensor"); },
               {"model.safetensors.index.json", "'model.layers.2.w'", "model-00002-of-00002.safetensors",
                "no such tensor"});
  // Index problems made here.
  auto d = temp_dir();
  fs::copy(kDir + "/sharded", d, fs::copy_options::recursive);
  auto index = (d / "model.safetensors.index.json").string();
  auto with_index = [&](const std::string& text, std::initializer_list<std::string_view> needles) {
    std::ofstream(index, std::ios::trunc) << text;
    expect_error([&] { SafetensorsModel::open(d.string()); }, needles);
  };
  with_index("{\"weight_map\": ", {index, "not valid JSON"});
  with_index("[]", {index, "index is an array, expected a JSON object"});
  with_index("{\"metadata\": {}}", {index, "missing field 'weight_map'"});
  with_index("{\"weight_map\": []}", {index, "'weight_map'", "expected an object"});
  with_index("{\"weight_map\": {}}", {index, "empty"});
  with_index("{\"weight_map\": {\"a\": 3}}", {index, "weight_map['a']", "expected a shard file name"});
  with_index("{\"weight_map\": {\"a\": \"../x.safetensors\"}}", {index, "not a file name inside"});
  with_index("{\"weight_map\": {\"a\": \"/etc/passwd\"}}", {index, "not a file name inside"});
  with_index(R"({"weight_map": {"lm_head.bias": "model-00002-of-00002.safetensors",
                                "lm_head.bias": "model-00001-of-00002.safetensors"}})",
             {index, "duplicate key 'lm_head.bias'", "'weight_map'"});
  // A shard that is itself corrupt: the error names the shard file.
  std::ofstream(index, std::ios::trunc) << R"({"weight_map": {"x": "bad.safetensors"}})";
  std::ofstream(d / "bad.safetensors") << "xyz";
  expect_error([&] { SafetensorsModel::open(d.string()); }, {"bad.safetensors", "too short"});
  fs::remove_all(d);
}

TEST(Safetensors, MalformedFixtures) {
  const std::pair<const char*, std::vector<std::string_view>> cases[] = {
      {"bad_header_len", {"header length 1000000 exceeds"}},
      {"bad_json", {"header is not valid JSON"}},
      {"bad_dtype", {"tensor 'a'", "unknown dtype 'F17'"}},
      {"bad_overlap", {"tensor 'b'", "[4, 12]", "overlap tensor 'a' [0, 8]"}},
      {"bad_hole", {"tensor 'b'", "hole of 4 bytes after tensor 'a'"}},
      {"bad_size", {"tensor 'a'", "shape [3] of dtype F32 needs 12 bytes", "span 8 bytes"}},
      {"bad_oob", {"tensor 'a'", "[0, 16] are out of bounds", "8 bytes"}},
      {"bad_trailing", {"tensors cover only 4", "4 trailing bytes"}},
      {"bad_missing_field", {"tensor 'a'", "missing field 'shape'"}},
      {"bad_metadata", {"__metadata__ entry 'n'", "expected a string"}},
      {"bad_duplicate", {"duplicate key 'a'"}},
  };
  for (const auto& [name, needles] : cases) {
    const std::string path = kDir + "/" + name + ".safetensors";
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      for (auto n : needles) EXPECT_NE(m.find(n), std::string::npos) << name << ": " << m << "\nmissing: " << n;
    }
  }
}

TEST(Safetensors, IllTypedHeaders) {
  const std::string ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  parse_error("", 0, {"mem.safetensors", "not start with '{'"});
  parse_error("[1]", 0, {"not start with '{'"});
  parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x)", 8, {"not valid JSON"});
  parse_error(R"({"a":1})", 0, {"tensor 'a'", "entry is a non-negative integer"});
  parse_error(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8, {"tensor 'a'", "missing field 'dtype'"});
  parse_error(R"({"a":{"dtype":"F32","shape":[2]}})", 8, {"missing field 'data_offsets'"});
  parse_error(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", 8, {"'dtype' is a non-negative integer"});
  parse_error(R"({"a":{"dtype":"U32","shape":[2],"data_offsets":[0,8]}})", 8, {"unsupported dtype 'U32'"});
  parse_error(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8, {"'shape' is a string"});
  parse_error(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {"shape[0] is a negative integer"});
  parse_error(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8, {"shape[0] is a floating-point"});
  parse_error(R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8, {"too large"});
  parse_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
              {"more than 2^63 elements"});
  parse_error(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
              {"more than 2^64 bytes"});
  parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, {"an array of 1 elements"});
  parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":{}}})", 8, {"'data_offsets' is an object"});
  parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8, {"data_offsets[1] is a negative"});
  parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, {"[8, 0] are out of order"});
  parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, {"hole of 4 bytes at the start"});
  parse_error(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8,
              {"duplicate key 'dtype' inside 'a'"});
  parse_error(R"({"__metadata__":[],"a":{)" + ok + "}}", 8, {"__metadata__ is an array"});
  parse_error(R"({"a":{)" + ok + R"(},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 8,
              {"tensor 'b'", "[4, 4] overlap tensor 'a'"});
  // Accepted edge cases: null metadata, unknown extra fields (ignored, like the reference), zero-size tensors.
  auto img = image(R"({"__metadata__":null,"z":{"dtype":"I8","shape":[0,5],"data_offsets":[8,8]},"a":{)" + ok +
                       R"(,"extra":1}})",
                   8);
  auto f = SafetensorsFile::from_memory(img.data(), img.size(), "mem");
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[1].name, "z");
  // Too short for the length field, and the length field pointing anywhere but the real header.
  uint8_t tiny[7] = {};
  expect_error([&] { SafetensorsFile::from_memory(tiny, 7, "tiny"); }, {"tiny", "7 bytes, too short"});
  expect_error([&] { SafetensorsFile::from_memory(nullptr, 0, "empty"); }, {"empty", "0 bytes"});
  const std::string h = R"({"a":{)" + ok + "}}";
  for (uint64_t bad : {uint64_t{0}, uint64_t{1}, h.size() - 1, h.size() + 1, h.size() + 8, h.size() + 9,
                       uint64_t{1} << 40, UINT64_MAX}) {
    auto b = image(h, 8, bad);
    EXPECT_THROW(SafetensorsFile::from_memory(b.data(), b.size(), "len"), Error) << bad;
  }
  auto big = image(h, 8, 100'000'001);
  big.resize(100'000'016);
  expect_error([&] { SafetensorsFile::from_memory(big.data(), big.size(), "big"); }, {"100 MB limit"});
}

// Every truncation of a valid file must be rejected with a kvpack::Error, and every single-byte corruption of the
// header must either parse or give a kvpack::Error (never another exception or a crash; ASan covers the rest in
// the fuzzer).
TEST(Safetensors, ProgrammaticCorruption) {
  const auto good = read_bytes(kDir + "/dtypes.safetensors");
  ASSERT_GT(good.size(), 100u);
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + len);  // own allocation so ASan sees overreads
    EXPECT_THROW(SafetensorsFile::from_memory(cut.data(), cut.size(), "cut"), Error) << "length " << len;
  }
  uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  int accepted = 0, rejected = 0;
  for (size_t i = 0; i < 8 + hlen; ++i) {
    for (uint8_t v : {uint8_t{0}, uint8_t{'"'}, uint8_t{'9'}, uint8_t{'}'}, uint8_t{0xff},
                      static_cast<uint8_t>(good[i] ^ 1)}) {
      auto bad = good;
      bad[i] = v;
      try {
        auto f = SafetensorsFile::from_memory(bad.data(), bad.size(), "flip");
        for (const auto& t : f.tensors())
          if (st_dtype_is_float(t.dtype)) to_float(t);
        ++accepted;
      } catch (const Error&) {
        ++rejected;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << i << " = " << int(v) << ": non-kvpack exception " << e.what();
      }
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(accepted, 0);  // e.g. a digit changed inside a metadata string
}

TEST(Safetensors, WriterRoundTrip) {
  std::mt19937_64 rng(7);
  const StDtype all[] = {StDtype::F64, StDtype::F32,  StDtype::F16, StDtype::BF16, StDtype::F8_E4M3, StDtype::F8_E5M2,
                         StDtype::I64, StDtype::I32,  StDtype::I16, StDtype::I8,   StDtype::U8,      StDtype::BOOL};
  std::vector<StWriteTensor> ts;
  for (int i = 0; i < 40; ++i) {
    StWriteTensor t;
    t.name = fmt::format("layer.{}.{}", rng() % 1000, i);
    t.dtype = all[rng() % 12];
    int rank = static_cast<int>(rng() % 4);
    for (int r = 0; r < rank; ++r) t.shape.push_back(static_cast<int64_t>(rng() % (i == 5 ? 1 : 7)));
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    t.bytes.resize(n * st_dtype_size(t.dtype));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    ts.push_back(std::move(t));
  }
  std::map<std::string, std::string> md{{"format", "pt"}, {"quote\"and\\slash", "line\nbreak \xc3\xa9"}, {"", ""}};
  auto d = temp_dir();
  const std::string p1 = (d / "a.safetensors").string(), p2 = (d / "b.safetensors").string();
  write_safetensors(p1, ts, md);
  auto f = SafetensorsFile::open(p1);
  EXPECT_EQ(f.metadata(), md);
  ASSERT_EQ(f.tensors().size(), ts.size());
  for (const auto& t : ts) {
    const StTensor& r = f.tensor(t.name);
    EXPECT_EQ(r.dtype, t.dtype) << t.name;
    EXPECT_EQ(r.shape, t.shape) << t.name;
    ASSERT_EQ(r.n_bytes, t.bytes.size()) << t.name;
    EXPECT_TRUE(r.n_bytes == 0 || std::memcmp(r.data, t.bytes.data(), r.n_bytes) == 0) << t.name;
  }
  // 8-aligned data section; every tensor naturally aligned in the file.
  const uint8_t* base = f.tensors().front().data - (8 + f.header_size());
  EXPECT_EQ((8 + f.header_size()) % 8, 0u);
  for (const auto& t : f.tensors()) EXPECT_EQ((t.data - base) % st_dtype_size(t.dtype), 0u) << t.name;
  // Deterministic: input order does not matter.
  auto rev = ts;
  std::reverse(rev.begin(), rev.end());
  write_safetensors(p2, rev, md);
  EXPECT_EQ(read_bytes(p1), read_bytes(p2));
  // Overwriting replaces atomically and leaves no temporary file behind.
  write_safetensors(p2, {st_f32_tensor("only", {}, {1.5f})}, {});
  EXPECT_EQ(to_float(SafetensorsFile::open(p2).tensor("only")), std::vector<float>{1.5f});
  EXPECT_EQ(SafetensorsFile::open(p2).metadata().size(), 0u);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator{}), 2);
  // No tensors at all is a valid file.
  write_safetensors(p2, {}, {});
  EXPECT_TRUE(SafetensorsFile::open(p2).tensors().empty());
  fs::remove_all(d);
}

TEST(Safetensors, WriterRejectsBadInput) {
  auto d = temp_dir();
  const std::string p = (d / "x.safetensors").string();
  auto f32 = [](std::string n) { return st_f32_tensor(std::move(n), {2}, {1, 2}); };
  expect_error([&] { write_safetensors(p, {f32("a"), f32("a")}, {}); }, {p, "'a'", "duplicate"});
  expect_error([&] { write_safetensors(p, {f32("")}, {}); }, {p, "empty name"});
  expect_error([&] { write_safetensors(p, {f32("__metadata__")}, {}); }, {p, "reserved"});
  expect_error([&] { write_safetensors(p, {f32("bad\xff")}, {}); }, {p, "not valid UTF-8"});
  expect_error([&] { write_safetensors(p, {f32("a")}, {{"k", "\xc3"}}); }, {p, "metadata value for 'k'", "UTF-8"});
  expect_error([&] { write_safetensors(p, {StWriteTensor{"a", StDtype::F16, {3}, std::vector<uint8_t>(4)}}, {}); },
               {p, "'a'", "shape [3] of dtype F16 needs 6 bytes but 4"});
  expect_error([&] { write_safetensors(p, {StWriteTensor{"a", StDtype::U8, {-1}, {}}}, {}); },
               {p, "shape[0] = -1 is negative"});
  expect_error([&] { st_f32_tensor("v", {2, 2}, {1, 2, 3}); }, {"'v'", "4 elements but 3 values"});
  EXPECT_FALSE(fs::exists(p));  // nothing written on validation errors
  expect_error([&] { write_safetensors((d / "no/such/dir.safetensors").string(), {f32("a")}, {}); },
               {"no/such/dir.safetensors", "cannot create"});
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator{}), 0);
  fs::remove_all(d);
}

// The writer's bytes are pinned by a committed golden file, which scripts/make_safetensors_fixtures.py checks the
// python safetensors package reads back exactly (keep the contents in sync with golden_expected() there).
TEST(Safetensors, WriterGolden) {
  std::vector<StWriteTensor> ts;
  auto add = [&](std::string name, StDtype d, std::vector<int64_t> shape, const void* p, size_t n) {
    std::vector<uint8_t> b(n);
    if (n) std::memcpy(b.data(), p, n);
    ts.push_back(StWriteTensor{std::move(name), d, std::move(shape), std::move(b)});
  };
  const uint16_t bf[] = {f32_to_bf16(-2.0f), f32_to_bf16(-0.5f), f32_to_bf16(0.0f), f32_to_bf16(3.25f)};
  const uint16_t hf[] = {f32_to_f16(1.5f), f32_to_f16(-0.125f), f32_to_f16(65504.0f)};
  const int32_t i32[] = {-1, 0, 7, 2147483647};
  const uint8_t u8[] = {0, 1, 127, 128, 255};
  const int64_t i64 = 42;
  const uint8_t f8[] = {0x00, 0x38, 0xb8, 0x7e};
  ts.push_back(st_f32_tensor("a.f32", {2, 3}, {-1, -0.5, 0, 0.5, 1, 1.5}));
  add("b.bf16", StDtype::BF16, {4}, bf, sizeof bf);
  add("c.f16", StDtype::F16, {3}, hf, sizeof hf);
  add("d.i32", StDtype::I32, {2, 2}, i32, sizeof i32);
  add("e.u8", StDtype::U8, {5}, u8, sizeof u8);
  add("f.empty", StDtype::F32, {0, 4}, nullptr, 0);
  add("g.scalar", StDtype::I64, {}, &i64, sizeof i64);
  add("h.f8", StDtype::F8_E4M3, {4}, f8, sizeof f8);
  const std::map<std::string, std::string> md{{"format", "pt"}, {"kvpack", "golden"}, {"unicode", "h\xc3\xa9llo \xe2\x9c\x93"}};
  const std::string golden = kDir + "/writer_golden.safetensors";
  if (const char* u = std::getenv("KVPACK_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    write_safetensors(golden, ts, md);
    GTEST_SKIP() << "rewrote " << golden;
  }
  auto d = temp_dir();
  const std::string p = (d / "g.safetensors").string();
  write_safetensors(p, ts, md);
  auto want = read_bytes(golden);
  ASSERT_FALSE(want.empty()) << golden << " missing";
  EXPECT_EQ(read_bytes(p), want) << "writer output changed; if intended, regenerate with KVPACK_UPDATE_GOLDEN=1 "
                                    "and re-run scripts/make_safetensors_fixtures.py --check";
  fs::remove_all(d);
}
