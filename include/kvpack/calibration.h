// The calibration file FILE.kvcal: per-(layer, kv head, K|V) parameters of every calibrated format (fp8 scales;
// the q4/q3.5/q3 transforms, steps and bit allocations), fitted on model activations over calibration text.
// Container: safetensors (named tensors + __metadata__); every tensor and metadata key is listed in docs/FORMATS.md.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvpack/block/qx.h"
#include "kvpack/formats.h"
#include "kvpack/kv_codec.h"
#include "kvpack/model_config.h"

namespace kvpack {

class LlamaModel;

// Version of the calibration file layout; load() refuses any other.
constexpr int kCalibrationVersion = 1;

// One q-format's parameters for all (layer, kv head, K|V), flat. Slot index s = (layer * n_kv_heads + head) * 2 + kind.
struct QFormatTables {
  int bits_x2 = 0;  // 8 (q4), 7 (q3.5), 6 (q3)
  int n_slots = 0, head_dim = 0;
  std::vector<float> mean;          // [slots, D]
  std::vector<float> fwd;           // [slots, D, D]
  std::vector<float> inv;           // [slots, D, D]
  std::vector<float> step;          // [slots, D]
  std::vector<float> inv_step;      // [slots, D] derived on load: 1/step (0 for 0-bit channels)
  std::vector<float> rms_weight;    // [slots, D]
  std::vector<uint8_t> group_bits;  // [slots, D/8]

  void resize(int slots, int d);
  // Pointers into this table's host arrays for one slot.
  block::QParams params(int slot) const;
  // One layer's K or V parameters for all kv heads, as the paged cache's FormatParams::qk / qv take them (host
  // pointers into this table; slots interleave K and V, so head_stride 2). Copy the arrays to the device for the
  // CUDA kernels and offset the pointers alike.
  block::QHeadTable layer_table(int layer, int n_kv_heads, KvKind kind) const;
  // Recomputes inv_step from step and group_bits.
  void derive();
};

class Calibration {
 public:
  Calibration() = default;
  Calibration(const ModelConfig& model, std::string model_id);

  // Loads and validates FILE.kvcal against the model the caller runs: throws kvpack::Error naming the file and what
  // is wrong (not a safetensors file, truncated, checksum mismatch, other format version, other model, missing or
  // ill-shaped tensor, non-finite or inconsistent parameters).
  static Calibration load(const std::string& path, const ModelConfig& expect);
  // The same checks without a model (kvpack inspect): the shape comes from the file's tensors, the model is whatever
  // it names; model_config() then holds only the name, layers, kv heads and head_dim.
  static Calibration load(const std::string& path);
  // Writes atomically (safetensors writer); deterministic bytes for identical contents.
  void save(const std::string& path) const;

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  const std::string& model_id() const { return model_id_; }
  const ModelConfig& model_config() const { return model_; }
  int slot(int layer, int head, KvKind kind) const { return (layer * n_kv_heads_ + head) * 2 + static_cast<int>(kind); }

  // fp8 e4m3 static scales [layers, kv heads, 2]: x ~ e4m3 * scale.
  float fp8_scale(int layer, int head, KvKind kind) const { return fp8_scales_.at(slot(layer, head, kind)); }
  std::vector<float>& fp8_scales() { return fp8_scales_; }
  const std::vector<float>& fp8_scales() const { return fp8_scales_; }

  bool has(Format f) const;
  // Throws naming the format when the file has no parameters for it.
  const QFormatTables& q(Format f) const;
  QFormatTables& q_mut(Format f);

  // Free-form provenance written into __metadata__ (texts, tokens, windows, seconds); informational only.
  std::map<std::string, std::string>& info() { return info_; }
  const std::map<std::string, std::string>& info() const { return info_; }

 private:
  static Calibration load_impl(const std::string& path, const ModelConfig* expect_or_null);
  int n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  std::string model_id_;
  ModelConfig model_;
  std::vector<float> fp8_scales_;
  std::map<Format, QFormatTables> q_;
  std::map<std::string, std::string> info_;
};

// Identity of a model for calibration files: arch, shape and RoPE fields (a calibration file applies to any copy of
// the same model, GGUF or HF, but not to a model of another shape).
std::string calibration_model_id(const ModelConfig& c);

// One bit-allocation pattern of a q format (the widths of groups 0..D/8-1) and how many K or V slots use it.
struct WidthPattern {
  std::vector<int> bits;
  int slots = 0;
};
// The distinct K (or V) width patterns of a q format over all (layer, kv head) slots, most common first.
std::vector<WidthPattern> width_patterns(const QFormatTables& t, KvKind kind);

struct CalibrateOptions {
  bool progress = true;
  int threads = 0;  // 0 = hardware concurrency
};

// Runs the model in bf16 over the token windows (each starts a fresh sequence), collects per-layer Q/K/V statistics
// (sink tokens, position < format_info(q4).sink_tokens, are left out of the q-format statistics) and fits every
// calibrated format: fp8 scales, q4, q3.5, q3. Deterministic.
Calibration calibrate(const LlamaModel& model, const std::vector<std::vector<int32_t>>& windows, bool progress);

}  // namespace kvpack
