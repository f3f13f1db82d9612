// safetensors reader/writer. Validation follows the reference Rust implementation (huggingface/safetensors):
// the data section must be covered exactly by the tensors, in order, with no holes, overlaps or trailing bytes.
// We additionally reject duplicate JSON keys (nlohmann would silently keep the last one) and report every problem
// with the file, the tensor or field, and what is wrong.
#include "kvpack/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "kvpack/bf16.h"
#include "kvpack/block/common.h"
#include "kvpack/error.h"
#include "kvpack/mapped_file.h"

namespace kvpack {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The reference implementation refuses headers above 100 MB; a real one is a few hundred KB at most.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct DtypeInfo {
  StDtype dtype;
  std::string_view name;
  size_t size;
  bool is_float;
};
constexpr DtypeInfo kDtypes[] = {
    {StDtype::F64, "F64", 8, true},         {StDtype::F32, "F32", 4, true},
    {StDtype::F16, "F16", 2, true},         {StDtype::BF16, "BF16", 2, true},
    {StDtype::F8_E4M3, "F8_E4M3", 1, true}, {StDtype::F8_E5M2, "F8_E5M2", 1, true},
    {StDtype::I64, "I64", 8, false},        {StDtype::I32, "I32", 4, false},
    {StDtype::I16, "I16", 2, false},        {StDtype::I8, "I8", 1, false},
    {StDtype::U8, "U8", 1, false},          {StDtype::BOOL, "BOOL", 1, false},
};

const DtypeInfo& dtype_info(StDtype d) {
  for (const auto& i : kDtypes)
    if (i.dtype == d) return i;
  fail("safetensors: invalid StDtype value {}", static_cast<int>(d));
}

// Dtypes the safetensors format defines but kvpack does not read; named separately so the error says "unsupported"
// rather than "unknown".
constexpr std::string_view kOtherKnownDtypes[] = {"U16", "U32", "U64", "C64", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"};

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// "a string", "an array", "a negative integer", ... for messages of the form "X is {}, expected Y".
std::string type_name(const json& j) {
  if (j.is_number_unsigned()) return "a non-negative integer";
  if (j.is_number_integer()) return "a negative integer";
  if (j.is_number_float()) return "a floating-point number";
  if (j.is_null()) return "null";
  if (j.is_object() || j.is_array()) return std::string("an ") + j.type_name();
  return std::string("a ") + j.type_name();
}

// Parses JSON text, rejecting duplicate keys in any object (the DOM would silently keep the last one). `file` and
// `what` name the source in errors.
json parse_json_strict(const char* begin, const char* end, const std::string& file, std::string_view what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string dup;
  std::string dup_parent;
  std::vector<std::string> last_key;  // key under which each open object sits (for the message)
  std::string pending_key;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        last_key.push_back(pending_key);
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        if (!last_key.empty()) last_key.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        pending_key = k;
        if (!keys.empty() && !keys.back().insert(k).second && dup.empty()) {
          dup = k;
          dup_parent = last_key.empty() ? "" : last_key.back();
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    fail("{}: {} is not valid JSON: {}", file, what, e.what());
  }
  if (!dup.empty()) {
    if (dup_parent.empty())
      fail("{}: {} has duplicate key '{}'", file, what, dup);
    fail("{}: {} has duplicate key '{}' inside '{}'", file, what, dup, dup_parent);
  }
  return j;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// numel * elem_size with overflow detection; nullopt-free: throws with the given context.
size_t checked_bytes(const std::vector<int64_t>& shape, size_t elem, const std::string& ctx) {
  for (int64_t d : shape)
    if (d == 0) return 0;
  uint64_t n = 1;
  for (int64_t d : shape)
    KVPACK_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) && n <= INT64_MAX,
                 "{}: shape {} has more than 2^63 elements", ctx, shape_str(shape));
  uint64_t b = 0;
  KVPACK_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(elem), &b) && b <= SIZE_MAX,
               "{}: shape {} needs more than 2^64 bytes", ctx, shape_str(shape));
  return static_cast<size_t>(b);
}

}  // namespace

std::string_view st_dtype_name(StDtype d) { return dtype_info(d).name; }
size_t st_dtype_size(StDtype d) { return dtype_info(d).size; }
bool st_dtype_is_float(StDtype d) { return dtype_info(d).is_float; }

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated on open: no overflow
  return n;
}

// ---------------------------------------------------------------------------------------------- reading one file

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto map = std::make_shared<const MappedFile>(path);
  return parse(map->data(), map->size(), path, map);
}

SafetensorsFile SafetensorsFile::from_memory(const uint8_t* p, size_t n, std::string name) {
  return parse(p, n, std::move(name), nullptr);
}

SafetensorsFile SafetensorsFile::parse(const uint8_t* p, size_t n, std::string name,
                                       std::shared_ptr<const MappedFile> map) {
  SafetensorsFile f;
  f.path_ = std::move(name);
  f.map_ = std::move(map);
  const std::string& file = f.path_;

  KVPACK_CHECK(n >= 8, "{}: file is {} bytes, too short for the 8-byte header length", file, n);
  const uint64_t hlen = read_le64(p);
  KVPACK_CHECK(hlen <= n - 8, "{}: header length {} exceeds the {} bytes that follow it in the file", file, hlen,
               n - 8);
  KVPACK_CHECK(hlen <= kMaxHeaderSize, "{}: header length {} exceeds the 100 MB limit", file, hlen);
  KVPACK_CHECK(hlen >= 2 && p[8] == '{', "{}: header does not start with '{{' (not a safetensors file?)", file);
  f.header_size_ = static_cast<size_t>(hlen);
  const char* hbeg = reinterpret_cast<const char*>(p + 8);
  json h = parse_json_strict(hbeg, hbeg + hlen, file, "header");
  KVPACK_CHECK(h.is_object(), "{}: header is {}, expected a JSON object", file, type_name(h));

  const uint8_t* data = p + 8 + hlen;
  const size_t data_size = n - 8 - static_cast<size_t>(hlen);

  struct Entry {
    StTensor t;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  entries.reserve(h.size());
  for (auto& [key, val] : h.items()) {
    if (key == "__metadata__") {
      if (val.is_null()) continue;
      KVPACK_CHECK(val.is_object(), "{}: __metadata__ is {}, expected an object of strings", file,
                   type_name(val));
      for (auto& [mk, mv] : val.items()) {
        KVPACK_CHECK(mv.is_string(), "{}: __metadata__ entry '{}' is {}, expected a string", file, mk,
                     type_name(mv));
        f.metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    const std::string ctx = fmt::format("{}: tensor '{}'", file, key);
    KVPACK_CHECK(val.is_object(), "{}: entry is {}, expected an object with dtype, shape, data_offsets", ctx,
                 type_name(val));
    Entry e{};
    e.t.name = key;

    auto dt = val.find("dtype");
    KVPACK_CHECK(dt != val.end(), "{}: missing field 'dtype'", ctx);
    KVPACK_CHECK(dt->is_string(), "{}: field 'dtype' is {}, expected a string", ctx, type_name(*dt));
    const auto& dname = dt->get_ref<const std::string&>();
    const DtypeInfo* info = nullptr;
    for (const auto& i : kDtypes)
      if (i.name == dname) info = &i;
    if (!info) {
      bool known = std::find(std::begin(kOtherKnownDtypes), std::end(kOtherKnownDtypes), dname) !=
                   std::end(kOtherKnownDtypes);
      fail("{}: {} dtype '{}' (supported: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL)", ctx,
           known ? "unsupported" : "unknown", dname);
    }
    e.t.dtype = info->dtype;

    auto sh = val.find("shape");
    KVPACK_CHECK(sh != val.end(), "{}: missing field 'shape'", ctx);
    KVPACK_CHECK(sh->is_array(), "{}: field 'shape' is {}, expected an array of integers", ctx, type_name(*sh));
    for (size_t i = 0; i < sh->size(); ++i) {
      const json& d = (*sh)[i];
      KVPACK_CHECK(d.is_number_unsigned(), "{}: shape[{}] is {}, expected a non-negative integer", ctx, i,
                   type_name(d));
      uint64_t v = d.get<uint64_t>();
      KVPACK_CHECK(v <= static_cast<uint64_t>(INT64_MAX), "{}: shape[{}] = {} is too large", ctx, i, v);
      e.t.shape.push_back(static_cast<int64_t>(v));
    }

    auto off = val.find("data_offsets");
    KVPACK_CHECK(off != val.end(), "{}: missing field 'data_offsets'", ctx);
    KVPACK_CHECK(off->is_array() && off->size() == 2, "{}: field 'data_offsets' is {}, expected [begin, end]", ctx,
                 off->is_array() ? fmt::format("an array of {} elements", off->size()) : type_name(*off));
    for (int i = 0; i < 2; ++i)
      KVPACK_CHECK((*off)[i].is_number_unsigned(), "{}: data_offsets[{}] is {}, expected a non-negative integer",
                   ctx, i, type_name((*off)[i]));
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    KVPACK_CHECK(e.begin <= e.end, "{}: data_offsets [{}, {}] are out of order (begin > end)", ctx, e.begin, e.end);
    KVPACK_CHECK(e.end <= data_size, "{}: data_offsets [{}, {}] are out of bounds: the data section is {} bytes", ctx,
                 e.begin, e.end, data_size);
    const size_t need = checked_bytes(e.t.shape, info->size, ctx);
    KVPACK_CHECK(need == e.end - e.begin,
                 "{}: shape {} of dtype {} needs {} bytes but data_offsets [{}, {}] span {} bytes", ctx,
                 shape_str(e.t.shape), info->name, need, e.begin, e.end, e.end - e.begin);
    e.t.data = data + e.begin;
    e.t.n_bytes = need;
    entries.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: sorted by offset, each begins where the previous ended.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const auto& e : entries) {
    if (e.begin < pos)
      fail("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", file, e.t.name, e.begin, e.end,
           prev->t.name, prev->begin, prev->end);
    if (e.begin > pos) {
      if (prev)
        fail("{}: tensor '{}': data_offsets [{}, {}] leave a hole of {} bytes after tensor '{}' [{}, {}]", file,
             e.t.name, e.begin, e.end, e.begin - pos, prev->t.name, prev->begin, prev->end);
      fail("{}: tensor '{}': data_offsets [{}, {}] leave a hole of {} bytes at the start of the data section", file,
           e.t.name, e.begin, e.end, e.begin);
    }
    pos = e.end;
    prev = &e;
  }
  KVPACK_CHECK(pos == data_size, "{}: data section is {} bytes but the tensors cover only {} ({} trailing bytes)",
               file, data_size, pos, data_size - pos);

  f.tensors_.reserve(entries.size());
  for (auto& e : entries) {
    f.by_name_.emplace(e.t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(e.t));
  }
  return f;
}

const StTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const StTensor& SafetensorsFile::tensor(std::string_view name) const {
  const StTensor* t = find(name);
  KVPACK_CHECK(t, "{}: no tensor named '{}' ({} tensors in the file)", path_, name, tensors_.size());
  return *t;
}

// ------------------------------------------------------------------------------------------------ checkpoints

namespace {

bool is_index_file(const fs::path& p) { return p.filename().string().ends_with(".json"); }

}  // namespace

SafetensorsModel SafetensorsModel::open(const std::string& path) {
  SafetensorsModel m;
  m.path_ = path;
  std::error_code ec;
  const fs::path root(path);
  auto st = fs::status(root, ec);
  KVPACK_CHECK(!ec && fs::exists(st), "{}: no such file or directory", path);

  fs::path index;
  std::vector<fs::path> singles;
  if (fs::is_directory(st)) {
    if (fs::exists(root / "model.safetensors.index.json")) {
      index = root / "model.safetensors.index.json";
    } else if (fs::exists(root / "model.safetensors")) {
      singles.push_back(root / "model.safetensors");
    } else {
      for (const auto& de : fs::directory_iterator(root, ec))
        if (de.path().extension() == ".safetensors") singles.push_back(de.path());
      KVPACK_CHECK(!ec, "{}: cannot list directory: {}", path, ec.message());
      std::sort(singles.begin(), singles.end());
      KVPACK_CHECK(!singles.empty(),
                   "{}: directory has no model.safetensors.index.json, model.safetensors or *.safetensors", path);
    }
  } else if (is_index_file(root)) {
    index = root;
  } else {
    singles.push_back(root);
  }

  if (index.empty()) {
    for (const auto& p : singles) {
      m.files_.push_back(SafetensorsFile::open(p.string()));
      const auto& ts = m.files_.back().tensors();
      for (size_t i = 0; i < ts.size(); ++i) {
        auto [it, fresh] = m.by_name_.emplace(ts[i].name, std::pair{m.files_.size() - 1, i});
        KVPACK_CHECK(fresh, "{}: tensor '{}' appears in both {} and {}", path, ts[i].name,
                     m.files_[it->second.first].path(), p.string());
      }
    }
    if (m.files_.size() == 1) m.metadata_ = m.files_[0].metadata();
    return m;
  }

  // Sharded checkpoint: {"metadata": {...}, "weight_map": {tensor: shard file}}.
  const std::string ipath = index.string();
  MappedFile imap(ipath);
  const char* ib = reinterpret_cast<const char*>(imap.data());
  json j = parse_json_strict(ib, ib + imap.size(), ipath, "index");
  KVPACK_CHECK(j.is_object(), "{}: index is {}, expected a JSON object", ipath, type_name(j));
  if (auto md = j.find("metadata"); md != j.end() && !md->is_null()) {
    KVPACK_CHECK(md->is_object(), "{}: field 'metadata' is {}, expected an object", ipath, type_name(*md));
    for (auto& [k, v] : md->items()) m.metadata_.emplace(k, v.is_string() ? v.get<std::string>() : v.dump());
  }
  auto wm = j.find("weight_map");
  KVPACK_CHECK(wm != j.end(), "{}: missing field 'weight_map'", ipath);
  KVPACK_CHECK(wm->is_object(), "{}: field 'weight_map' is {}, expected an object", ipath, type_name(*wm));
  KVPACK_CHECK(!wm->empty(), "{}: field 'weight_map' is empty", ipath);

  std::map<std::string, size_t> shard_index;  // shard file name -> files_ index
  std::map<std::string, std::string> first_tensor;
  for (auto& [name, shard] : wm->items()) {
    KVPACK_CHECK(shard.is_string(), "{}: weight_map['{}'] is {}, expected a shard file name", ipath, name,
                 type_name(shard));
    const auto& s = shard.get_ref<const std::string&>();
    const fs::path sp(s);
    bool escapes = s.empty() || sp.is_absolute() ||
                   std::any_of(sp.begin(), sp.end(), [](const fs::path& c) { return c == ".."; });
    KVPACK_CHECK(!escapes, "{}: weight_map['{}'] = '{}' is not a file name inside the checkpoint directory", ipath,
                 name, s);
    first_tensor.emplace(s, name);
  }
  const fs::path dir = index.parent_path();
  for (const auto& [s, tname] : first_tensor) {
    const fs::path sp = dir / s;
    KVPACK_CHECK(fs::is_regular_file(sp, ec), "{}: shard '{}' (holding tensor '{}' and others) is missing: {}",
                 ipath, s, tname, sp.string());
    shard_index.emplace(s, m.files_.size());
    m.files_.push_back(SafetensorsFile::open(sp.string()));
  }
  for (auto& [name, shard] : wm->items()) {
    const auto& s = shard.get_ref<const std::string&>();
    const size_t fi = shard_index.at(s);
    const SafetensorsFile& f = m.files_[fi];
    const StTensor* t = f.find(name);
    KVPACK_CHECK(t, "{}: tensor '{}' is mapped to shard '{}' but {} has no such tensor", ipath, name, s, f.path());
    m.by_name_.emplace(name, std::pair{fi, static_cast<size_t>(t - f.tensors().data())});
  }
  return m;
}

const StTensor* SafetensorsModel::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &files_[it->second.first].tensors()[it->second.second];
}

const StTensor& SafetensorsModel::tensor(std::string_view name) const {
  const StTensor* t = find(name);
  KVPACK_CHECK(t, "{}: no tensor named '{}' ({} tensors in the checkpoint)", path_, name, by_name_.size());
  return *t;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [k, v] : by_name_) out.push_back(k);
  return out;
}

// ------------------------------------------------------------------------------------------------ conversion

// e4m3 (OCP "fn": no infinities, S.1111.111 is NaN) is the fp8 format's own code: one definition, the block core's.
float f8_e4m3_to_f32(uint8_t v) { return block::e4m3_to_f32(v); }

float f8_e5m2_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int e = (v >> 2) & 0x1f;
  const int m = v & 0x3;
  float x;
  if (e == 0x1f)
    x = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  else if (e == 0)
    x = std::ldexp(static_cast<float>(m), -16);  // subnormal: m/4 * 2^(1-15)
  else
    x = std::ldexp(static_cast<float>(4 + m), e - 17);  // (1 + m/4) * 2^(e-15)
  return neg ? -x : x;
}

void to_float_into(const StTensor& t, float* out) {
  KVPACK_CHECK(st_dtype_is_float(t.dtype), "tensor '{}': dtype {} is not a floating-point type", t.name,
               st_dtype_name(t.dtype));
  const size_t n = t.n_bytes / st_dtype_size(t.dtype);
  const uint8_t* p = t.data;
  // memcpy per element: the format does not align tensor data.
  switch (t.dtype) {
    case StDtype::F64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    case StDtype::F32:
      if (n) std::memcpy(out, p, 4 * n);
      break;
    case StDtype::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    case StDtype::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case StDtype::F8_E4M3:
      for (size_t i = 0; i < n; ++i) out[i] = f8_e4m3_to_f32(p[i]);
      break;
    case StDtype::F8_E5M2:
      for (size_t i = 0; i < n; ++i) out[i] = f8_e5m2_to_f32(p[i]);
      break;
    default:
      break;
  }
}

std::vector<float> to_float(const StTensor& t) {
  KVPACK_CHECK(st_dtype_is_float(t.dtype), "tensor '{}': dtype {} is not a floating-point type", t.name,
               st_dtype_name(t.dtype));
  std::vector<float> out(t.n_bytes / st_dtype_size(t.dtype));
  to_float_into(t, out.data());
  return out;
}

// ---------------------------------------------------------------------------------------------------- writing

StWriteTensor st_f32_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values) {
  size_t n = checked_bytes(shape, 1, "st_f32_tensor '" + name + "'");
  KVPACK_CHECK(n == values.size(), "st_f32_tensor '{}': shape {} has {} elements but {} values were given", name,
               shape_str(shape), n, values.size());
  StWriteTensor t{std::move(name), StDtype::F32, std::move(shape), std::vector<uint8_t>(4 * values.size())};
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

namespace {

void write_all(int fd, const uint8_t* p, size_t n, const std::string& tmp) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    KVPACK_CHECK(w > 0, "{}: write failed: {}", tmp, std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string json_checked(const std::string& s, const std::string& path, std::string_view what) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    fail("{}: {} is not valid UTF-8", path, what);
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Validate everything before touching the disk.
  std::vector<const StWriteTensor*> order;
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    const std::string ctx = fmt::format("{}: tensor '{}'", path, t.name);
    KVPACK_CHECK(!t.name.empty(), "{}: a tensor has an empty name", path);
    KVPACK_CHECK(t.name != "__metadata__", "{}: the name is reserved for the metadata map", ctx);
    KVPACK_CHECK(seen.insert(t.name).second, "{}: duplicate tensor name", ctx);
    json_checked(t.name, path, fmt::format("tensor name '{}'", t.name));
    for (size_t i = 0; i < t.shape.size(); ++i)
      KVPACK_CHECK(t.shape[i] >= 0, "{}: shape[{}] = {} is negative", ctx, i, t.shape[i]);
    const size_t need = checked_bytes(t.shape, st_dtype_size(t.dtype), ctx);
    KVPACK_CHECK(need == t.bytes.size(), "{}: shape {} of dtype {} needs {} bytes but {} were given", ctx,
                 shape_str(t.shape), st_dtype_name(t.dtype), need, t.bytes.size());
    order.push_back(&t);
  }
  for (const auto& [k, v] : metadata) {
    json_checked(k, path, fmt::format("metadata key '{}'", k));
    json_checked(v, path, fmt::format("metadata value for '{}'", k));
  }
  // Larger elements first keeps every tensor naturally aligned (the data section starts 8-aligned); ties by name.
  std::sort(order.begin(), order.end(), [](const StWriteTensor* a, const StWriteTensor* b) {
    size_t sa = st_dtype_size(a->dtype), sb = st_dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  json h = json::object();  // std::map underneath: keys serialize sorted
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const StWriteTensor* t : order) {
    h[t->name] = {{"dtype", st_dtype_name(t->dtype)},
                  {"shape", t->shape},
                  {"data_offsets", {off, off + t->bytes.size()}}};
    off += t->bytes.size();
  }
  std::string hs = h.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');  // 8 + |header| is then a multiple of 8
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(hs.size()) >> (8 * i));

  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  KVPACK_CHECK(fd >= 0, "{}: cannot create temporary file {}: {}", path, tmp, std::strerror(errno));
  try {
    write_all(fd, len, 8, tmp);
    write_all(fd, reinterpret_cast<const uint8_t*>(hs.data()), hs.size(), tmp);
    for (const StWriteTensor* t : order) write_all(fd, t->bytes.data(), t->bytes.size(), tmp);
    KVPACK_CHECK(::fsync(fd) == 0, "{}: fsync failed: {}", tmp, std::strerror(errno));
    int rc = ::close(fd);
    fd = -1;
    KVPACK_CHECK(rc == 0, "{}: close failed: {}", tmp, std::strerror(errno));
    KVPACK_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "{}: cannot rename {} over it: {}", path, tmp,
                 std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable; failure here leaves a complete file either way, so it is not an error.
  std::string dir = fs::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kvpack
