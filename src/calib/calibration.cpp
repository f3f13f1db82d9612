// The calibration file: in-memory tables, safetensors save/load and validation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "kvpack/block/q_lanes.h"
#include "kvpack/calibration.h"
#include "kvpack/error.h"
#include "kvpack/safetensors.h"

namespace kvpack {

void QFormatTables::resize(int slots, int d) {
  n_slots = slots;
  head_dim = d;
  const size_t s = static_cast<size_t>(slots);
  mean.assign(s * d, 0.0f);
  fwd.assign(s * d * d, 0.0f);
  inv.assign(s * d * d, 0.0f);
  step.assign(s * d, 0.0f);
  inv_step.assign(s * d, 0.0f);
  rms_weight.assign(s * d, 0.0f);
  group_bits.assign(s * (d / 8), 0);
}

void QFormatTables::derive() {
  const int d = head_dim;
  inv_step.assign(step.size(), 0.0f);
  for (int s = 0; s < n_slots; ++s)
    for (int c = 0; c < d; ++c) {
      const size_t i = static_cast<size_t>(s) * d + c;
      if (group_bits[static_cast<size_t>(s) * (d / 8) + c / 8] > 0) inv_step[i] = 1.0f / step[i];
    }
}

block::QParams QFormatTables::params(int slot) const {
  const size_t d = static_cast<size_t>(head_dim), s = static_cast<size_t>(slot);
  return {mean.data() + s * d, fwd.data() + s * d * d, inv.data() + s * d * d,           step.data() + s * d,
          inv_step.data() + s * d, rms_weight.data() + s * d, group_bits.data() + s * (d / 8)};
}

block::QHeadTable QFormatTables::layer_table(int layer, int n_kv_heads, KvKind kind) const {
  const int slot = (layer * n_kv_heads) * 2 + static_cast<int>(kind);
  KVPACK_CHECK(slot >= 0 && slot + 2 * (n_kv_heads - 1) < n_slots, "calibration: layer {} is outside the file's {} slots",
               layer, n_slots);
  return block::QHeadTable::from(params(slot), 2);  // slots interleave (head, K|V)
}

std::string calibration_model_id(const ModelConfig& c) {
  return fmt::format("{}:layers={}:d_model={}:heads={}:kv_heads={}:head_dim={}:d_ff={}:vocab={}:rope_theta={}",
                     c.arch, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size,
                     c.rope_theta);
}

Calibration::Calibration(const ModelConfig& model, std::string model_id)
    : n_layers_(model.n_layers), n_kv_heads_(model.n_kv_heads), head_dim_(model.head_dim),
      model_id_(std::move(model_id)), model_(model) {
  fp8_scales_.assign(static_cast<size_t>(n_layers_) * n_kv_heads_ * 2, 1.0f);
}

bool Calibration::has(Format f) const {
  if (f == Format::fp8) return !fp8_scales_.empty();
  return q_.count(f) != 0;
}

const QFormatTables& Calibration::q(Format f) const {
  auto it = q_.find(f);
  KVPACK_CHECK(it != q_.end(), "the calibration has no parameters for format {} (re-run kvpack calibrate)",
               format_name(f));
  return it->second;
}

QFormatTables& Calibration::q_mut(Format f) {
  auto& t = q_[f];
  if (t.n_slots == 0) {
    t.bits_x2 = static_cast<int>(std::lround(2 * format_info(f).bits_per_element));
    t.resize(n_layers_ * n_kv_heads_ * 2, head_dim_);
  }
  return t;
}

namespace {

constexpr const char* kMagic = "kvpack-calibration";
constexpr Format kQFormats[] = {Format::q4, Format::q3_5, Format::q3};

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// FNV-1a 64 over every tensor (sorted by name: name, dtype, shape, bytes): detects corruption, not tampering.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  void add_str(std::string_view s) {
    add(s.data(), s.size());
    add("\0", 1);
  }
};

std::string checksum_of(const std::vector<const StTensor*>& sorted) {
  Fnv f;
  for (const StTensor* t : sorted) {
    f.add_str(t->name);
    f.add_str(st_dtype_name(t->dtype));
    for (int64_t e : t->shape) f.add(&e, sizeof e);
    f.add(t->data, t->n_bytes);
  }
  return fmt::format("fnv1a64:{:016x}", f.h);
}

std::string checksum_of(const std::vector<StWriteTensor>& ts) {
  std::vector<StTensor> views;
  for (const auto& t : ts) views.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  std::vector<const StTensor*> sorted;
  for (const auto& v : views) sorted.push_back(&v);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  return checksum_of(sorted);
}

}  // namespace

void Calibration::save(const std::string& path) const {
  const int64_t L = n_layers_, H = n_kv_heads_, D = head_dim_;
  std::vector<StWriteTensor> ts;
  ts.push_back({"fp8.scale", StDtype::F32, {L, H, 2}, as_bytes(fp8_scales_)});
  std::string formats = "fp8";
  for (Format f : kQFormats) {
    auto it = q_.find(f);
    if (it == q_.end()) continue;
    const QFormatTables& t = it->second;
    const std::string n(format_name(f));
    formats += "," + n;
    ts.push_back({n + ".mean", StDtype::F32, {L, H, 2, D}, as_bytes(t.mean)});
    ts.push_back({n + ".fwd", StDtype::F32, {L, H, 2, D, D}, as_bytes(t.fwd)});
    ts.push_back({n + ".inv", StDtype::F32, {L, H, 2, D, D}, as_bytes(t.inv)});
    ts.push_back({n + ".step", StDtype::F32, {L, H, 2, D}, as_bytes(t.step)});
    ts.push_back({n + ".rms_weight", StDtype::F32, {L, H, 2, D}, as_bytes(t.rms_weight)});
    ts.push_back({n + ".group_bits", StDtype::U8, {L, H, 2, D / 8}, as_bytes(t.group_bits)});
  }
  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : info_) meta["info." + k] = v;
  meta["format"] = kMagic;
  meta["version"] = std::to_string(kCalibrationVersion);
  meta["model_id"] = model_id_;
  meta["model_name"] = model_.name;
  meta["n_layers"] = std::to_string(n_layers_);
  meta["n_kv_heads"] = std::to_string(n_kv_heads_);
  meta["head_dim"] = std::to_string(head_dim_);
  meta["formats"] = formats;
  meta["checksum"] = checksum_of(ts);
  write_safetensors(path, ts, meta);
}

Calibration Calibration::load(const std::string& path, const ModelConfig& expect) { return load_impl(path, &expect); }
Calibration Calibration::load(const std::string& path) { return load_impl(path, nullptr); }

Calibration Calibration::load_impl(const std::string& path, const ModelConfig* expect_or_null) {
  SafetensorsFile file;
  try {
    file = SafetensorsFile::open(path);
  } catch (const Error& e) {
    fail("calibration file {}: not a readable safetensors container ({})", path, e.what());
  }
  const auto& meta = file.metadata();
  auto get = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    KVPACK_CHECK(it != meta.end(), "calibration file {}: __metadata__ has no '{}' (not a kvpack calibration file?)",
                 path, key);
    return it->second;
  };
  KVPACK_CHECK(get("format") == kMagic, "calibration file {}: __metadata__ format is '{}', expected '{}'", path,
               get("format"), kMagic);
  KVPACK_CHECK(get("version") == std::to_string(kCalibrationVersion),
               "calibration file {}: format version {} is not supported (this kvpack reads version {}); re-run "
               "kvpack calibrate",
               path, get("version"), kCalibrationVersion);
  // Checksum before anything else reads tensor data, so corruption is reported as such.
  {
    std::vector<const StTensor*> sorted;
    for (const auto& t : file.tensors()) sorted.push_back(&t);
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
    const std::string sum = checksum_of(sorted);
    KVPACK_CHECK(sum == get("checksum"), "calibration file {}: checksum mismatch (stored {}, computed {}): the file is corrupt",
                 path, get("checksum"), sum);
  }
  // Without a model to check against (inspection), the shape comes from the tensors: fp8.scale [layers, kv heads, 2]
  // and any q format's mean [layers, kv heads, 2, head_dim]; the other fields of the config stay unset.
  ModelConfig shape;
  if (!expect_or_null) {
    const StTensor* fs = file.find("fp8.scale");
    KVPACK_CHECK(fs != nullptr && fs->shape.size() == 3 && fs->shape[2] == 2 && fs->shape[0] > 0 && fs->shape[1] > 0,
                 "calibration file {}: tensor 'fp8.scale' missing or not [layers, kv_heads, 2]", path);
    shape.n_layers = static_cast<int>(fs->shape[0]);
    shape.n_kv_heads = static_cast<int>(fs->shape[1]);
    for (Format f : kQFormats)
      if (const StTensor* m = file.find(std::string(format_name(f)) + ".mean"); m && m->shape.size() == 4)
        shape.head_dim = static_cast<int>(m->shape[3]);
    shape.name = get("model_name");
  }
  const ModelConfig& expect = expect_or_null ? *expect_or_null : shape;
  const std::string want = expect_or_null ? calibration_model_id(expect) : get("model_id");
  if (expect_or_null)
    KVPACK_CHECK(get("model_id") == want,
                 "calibration file {}: made for model '{}' ({}), but the model is '{}' ({}); calibrate this model",
                 path, get("model_name"), get("model_id"), expect.name, want);

  Calibration c(expect, want);
  c.model_.name = get("model_name");
  for (const auto& [k, v] : meta)
    if (k.rfind("info.", 0) == 0) c.info_[k.substr(5)] = v;
  const int64_t L = expect.n_layers, H = expect.n_kv_heads, D = expect.head_dim;
  auto read = [&](const std::string& name, StDtype dt, std::vector<int64_t> shape, auto& out) {
    const StTensor* t = file.find(name);
    KVPACK_CHECK(t != nullptr, "calibration file {}: missing tensor '{}'", path, name);
    KVPACK_CHECK(t->dtype == dt && t->shape == shape, "calibration file {}: tensor '{}' is {} {}, expected {} {}", path,
                 name, st_dtype_name(t->dtype), fmt::join(t->shape, "x"), st_dtype_name(dt), fmt::join(shape, "x"));
    using T = typename std::decay_t<decltype(out)>::value_type;
    out.resize(t->n_bytes / sizeof(T));
    if (t->n_bytes) std::memcpy(out.data(), t->data, t->n_bytes);
    if constexpr (std::is_same_v<T, float>)
      for (size_t i = 0; i < out.size(); ++i)
        KVPACK_CHECK(std::isfinite(out[i]), "calibration file {}: tensor '{}' element {} is not finite", path, name, i);
  };
  read("fp8.scale", StDtype::F32, {L, H, 2}, c.fp8_scales_);
  for (size_t i = 0; i < c.fp8_scales_.size(); ++i)
    KVPACK_CHECK(c.fp8_scales_[i] > 0, "calibration file {}: fp8.scale element {} is {} (must be > 0)", path, i,
                 c.fp8_scales_[i]);
  for (Format f : kQFormats) {
    const std::string n(format_name(f));
    if (!file.find(n + ".fwd")) continue;
    KVPACK_CHECK(D == 64 || D == 128, "calibration file {}: head_dim {} not supported by {}", path, D, n);
    QFormatTables& t = c.q_mut(f);
    read(n + ".mean", StDtype::F32, {L, H, 2, D}, t.mean);
    read(n + ".fwd", StDtype::F32, {L, H, 2, D, D}, t.fwd);
    read(n + ".inv", StDtype::F32, {L, H, 2, D, D}, t.inv);
    read(n + ".step", StDtype::F32, {L, H, 2, D}, t.step);
    read(n + ".rms_weight", StDtype::F32, {L, H, 2, D}, t.rms_weight);
    read(n + ".group_bits", StDtype::U8, {L, H, 2, D / 8}, t.group_bits);
    const int want_bytes = block::q_code_bytes(t.bits_x2, static_cast<int>(D));
    for (int s = 0; s < t.n_slots; ++s) {
      int sum = 0;
      for (int g = 0; g < D / 8; ++g) {
        const int b = t.group_bits[static_cast<size_t>(s) * (D / 8) + g];
        KVPACK_CHECK(b <= 8, "calibration file {}: {}.group_bits[slot {}][{}] = {} (max 8)", path, n, s, g, b);
        sum += b;
        for (int i = 0; i < 8 && b > 0; ++i) {
          const float st = t.step[static_cast<size_t>(s) * D + 8 * g + i];
          KVPACK_CHECK(st > 0, "calibration file {}: {}.step[slot {}][{}] = {} (must be > 0)", path, n, s, 8 * g + i, st);
        }
      }
      KVPACK_CHECK(sum == want_bytes, "calibration file {}: {}.group_bits of slot {} sum to {} bytes, the block needs {}",
                   path, n, s, sum, want_bytes);
      if (const int lb = lane_bits_x2(f))
        for (int g = 0; g < D / 8; ++g)
          KVPACK_CHECK(t.group_bits[static_cast<size_t>(s) * (D / 8) + g] ==
                           block::lane_group_bits(lb, static_cast<int>(D), s % 2 == 1, g),
                       "calibration file {}: {}.group_bits of slot {} ({}) are not {}'s fixed {} pattern (a file made "
                       "before {}'s lane layout): recalibrate with `kvpack calibrate`",
                       path, n, s, s % 2 == 1 ? "V" : "K", n, s % 2 == 1 ? "V" : "K", n);
    }
    t.derive();
  }
  return c;
}

std::vector<WidthPattern> width_patterns(const QFormatTables& t, KvKind kind) {
  const int G = t.head_dim / 8;
  std::map<std::vector<int>, int> count;
  for (int s = static_cast<int>(kind); s < t.n_slots; s += 2) {
    std::vector<int> b(G);
    for (int g = 0; g < G; ++g) b[g] = t.group_bits[static_cast<size_t>(s) * G + g];
    ++count[b];
  }
  std::vector<WidthPattern> out;
  for (auto& [b, n] : count) out.push_back({b, n});
  // Most common first; ties in the map's (lexicographic) order, so the list is deterministic.
  std::stable_sort(out.begin(), out.end(), [](const WidthPattern& a, const WidthPattern& b) { return a.slots > b.slots; });
  return out;
}

}  // namespace kvpack
