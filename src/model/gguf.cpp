// GGUF reader. Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv x (string key,
// u32 type, value), n_tensors x (string name, u32 n_dims, i64 dims[n_dims], u32 ggml type, u64 offset), padding
// to general.alignment, data section. Strings are u64 length + bytes (no terminator). v2 and v3 share this layout
// (v3 only added big-endian files, which kvpack rejects); v1 used u32 counts and lengths.
#include "kvpack/gguf.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvpack/error.h"
#include "kvpack/parallel.h"

namespace kvpack {
namespace {

constexpr int kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 16;  // nested arrays deeper than this are surely corrupt (and would blow the stack)

bool gguf_type_valid(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

// Smallest number of bytes one value of type t occupies; bounds array counts by what the file can hold.
uint64_t min_value_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::STRING: return 8;   // the length
    case GgufType::ARRAY: return 12;   // element type + count
  }
  return 1;
}

// Cursor over the file with a description of the item being read, so every error names the file and the item.
struct Reader {
  const uint8_t* p;
  uint64_t size;
  const std::string& file;
  uint64_t pos = 0;
  std::string where;  // "metadata key 'llama.block_count'", "tensor 'blk.0.attn_q.weight'", "header"

  uint64_t remaining() const { return size - pos; }

  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> f, Args&&... args) const {
    throw Error(fmt::format("{}: {}: {}", file, where, fmt::format(f, std::forward<Args>(args)...)));
  }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      error("truncated file: {} needs {} bytes at offset {} but the file ends at {}", what, n, pos, size);
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > remaining())
      error("{} has length {} but only {} bytes remain in the file (offset {})", what, n, remaining(), pos);
    std::string s(reinterpret_cast<const char*>(p + pos), static_cast<size_t>(n));
    pos += n;
    return s;
  }
};

GgufValue read_value(Reader& r, GgufType t, int depth) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::U8: v.value = uint64_t{r.read<uint8_t>("u8 value")}; break;
    case GgufType::I8: v.value = int64_t{r.read<int8_t>("i8 value")}; break;
    case GgufType::U16: v.value = uint64_t{r.read<uint16_t>("u16 value")}; break;
    case GgufType::I16: v.value = int64_t{r.read<int16_t>("i16 value")}; break;
    case GgufType::U32: v.value = uint64_t{r.read<uint32_t>("u32 value")}; break;
    case GgufType::I32: v.value = int64_t{r.read<int32_t>("i32 value")}; break;
    case GgufType::U64: v.value = r.read<uint64_t>("u64 value"); break;
    case GgufType::I64: v.value = r.read<int64_t>("i64 value"); break;
    case GgufType::F32: v.value = double{r.read<float>("f32 value")}; break;
    case GgufType::F64: v.value = r.read<double>("f64 value"); break;
    case GgufType::BOOL: {
      const uint8_t b = r.read<uint8_t>("bool value");
      if (b > 1) r.error("bool value is {} (must be 0 or 1) at offset {}", b, r.pos - 1);
      v.value = b == 1;
      break;
    }
    case GgufType::STRING: v.value = r.read_string("string value"); break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth) r.error("arrays nested more than {} deep", kMaxArrayDepth);
      const uint32_t et = r.read<uint32_t>("array element type");
      if (!gguf_type_valid(et)) r.error("array has unknown element type id {} (offset {})", et, r.pos - 4);
      v.elem_type = static_cast<GgufType>(et);
      const uint64_t n = r.read<uint64_t>("array length");
      const uint64_t min_size = min_value_size(v.elem_type);
      if (n > r.remaining() / min_size)
        r.error("array of {} {} elements needs at least {} bytes but only {} remain in the file (offset {})", n,
                gguf_type_name(v.elem_type), n > std::numeric_limits<uint64_t>::max() / min_size ? 0 : n * min_size,
                r.remaining(), r.pos - 8);
      std::vector<GgufValue> items;
      items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) {
        try {
          items.push_back(read_value(r, v.elem_type, depth + 1));
        } catch (const Error& e) {
          throw Error(fmt::format("{} (array element {} of {})", e.what(), i, n));
        }
      }
      v.value = std::move(items);
      break;
    }
    default:
      r.error("unknown value type id {} (offset {})", static_cast<uint32_t>(t), r.pos - 4);
  }
  return v;
}

// a * b for non-negative int64 values, or nullopt on overflow.
std::optional<int64_t> mul_checked(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::string quoted(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ >= max_chars) {
      out += "...";
      break;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "unknown";
}

// ---- GgufValue

bool GgufValue::is_int() const {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16: case GgufType::U32:
    case GgufType::I32: case GgufType::U64: case GgufType::I64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_float() const { return type == GgufType::F32 || type == GgufType::F64; }

std::optional<int64_t> GgufValue::as_int() const {
  if (!is_int()) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::get<int64_t>(value);
}

std::optional<double> GgufValue::as_float() const {
  if (is_float()) return std::get<double>(value);
  if (const auto* u = std::get_if<uint64_t>(&value); u && is_int()) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&value); i && is_int()) return static_cast<double>(*i);
  return std::nullopt;
}

const std::string* GgufValue::as_string() const { return std::get_if<std::string>(&value); }

const std::vector<GgufValue>* GgufValue::as_array() const { return std::get_if<std::vector<GgufValue>>(&value); }

std::string GgufValue::type_string() const {
  if (type != GgufType::ARRAY) return std::string(gguf_type_name(type));
  std::string inner(gguf_type_name(elem_type));
  // Nested arrays: describe the first element's element type (all elements share the outer element type).
  if (elem_type == GgufType::ARRAY) {
    const auto* a = as_array();
    inner = (a && !a->empty()) ? (*a)[0].type_string() : "array";
  }
  return "array[" + inner + "]";
}

std::string GgufValue::summary(size_t max_items, size_t max_chars) const {
  switch (type) {
    case GgufType::STRING: return quoted(*as_string(), max_chars);
    case GgufType::BOOL: return std::get<bool>(value) ? "true" : "false";
    // f32 values print as the shortest float that round-trips ("1e-05", not the widened 9.99999974e-06).
    case GgufType::F32: return fmt::format("{}", static_cast<float>(std::get<double>(value)));
    case GgufType::F64: return fmt::format("{}", std::get<double>(value));
    case GgufType::ARRAY: {
      const auto& a = *as_array();
      std::string out = fmt::format("{} n={} [", type_string(), a.size());
      for (size_t i = 0; i < a.size() && i < max_items; ++i) {
        if (i) out += ", ";
        out += a[i].summary(max_items, 24);
      }
      return out + (a.size() > max_items ? ", ...]" : "]");
    }
    default:
      if (const auto* u = std::get_if<uint64_t>(&value)) return fmt::format("{}", *u);
      return fmt::format("{}", std::get<int64_t>(value));
  }
}

std::string GgufTensorInfo::shape_string() const { return fmt::format("[{}]", fmt::join(dims, ", ")); }

// ---- GgufFile

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.map_ = MappedFile(path);
  f.path_ = path;
  f.base_ = f.map_.data();
  f.size_ = f.map_.size();
  f.parse();
  return f;
}

GgufFile GgufFile::from_memory(const uint8_t* p, size_t n, std::string name) {
  GgufFile f;
  f.path_ = std::move(name);
  f.base_ = p;
  f.size_ = n;
  f.parse();
  return f;
}

void GgufFile::parse() {
  Reader r{base_, size_, path_, 0, "header"};
  r.where = "header";
  if (size_ < 4) r.error("file is {} bytes, too small to be a GGUF file", size_);
  if (std::memcmp(base_, "GGUF", 4) != 0)
    r.error("not a GGUF file: magic is {:02x} {:02x} {:02x} {:02x}, expected 'GGUF'", base_[0], base_[1], base_[2],
            base_[3]);
  r.pos = 4;
  version_ = r.read<uint32_t>("version");
  if (version_ == 1) r.error("GGUF version 1 is not supported (it used 32-bit counts); re-convert the model");
  if ((version_ & 0xffff) == 0 && (version_ >> 24) >= 2 && (version_ >> 24) <= 3)
    r.error("big-endian GGUF (version {} byte-swapped) is not supported", version_ >> 24);
  if (version_ != 2 && version_ != 3) r.error("unsupported GGUF version {} (kvpack reads versions 2 and 3)", version_);
  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  // Each pair takes at least 13 bytes (empty key, type, 1-byte value); each tensor info at least 24.
  if (n_kv > r.remaining() / 13)
    r.error("metadata count {} is impossible: only {} bytes follow the header", n_kv, r.remaining());
  if (n_tensors > r.remaining() / 24)
    r.error("tensor count {} is impossible: only {} bytes follow the header", n_tensors, r.remaining());

  kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    r.where = fmt::format("metadata pair #{}", i);
    std::string key = r.read_string("key");
    r.where = fmt::format("metadata key '{}'", key);
    if (kv_index_.count(key)) r.error("duplicate key");
    const uint32_t t = r.read<uint32_t>("value type");
    if (!gguf_type_valid(t)) r.error("unknown value type id {} (offset {})", t, r.pos - 4);
    GgufValue v = read_value(r, static_cast<GgufType>(t), 0);
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    r.where = "metadata key 'general.alignment'";
    const auto al = a->as_int();
    if (!al) r.error("has type {}, expected an integer", a->type_string());
    if (*al <= 0 || (*al & (*al - 1)) != 0) r.error("alignment {} is not a positive power of two", *al);
    alignment_ = static_cast<uint64_t>(*al);
  }

  if (n_tensors > r.remaining() / 24)
    r.error("tensor count {} is impossible: only {} bytes follow the metadata", n_tensors, r.remaining());
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    r.where = fmt::format("tensor info #{}", i);
    GgufTensorInfo t{};
    t.name = r.read_string("name");
    r.where = fmt::format("tensor '{}'", t.name);
    if (t.name.empty()) r.error("empty tensor name");
    if (tensor_index_.count(t.name)) r.error("duplicate tensor name");
    const uint32_t n_dims = r.read<uint32_t>("n_dims");
    if (n_dims > kMaxDims) r.error("n_dims is {}, at most {} are allowed", n_dims, kMaxDims);
    t.n_elements = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const int64_t ne = r.read<int64_t>("dimension");
      if (ne < 0) r.error("dimension {} is negative ({})", d, ne);
      t.dims.push_back(ne);
      const auto prod = mul_checked(t.n_elements, ne);
      if (!prod) overflow = true;
      else t.n_elements = *prod;
    }
    if (overflow) r.error("element count of shape {} overflows int64", t.shape_string());
    const uint32_t type_id = r.read<uint32_t>("type");
    if (!ggml_type_known(type_id)) r.error("unknown ggml type id {} (offset {})", type_id, r.pos - 4);
    t.type = static_cast<GgmlType>(type_id);
    const int64_t bs = ggml_block_size(t.type);
    if (t.row_length() % bs != 0)
      r.error("type {} needs the first dimension to be a multiple of {}, shape is {}", ggml_type_name(t.type), bs,
              t.shape_string());
    const auto bytes = mul_checked(t.n_elements / bs, ggml_type_size(t.type));
    if (!bytes) r.error("byte size of {} {} elements overflows", t.n_elements, ggml_type_name(t.type));
    t.n_bytes = static_cast<uint64_t>(*bytes);
    t.offset = r.read<uint64_t>("data offset");
    if (t.offset % alignment_ != 0)
      r.error("data offset {} is not a multiple of the alignment {}", t.offset, alignment_);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (it may be absent when there are no tensors).
  const uint64_t pad = (alignment_ - r.pos % alignment_) % alignment_;
  data_offset_ = r.pos + pad;
  const uint64_t avail = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (auto& t : tensors_) {
    r.where = fmt::format("tensor '{}'", t.name);
    if (t.offset > avail || t.n_bytes > avail - t.offset)
      r.error("{} {} data ({} bytes at data offset {}) lies outside the file: the data section at file offset {} "
              "holds {} bytes", ggml_type_name(t.type), t.shape_string(), t.n_bytes, t.offset, data_offset_, avail);
    t.data = base_ + data_offset_ + t.offset;
  }
  // Tensors must not share bytes (ggml lays them out back to back); sort a copy of the indices by offset.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& a = tensors_[order[i - 1]];
    const auto& b = tensors_[order[i]];
    if (a.n_bytes > 0 && b.n_bytes > 0 && a.offset + a.n_bytes > b.offset)
      fail("{}: tensor '{}' data [{}, {}) overlaps tensor '{}' data starting at {}", path_, a.name, a.offset,
           a.offset + a.n_bytes, b.name, b.offset);
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufValue& GgufFile::require(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) fail("{}: metadata key '{}' is missing", path_, key);
  return *v;
}

void GgufFile::type_error(std::string_view key, const GgufValue& v, std::string_view expected) const {
  fail("{}: metadata key '{}' has type {}, expected {}", path_, key, v.type_string(), expected);
}

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = require(key);
  if (auto i = v.as_int()) return *i;
  if (v.is_int()) fail("{}: metadata key '{}' value {} does not fit int64", path_, key, v.summary());
  type_error(key, v, "an integer");
}

std::optional<int64_t> GgufFile::get_int_opt(std::string_view key) const {
  return find(key) ? std::optional<int64_t>(get_int(key)) : std::nullopt;
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = require(key);
  if (auto f = v.as_float()) return *f;
  type_error(key, v, "a number");
}

std::optional<double> GgufFile::get_float_opt(std::string_view key) const {
  return find(key) ? std::optional<double>(get_float(key)) : std::nullopt;
}

bool GgufFile::get_bool(std::string_view key, bool dflt) const {
  const GgufValue* v = find(key);
  if (!v) return dflt;
  if (v->type != GgufType::BOOL) type_error(key, *v, "bool");
  return std::get<bool>(v->value);
}

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = require(key);
  if (const auto* s = v.as_string()) return *s;
  type_error(key, v, "string");
}

std::optional<std::string> GgufFile::get_string_opt(std::string_view key) const {
  return find(key) ? std::optional<std::string>(get_string(key)) : std::nullopt;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = require(key);
  if (!v.is_array() || v.elem_type != GgufType::STRING) type_error(key, v, "array[string]");
  std::vector<std::string> out;
  out.reserve(v.as_array()->size());
  for (const auto& e : *v.as_array()) out.push_back(*e.as_string());
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = require(key);
  if (!v.is_array()) type_error(key, v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(v.as_array()->size());
  for (size_t i = 0; i < v.as_array()->size(); ++i) {
    const GgufValue& e = (*v.as_array())[i];
    auto x = e.as_int();
    if (!x) {
      if (!e.is_int()) type_error(key, v, "array of integers");
      fail("{}: metadata key '{}' element {} value {} does not fit int64", path_, key, i, e.summary());
    }
    out.push_back(*x);
  }
  return out;
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = require(key);
  if (!v.is_array()) type_error(key, v, "array of numbers");
  std::vector<double> out;
  out.reserve(v.as_array()->size());
  for (const auto& e : *v.as_array()) {
    auto x = e.as_float();
    if (!x) type_error(key, v, "array of numbers");
    out.push_back(*x);
  }
  return out;
}

std::vector<std::string> GgufFile::keys() const {
  std::vector<std::string> out;
  out.reserve(kv_.size());
  for (const auto& [k, v] : kv_) out.push_back(k);
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) fail("{}: tensor '{}' not found ({} tensors in the file)", path_, name, tensors_.size());
  return *t;
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& t) const {
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  dequantize_into(t, out.data());
  return out;
}

void GgufFile::dequantize_into(const GgufTensorInfo& t, float* out) const {
  dequantize_rows(t, 0, t.n_rows(), out);
}

void GgufFile::dequantize_rows(const GgufTensorInfo& t, int64_t row0, int64_t n_rows, float* out) const {
  if (!ggml_type_supported(t.type))
    fail("{}: tensor '{}' has type {}, which kvpack cannot dequantize", path_, t.name, ggml_type_name(t.type));
  const int64_t total = t.n_rows();
  if (row0 < 0 || n_rows < 0 || row0 > total || n_rows > total - row0)
    fail("{}: tensor '{}' {}: rows [{}, {}+{}) are out of range ({} rows)", path_, t.name, t.shape_string(), row0,
         row0, n_rows, total);
  const int64_t len = t.row_length();
  if (n_rows == 0 || len == 0) return;
  const uint64_t row_bytes = ggml_row_size(t.type, len);
  const uint8_t* src = t.data + static_cast<uint64_t>(row0) * row_bytes;
  // Split rows over threads only when there is enough work to pay for starting them.
  const int64_t work = n_rows * len;
  const int64_t n_threads =
      std::min<int64_t>({hardware_threads(), 16, std::max<int64_t>(1, work / (1 << 20)), n_rows});
  auto run = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      dequantize_row(t.type, src + static_cast<uint64_t>(r) * row_bytes, out + r * len, len);
  };
  if (n_threads <= 1) return run(0, n_rows);
  const int64_t per = (n_rows + n_threads - 1) / n_threads;
  parallel_items(n_threads, static_cast<int>(n_threads),
                 [&](int64_t i) { run(std::min(n_rows, i * per), std::min(n_rows, (i + 1) * per)); });
}

// ---- model config

namespace {

int to_int(const GgufFile& f, std::string_view key, int64_t v) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    fail("{}: metadata key '{}' value {} is out of range", f.path(), key, v);
  return static_cast<int>(v);
}

// Llama-3.1-style RoPE: llama.cpp's converter stores the per-frequency factors as tensor `rope_freqs.weight`
// instead of metadata. Recover (factor, low, high, original context) by assuming the values every Llama-3.x
// release uses for the latter three and checking that they reproduce the stored factors.
RopeScaling llama3_scaling_from_freqs(const GgufFile& f, const GgufTensorInfo& t, int head_dim, double theta) {
  KVPACK_CHECK(t.n_elements == head_dim / 2, "{}: tensor 'rope_freqs.weight' has {} elements, expected head_dim/2 = {}",
               f.path(), t.n_elements, head_dim / 2);
  const std::vector<float> stored = f.dequantize(t);
  RopeScaling s;
  s.type = "llama3";
  s.factor = *std::max_element(stored.begin(), stored.end());
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(theta, 2.0 * i / head_dim);
    const double wavelen = 2 * M_PI / freq;
    double expect;
    if (wavelen < high_wavelen) expect = 1.0;
    else if (wavelen > low_wavelen) expect = s.factor;
    else {
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      expect = 1.0 / ((1 - smooth) / s.factor + smooth);
    }
    KVPACK_CHECK(std::abs(expect - stored[i]) <= 1e-4 * std::abs(expect),
                 "{}: tensor 'rope_freqs.weight' element {} is {}, but Llama-3 RoPE scaling (factor {}, low 1, high 4, "
                 "original context 8192) gives {}; this RoPE scaling is not supported",
                 f.path(), i, stored[i], s.factor, expect);
  }
  return s;
}

}  // namespace

ModelConfig model_config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  const std::string arch = f.get_string("general.architecture");
  KVPACK_CHECK(arch == "llama" || arch == "qwen2",
               "{}: architecture '{}' is not supported (kvpack runs llama and qwen2)", f.path(), arch);
  c.arch = arch;
  const std::string p = arch + ".";
  auto key = [&](std::string_view k) { return p + std::string(k); };
  auto get = [&](std::string_view k) { return to_int(f, key(k), f.get_int(key(k))); };

  c.name = f.get_string_opt("general.name").value_or("");
  c.n_layers = get("block_count");
  c.d_model = get("embedding_length");
  c.n_heads = get("attention.head_count");
  c.n_kv_heads = f.find(key("attention.head_count_kv")) ? get("attention.head_count_kv") : c.n_heads;
  c.d_ff = get("feed_forward_length");
  c.max_context = f.get_int(key("context_length"));
  if (f.find(key("attention.key_length"))) {
    c.head_dim = get("attention.key_length");
  } else {
    KVPACK_CHECK(c.n_heads > 0 && c.d_model % c.n_heads == 0,
                 "{}: embedding_length {} is not a multiple of head_count {}", f.path(), c.d_model, c.n_heads);
    c.head_dim = c.d_model / c.n_heads;
  }
  if (f.find(key("attention.value_length")))
    KVPACK_CHECK(get("attention.value_length") == c.head_dim,
                 "{}: '{}' ({}) differs from the key length {}; kvpack needs equal K and V head sizes", f.path(),
                 key("attention.value_length"), get("attention.value_length"), c.head_dim);
  if (f.find(key("rope.dimension_count")))
    KVPACK_CHECK(get("rope.dimension_count") == c.head_dim,
                 "{}: '{}' is {} but head_dim is {}; partial rotary embeddings are not supported", f.path(),
                 key("rope.dimension_count"), get("rope.dimension_count"), c.head_dim);

  if (f.find(key("vocab_size"))) {
    c.vocab_size = get("vocab_size");
  } else if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->is_array()) {
    c.vocab_size = to_int(f, "tokenizer.ggml.tokens", static_cast<int64_t>(toks->as_array()->size()));
  } else if (const GgufTensorInfo* emb = f.find_tensor("token_embd.weight"); emb && emb->dims.size() == 2) {
    c.vocab_size = to_int(f, "token_embd.weight", emb->dims[1]);
  }
  c.rope_theta = f.get_float_opt(key("rope.freq_base")).value_or(10000.0);
  c.rms_eps = f.get_float_opt(key("attention.layer_norm_rms_epsilon")).value_or(1e-5);

  // RoPE scaling: explicit metadata first, then the older `rope.scale_linear`, then Llama-3 factors as a tensor.
  if (auto type = f.get_string_opt(key("rope.scaling.type"))) {
    if (*type == "linear") {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = f.get_float(key("rope.scaling.factor"));
    } else if (*type != "none") {
      fail("{}: RoPE scaling type '{}' ('{}') is not supported (none, linear, llama3)", f.path(), *type,
           key("rope.scaling.type"));
    }
    if (auto orig = f.get_int_opt(key("rope.scaling.original_context_length")))
      c.rope_scaling.original_max_position_embeddings = *orig;
  } else if (auto lin = f.get_float_opt(key("rope.scale_linear")); lin && *lin != 1.0) {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = *lin;
  }
  if (const GgufTensorInfo* freqs = f.find_tensor("rope_freqs.weight")) {
    KVPACK_CHECK(c.rope_scaling.type == "none",
                 "{}: both '{}' metadata and a rope_freqs.weight tensor are present", f.path(),
                 key("rope.scaling.type"));
    KVPACK_CHECK(c.head_dim > 0 && c.rope_theta > 0, "{}: bad head_dim/rope_theta for rope_freqs.weight", f.path());
    c.rope_scaling = llama3_scaling_from_freqs(f, *freqs, c.head_dim, c.rope_theta);
  }

  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.attn_bias = arch == "qwen2" || f.find_tensor("blk.0.attn_q.bias") != nullptr;
  int64_t n_params = 0;
  for (const auto& t : f.tensors()) {
    if (__builtin_add_overflow(n_params, t.n_elements, &n_params))
      fail("{}: total parameter count overflows", f.path());
  }
  c.n_params = n_params;
  if (auto bos = f.get_int_opt("tokenizer.ggml.bos_token_id")) c.bos_token_id = to_int(f, "tokenizer.ggml.bos_token_id", *bos);
  if (auto eos = f.get_int_opt("tokenizer.ggml.eos_token_id")) c.eos_token_id = to_int(f, "tokenizer.ggml.eos_token_id", *eos);
  validate(c, f.path());
  return c;
}

}  // namespace kvpack
