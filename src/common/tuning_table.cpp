// The tuning table's JSON form (`kvpack tune` writes it, plan() and `kvpack bench --table` read it). Host code
// without CUDA, so the CPU tests and the fuzz target exercise the same parser the GPU build uses.
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "common/builtin_tables.h"
#include "kvpack/decode.h"
#include "kvpack/error.h"

namespace kvpack {

namespace {

// Field `name` of entry `i` as an integer in [lo, hi]; names the source, the entry and the field otherwise.
int64_t int_field(const nlohmann::json& e, const char* name, int64_t lo, int64_t hi, const std::string& source,
                  size_t i) {
  const auto it = e.find(name);
  KVPACK_CHECK(it != e.end(), "tuning table {}: entries[{}].{} is missing", source, i, name);
  KVPACK_CHECK(it->is_number_integer(), "tuning table {}: entries[{}].{} is not an integer ({})", source, i, name,
               it->dump());
  // Unsigned values above INT64_MAX read as negative through get<int64_t>(); test the sign of the JSON value.
  KVPACK_CHECK(!(it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)),
               "tuning table {}: entries[{}].{} = {} is out of range [{}, {}]", source, i, name, it->dump(), lo, hi);
  const int64_t v = it->get<int64_t>();
  KVPACK_CHECK(v >= lo && v <= hi, "tuning table {}: entries[{}].{} = {} is out of range [{}, {}]", source, i, name, v,
               lo, hi);
  return v;
}

std::string string_field(const nlohmann::json& j, const char* name, const std::string& source) {
  const auto it = j.find(name);
  KVPACK_CHECK(it != j.end(), "tuning table {}: '{}' is missing", source, name);
  KVPACK_CHECK(it->is_string(), "tuning table {}: '{}' is not a string ({})", source, name, it->dump());
  return it->get<std::string>();
}

}  // namespace

TuningTable TuningTable::parse(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("tuning table {}: not valid JSON ({})", source, e.what());
  }
  KVPACK_CHECK(j.is_object(), "tuning table {}: the top level is not a JSON object", source);
  TuningTable t;
  t.gpu = string_field(j, "gpu", source);
  t.version = string_field(j, "version", source);
  const auto es = j.find("entries");
  KVPACK_CHECK(es != j.end(), "tuning table {}: 'entries' is missing", source);
  KVPACK_CHECK(es->is_array(), "tuning table {}: 'entries' is not an array", source);
  using Key = std::tuple<int, int, int, int, int, int, int64_t, bool>;
  std::map<Key, size_t> seen;
  for (size_t i = 0; i < es->size(); ++i) {
    const auto& e = (*es)[i];
    KVPACK_CHECK(e.is_object(), "tuning table {}: entries[{}] is not a JSON object", source, i);
    TuneEntry x;
    const auto f = e.find("format");
    KVPACK_CHECK(f != e.end() && f->is_string(), "tuning table {}: entries[{}].format is missing or not a string",
                 source, i);
    const auto fmt = parse_format(f->get<std::string>());
    KVPACK_CHECK(fmt.has_value(), "tuning table {}: entries[{}].format '{}' is not a format", source, i,
                 f->get<std::string>());
    x.format = *fmt;
    // The shapes plan_decode accepts: group sizes 1..8, head_dim 64 / 128, pages of 16..128 tokens.
    x.num_kv_heads = static_cast<int>(int_field(e, "num_kv_heads", 1, 1024, source, i));
    x.num_qo_heads = static_cast<int>(int_field(e, "num_qo_heads", 1, 8192, source, i));
    KVPACK_CHECK(x.num_qo_heads % x.num_kv_heads == 0 && x.num_qo_heads / x.num_kv_heads <= 8,
                 "tuning table {}: entries[{}] has num_qo_heads {} / num_kv_heads {}: not a group size of 1..8", source,
                 i, x.num_qo_heads, x.num_kv_heads);
    x.head_dim = static_cast<int>(int_field(e, "head_dim", 64, 128, source, i));
    KVPACK_CHECK(x.head_dim == 64 || x.head_dim == 128, "tuning table {}: entries[{}].head_dim = {} is not 64 or 128",
                 source, i, x.head_dim);
    x.page_size = static_cast<int>(int_field(e, "page_size", 16, 128, source, i));
    KVPACK_CHECK(x.page_size == 16 || x.page_size == 32 || x.page_size == 64 || x.page_size == 128,
                 "tuning table {}: entries[{}].page_size = {} is not 16, 32, 64 or 128", source, i, x.page_size);
    x.batch = static_cast<int>(int_field(e, "batch", 1, 65535, source, i));
    x.context = int_field(e, "context", 1, int64_t{1} << 30, source, i);
    x.num_splits = static_cast<int>(int_field(e, "num_splits", 1, 65535, source, i));
    x.stages = static_cast<int>(int_field(e, "stages", 2, 8, source, i));
    if (const auto m = e.find("median_us"); m != e.end()) {
      KVPACK_CHECK(m->is_number(), "tuning table {}: entries[{}].median_us is not a number ({})", source, i, m->dump());
      x.median_us = m->get<double>();
      KVPACK_CHECK(std::isfinite(x.median_us) && x.median_us >= 0,
                   "tuning table {}: entries[{}].median_us = {} is not a finite time >= 0", source, i, x.median_us);
    }
    if (const auto k = e.find("kernel"); k != e.end()) {
      KVPACK_CHECK(k->is_string() && (k->get<std::string>() == "regular" || k->get<std::string>() == "lean"),
                   "tuning table {}: entries[{}].kernel = {} is not \"regular\" or \"lean\"", source, i, k->dump());
      x.kernel = k->get<std::string>();
    }
    if (const auto l = e.find("leaf"); l != e.end()) {
      KVPACK_CHECK(l->is_boolean(), "tuning table {}: entries[{}].leaf = {} is not true or false", source, i, l->dump());
      KVPACK_CHECK(x.kernel == "lean", "tuning table {}: entries[{}].leaf is given on a \"{}\" kernel entry (leaf mode "
                   "is the lean kernel's)", source, i, x.kernel);
      x.leaf = l->get<bool>() ? 1 : 0;
    }
    // Two entries for one bucket would make the plan depend on their order in the file.
    const Key key{static_cast<int>(x.format), x.num_qo_heads, x.num_kv_heads, x.head_dim, x.page_size, x.batch,
                  x.context, x.kernel == "lean"};
    const auto [it, fresh] = seen.emplace(key, i);
    KVPACK_CHECK(fresh, "tuning table {}: entries[{}] repeats the bucket of entries[{}] ({} {}q/{}kv/{} page {}, "
                 "batch {}, context {}, {} kernel)", source, i, it->second, format_name(x.format), x.num_qo_heads,
                 x.num_kv_heads, x.head_dim, x.page_size, x.batch, x.context, x.kernel);
    t.entries.push_back(x);
  }
  return t;
}

TuningTable TuningTable::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPACK_CHECK(f.good(), "tuning table {}: cannot open", path);
  std::ostringstream s;
  s << f.rdbuf();
  return parse(s.str(), path);
}

std::string TuningTable::to_json() const {
  nlohmann::json j;
  j["gpu"] = gpu;
  j["version"] = version;
  j["entries"] = nlohmann::json::array();
  for (const auto& e : entries) {
    nlohmann::json x{{"format", format_name(e.format)}, {"num_qo_heads", e.num_qo_heads},
                     {"num_kv_heads", e.num_kv_heads}, {"head_dim", e.head_dim}, {"page_size", e.page_size},
                     {"batch", e.batch}, {"context", e.context}, {"num_splits", e.num_splits},
                     {"stages", e.stages}, {"median_us", e.median_us}, {"kernel", e.kernel}};
    if (e.leaf >= 0) x["leaf"] = e.leaf == 1;
    j["entries"].push_back(std::move(x));
  }
  return j.dump(1) + "\n";
}

void TuningTable::save(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  KVPACK_CHECK(f.good(), "tuning table {}: cannot write", path);
  f << to_json();
  KVPACK_CHECK(f.good(), "tuning table {}: write failed", path);
}

const TuneEntry* TuningTable::find(const DecodeShape& s, int batch, int64_t max_context) const {
  const TuneEntry* best = nullptr;
  for (const auto& e : entries) {
    // An entry measured on the other kernel (e.g. q4 before its lane layout) says nothing about this one.
    if (e.kernel != decode_kernel_name(s.format)) continue;
    if (e.format != s.format || e.num_qo_heads != s.num_qo_heads || e.num_kv_heads != s.num_kv_heads ||
        e.head_dim != s.head_dim || e.page_size != s.page_size || e.batch > batch || e.context > max_context)
      continue;
    if (!best || e.batch > best->batch || (e.batch == best->batch && e.context > best->context)) best = &e;
  }
  return best;
}

const std::vector<TuningTable>& builtin_tuning_tables() {
  static const std::vector<TuningTable> tables = [] {
    std::vector<TuningTable> v;
    for (int i = 0; i < detail::kNumBuiltinTables; ++i)
      v.push_back(TuningTable::parse(detail::kBuiltinTables[i].json,
                                     std::string("built-in ") + detail::kBuiltinTables[i].name));
    return v;
  }();
  return tables;
}

const TuningTable* builtin_tuning_table(const std::string& gpu_name) {
  for (const TuningTable& t : builtin_tuning_tables())
    if (t.gpu == gpu_name) return &t;
  return nullptr;
}

}  // namespace kvpack
