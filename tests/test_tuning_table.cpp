// The tuning table's JSON form (src/common/tuning_table.cpp): what `kvpack tune` writes loads back identically, the
// tables in bench/results/ load, and every kind of malformed file gives an error naming the source, the entry and
// the field instead of a table plan() would act on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvpack/decode.h"
#include "kvpack/error.h"

using namespace kvpack;

namespace {

nlohmann::json valid_entry() {
  return {{"format", "q4"}, {"num_qo_heads", 32}, {"num_kv_heads", 8}, {"head_dim", 128}, {"page_size", 16},
          {"batch", 8}, {"context", 32768}, {"num_splits", 16}, {"stages", 3}, {"median_us", 210.5}};
}
nlohmann::json valid_table() {
  nlohmann::json e2 = valid_entry();
  e2["batch"] = 64;
  e2["format"] = "fp8";
  return {{"gpu", "NVIDIA H200"}, {"version", "0.1.0"}, {"entries", {valid_entry(), e2}}};
}

// The error message of parsing `j` (dumped), or "" when it parses.
std::string error_of(const std::string& text) {
  try {
    TuningTable::parse(text, "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
std::string error_of(const nlohmann::json& j) { return error_of(j.dump()); }

}  // namespace

TEST(TuningTable, RoundTripThroughAFile) {
  std::mt19937 rng(20261205);
  TuningTable t;
  t.gpu = "NVIDIA H200";
  t.version = "0.1.0";
  const Format formats[] = {Format::bf16, Format::fp8, Format::int4, Format::int4h, Format::q4, Format::q3_5, Format::q3};
  for (int i = 0; i < 40; ++i) {
    TuneEntry e;
    e.format = formats[rng() % 7];
    e.num_kv_heads = 1 + static_cast<int>(rng() % 8);
    e.num_qo_heads = e.num_kv_heads * (1 + static_cast<int>(rng() % 8));
    e.head_dim = rng() % 2 ? 64 : 128;
    e.page_size = 16 << (rng() % 4);
    e.batch = 1 + i;  // distinct buckets
    e.context = int64_t{1024} << (rng() % 8);
    e.num_splits = 1 + static_cast<int>(rng() % 256);
    e.stages = 2 + static_cast<int>(rng() % 7);
    e.median_us = static_cast<double>(rng() % 100000) / 7.0;
    e.kernel = rng() % 2 ? "lean" : "regular";
    e.leaf = e.kernel == "lean" ? static_cast<int>(rng() % 3) - 1 : -1;  // -1 (absent), 0, 1 on lean entries
    t.entries.push_back(e);
  }
  const auto path = std::filesystem::temp_directory_path() / ("kvpack_tune_" + std::to_string(::getpid()) + ".json");
  t.save(path.string());
  const TuningTable u = TuningTable::load(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(u.gpu, t.gpu);
  EXPECT_EQ(u.version, t.version);
  ASSERT_EQ(u.entries.size(), t.entries.size());
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const auto &a = t.entries[i], &b = u.entries[i];
    EXPECT_EQ(a.format, b.format);
    EXPECT_EQ(a.num_qo_heads, b.num_qo_heads);
    EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.page_size, b.page_size);
    EXPECT_EQ(a.batch, b.batch);
    EXPECT_EQ(a.context, b.context);
    EXPECT_EQ(a.num_splits, b.num_splits);
    EXPECT_EQ(a.stages, b.stages);
    EXPECT_EQ(a.median_us, b.median_us);  // nlohmann writes doubles round-trip exact
    EXPECT_EQ(a.kernel, b.kernel);
    EXPECT_EQ(a.leaf, b.leaf);
  }
  EXPECT_EQ(u.to_json(), t.to_json());
}

TEST(TuningTable, TheTablesInBenchResultsLoad) {
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(std::string(KVPACK_SOURCE_DIR) + "/bench/results")) {
    const auto name = f.path().filename().string();
    if (name.rfind("tune_", 0) != 0 || f.path().extension() != ".json") continue;
    SCOPED_TRACE(name);
    const TuningTable t = TuningTable::load(f.path().string());
    EXPECT_FALSE(t.entries.empty());
    EXPECT_EQ(t.gpu.rfind("NVIDIA H", 0), 0u) << t.gpu;
    ++n;
  }
  EXPECT_GE(n, 1);
}

// The tables embedded in the library (CMakeLists.txt, KVPACK_BUILTIN_TABLES) are the committed files, one per GPU,
// measured with this library version; plan_decode finds them by the CUDA device name.
TEST(TuningTable, BuiltInTablesAreTheCommittedFiles) {
  const auto& tables = builtin_tuning_tables();
  ASSERT_EQ(tables.size(), 2u);
  const std::string dir = std::string(KVPACK_SOURCE_DIR) + "/bench/results/";
  EXPECT_EQ(tables[0].to_json(), TuningTable::load(dir + "tune_v9.json").to_json());
  EXPECT_EQ(tables[1].to_json(), TuningTable::load(dir + "tune_h100_v1.json").to_json());
  for (const TuningTable& t : tables) {
    EXPECT_EQ(t.version, KVPACK_VERSION);
    EXPECT_EQ(builtin_tuning_table(t.gpu), &t);
  }
  EXPECT_NE(builtin_tuning_table("NVIDIA H200"), nullptr);
  EXPECT_NE(builtin_tuning_table("NVIDIA H100 80GB HBM3"), nullptr);
  EXPECT_EQ(builtin_tuning_table("NVIDIA A100-SXM4-80GB"), nullptr);
  EXPECT_EQ(builtin_tuning_table(""), nullptr);
}

TEST(TuningTable, MalformedFilesNameTheFieldAndEntry) {
  EXPECT_EQ(error_of(valid_table()), "");
  struct Case {
    std::string what;
    std::function<void(nlohmann::json&)> edit;
    std::string expect;  // a substring of the message
  };
  const std::vector<Case> cases = {
      {"no gpu", [](nlohmann::json& j) { j.erase("gpu"); }, "'gpu' is missing"},
      {"gpu not a string", [](nlohmann::json& j) { j["gpu"] = 7; }, "'gpu' is not a string"},
      {"no version", [](nlohmann::json& j) { j.erase("version"); }, "'version' is missing"},
      {"no entries", [](nlohmann::json& j) { j.erase("entries"); }, "'entries' is missing"},
      {"entries an object", [](nlohmann::json& j) { j["entries"] = nlohmann::json::object(); }, "not an array"},
      {"entry not an object", [](nlohmann::json& j) { j["entries"][1] = 5; }, "entries[1] is not a JSON object"},
      {"unknown format", [](nlohmann::json& j) { j["entries"][0]["format"] = "q5"; }, "entries[0].format 'q5'"},
      {"format missing", [](nlohmann::json& j) { j["entries"][1].erase("format"); }, "entries[1].format is missing"},
      {"batch missing", [](nlohmann::json& j) { j["entries"][1].erase("batch"); }, "entries[1].batch is missing"},
      {"batch a string", [](nlohmann::json& j) { j["entries"][0]["batch"] = "8"; }, "entries[0].batch is not an integer"},
      {"batch a float", [](nlohmann::json& j) { j["entries"][0]["batch"] = 8.5; }, "entries[0].batch is not an integer"},
      {"batch 0", [](nlohmann::json& j) { j["entries"][0]["batch"] = 0; }, "entries[0].batch = 0 is out of range"},
      {"context negative", [](nlohmann::json& j) { j["entries"][1]["context"] = -1; }, "entries[1].context = -1"},
      {"context huge", [](nlohmann::json& j) { j["entries"][1]["context"] = uint64_t{1} << 63; },
       "entries[1].context = 9223372036854775808 is out of range"},
      {"head_dim 96", [](nlohmann::json& j) { j["entries"][0]["head_dim"] = 96; }, "entries[0].head_dim = 96 is not 64 or 128"},
      {"page 8", [](nlohmann::json& j) { j["entries"][0]["page_size"] = 8; }, "entries[0].page_size = 8"},
      {"page 48", [](nlohmann::json& j) { j["entries"][0]["page_size"] = 48; }, "is not 16, 32, 64 or 128"},
      {"kv heads 0", [](nlohmann::json& j) { j["entries"][0]["num_kv_heads"] = 0; }, "entries[0].num_kv_heads = 0"},
      {"group 16", [](nlohmann::json& j) { j["entries"][0]["num_qo_heads"] = 128; }, "not a group size of 1..8"},
      {"group not whole", [](nlohmann::json& j) { j["entries"][0]["num_qo_heads"] = 12; }, "not a group size of 1..8"},
      {"splits 0", [](nlohmann::json& j) { j["entries"][0]["num_splits"] = 0; }, "entries[0].num_splits = 0"},
      {"stages 9", [](nlohmann::json& j) { j["entries"][1]["stages"] = 9; }, "entries[1].stages = 9 is out of range [2, 8]"},
      {"median negative", [](nlohmann::json& j) { j["entries"][0]["median_us"] = -1.0; }, "entries[0].median_us = -1"},
      {"median a string", [](nlohmann::json& j) { j["entries"][0]["median_us"] = "fast"; }, "median_us is not a number"},
      {"duplicate bucket", [](nlohmann::json& j) { j["entries"].push_back(valid_entry()); },
       "entries[2] repeats the bucket of entries[0]"},
      {"kernel unknown", [](nlohmann::json& j) { j["entries"][1]["kernel"] = "fast"; },
       "entries[1].kernel = \"fast\" is not \"regular\" or \"lean\""},
      {"kernel a number", [](nlohmann::json& j) { j["entries"][0]["kernel"] = 1; }, "entries[0].kernel = 1 is not"},
      {"leaf a number",
       [](nlohmann::json& j) {
         j["entries"][0]["kernel"] = "lean";
         j["entries"][0]["leaf"] = 1;
       },
       "entries[0].leaf = 1 is not true or false"},
      {"leaf on a regular entry", [](nlohmann::json& j) { j["entries"][1]["leaf"] = true; },
       "entries[1].leaf is given on a \"regular\" kernel entry"},
      {"duplicate lean bucket",
       [](nlohmann::json& j) {
         for (int i = 0; i < 2; ++i) {
           auto e = valid_entry();
           e["kernel"] = "lean";
           j["entries"].push_back(e);
         }
       },
       "entries[3] repeats the bucket of entries[2]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    nlohmann::json j = valid_table();
    c.edit(j);
    const std::string msg = error_of(j);
    EXPECT_NE(msg.find("tuning table t.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
  // Not JSON at all, truncated JSON, and JSON of the wrong kind.
  const std::string text = valid_table().dump();
  EXPECT_NE(error_of(text.substr(0, text.size() / 2)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(std::string("\x00\x01garbage", 9)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(std::string("")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(std::string("[1, 2]")).find("the top level is not a JSON object"), std::string::npos);
  // Extra fields are ignored (forward compatibility), and an entry without median_us is valid.
  nlohmann::json j = valid_table();
  j["note"] = "tuned on a quiet machine";
  j["entries"][0]["comment"] = 1;
  j["entries"][1].erase("median_us");
  EXPECT_EQ(error_of(j), "");
}

// plan_decode's lookup: the format's own kernel only (q4 and q3 run the lean kernel, whose num_splits counts warps:
// the built-in tables' q4 / q3 entries were measured on the regular kernel and must not steer it), then the largest
// batch bucket <= the batch and in it the largest context bucket <= the context.
TEST(TuningTable, FindTakesTheFormatsKernelAndTheNearestBucketBelow) {
  nlohmann::json j = valid_table();  // q4 b8 32k (no kernel field: regular), fp8 b64 32k
  auto lean = [](int batch, int64_t context, int splits) {
    auto e = valid_entry();
    e["kernel"] = "lean";
    e["batch"] = batch;
    e["context"] = context;
    e["num_splits"] = splits;
    return e;
  };
  j["entries"].push_back(lean(8, 8192, 20));
  j["entries"].push_back(lean(8, 131072, 24));
  j["entries"].push_back(lean(64, 8192, 8));
  auto fp8_lean = valid_entry();
  fp8_lean["format"] = "fp8";
  fp8_lean["batch"] = 1;
  fp8_lean["kernel"] = "lean";
  j["entries"].push_back(fp8_lean);
  const TuningTable t = TuningTable::parse(j.dump(), "t.json");
  const DecodeShape q4{Format::q4, 32, 8, 128, 16};
  const TuneEntry* e = t.find(q4, 8, 32768);  // the regular b8 32k entry is skipped; lean b8 8k is the bucket
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kernel, "lean");
  EXPECT_EQ(e->num_splits, 20);
  EXPECT_EQ(t.find(q4, 16, 200000)->num_splits, 24);  // batch 8's largest context <= 200k
  EXPECT_EQ(t.find(q4, 100, 65536)->num_splits, 8);   // batch 64, context 8k
  EXPECT_EQ(t.find(q4, 4, 65536), nullptr);           // no batch bucket <= 4
  EXPECT_EQ(t.find(q4, 8, 4096), nullptr);            // no context bucket <= 4096
  EXPECT_EQ(t.find(DecodeShape{Format::q4, 32, 8, 128, 32}, 8, 32768), nullptr);  // other page size
  EXPECT_EQ(t.find(DecodeShape{Format::q3, 32, 8, 128, 16}, 8, 32768), nullptr);  // other format
  const DecodeShape fp8{Format::fp8, 32, 8, 128, 16};
  ASSERT_NE(t.find(fp8, 64, 32768), nullptr);  // fp8 runs the regular kernel: its lean entry is skipped
  EXPECT_EQ(t.find(fp8, 64, 32768)->kernel, "regular");
  EXPECT_EQ(t.find(fp8, 8, 32768), nullptr);
}

TEST(TuningTable, MissingFileNamesThePath) {
  try {
    TuningTable::load("/nonexistent/tune.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tune.json: cannot open"), std::string::npos) << e.what();
  }
}

// A lean entry's mode (DecodePlan::leaf) survives the JSON form; absent means the launcher's rule (-1).
TEST(TuningTable, LeanEntriesKeepTheirMode) {
  nlohmann::json j = valid_table();
  j["entries"][0]["kernel"] = "lean";
  j["entries"][0]["leaf"] = true;
  auto e = valid_entry();
  e["kernel"] = "lean";
  e["batch"] = 1;
  e["leaf"] = false;
  j["entries"].push_back(e);
  auto e2 = valid_entry();
  e2["kernel"] = "lean";
  e2["batch"] = 2;
  j["entries"].push_back(e2);
  const TuningTable t = TuningTable::parse(j.dump(), "t.json");
  ASSERT_EQ(t.entries.size(), 4u);
  EXPECT_EQ(t.entries[0].leaf, 1);
  EXPECT_EQ(t.entries[1].leaf, -1);  // fp8, regular
  EXPECT_EQ(t.entries[2].leaf, 0);
  EXPECT_EQ(t.entries[3].leaf, -1);
  const nlohmann::json back = nlohmann::json::parse(t.to_json());
  EXPECT_EQ(back["entries"][0]["leaf"], true);
  EXPECT_FALSE(back["entries"][1].contains("leaf"));
  EXPECT_EQ(back["entries"][2]["leaf"], false);
  EXPECT_FALSE(back["entries"][3].contains("leaf"));
}
