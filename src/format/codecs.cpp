// CPU reference codecs: every format's KvCodec and the byte-level BlockCodec, both thin over the block cores.
#include <cstring>

#include "kvpack/bf16.h"
#include "kvpack/block/layout.h"
#include "kvpack/codec.h"
#include "kvpack/error.h"

namespace kvpack {
namespace {

using namespace kvpack::block;

void check_head_dim(Format f, int d) {
  KVPACK_CHECK(d == 64 || d == 128, "format {}: head_dim {} is not supported (64 or 128)", format_name(f), d);
}

const Calibration* need_calib(Format f, const ModelConfig& cfg, const Calibration* calib) {
  if (!format_info(f).calibrated) return calib;
  KVPACK_CHECK(calib != nullptr, "format {} needs a calibration file (kvpack calibrate ... -o FILE.kvcal)",
               format_name(f));
  KVPACK_CHECK(calib->n_layers() == cfg.n_layers && calib->n_kv_heads() == cfg.n_kv_heads &&
                   calib->head_dim() == cfg.head_dim,
               "format {}: calibration is for {} layers x {} kv heads x head_dim {}, the model has {} x {} x {}",
               format_name(f), calib->n_layers(), calib->n_kv_heads(), calib->head_dim(), cfg.n_layers,
               cfg.n_kv_heads, cfg.head_dim);
  if (f != Format::fp8) (void)calib->q(f);  // throws naming the format when absent
  return calib;
}

// Encodes then decodes one head vector (already bf16-rounded) with format F and head_dim D.
template <int D>
void roundtrip(Format f, const Calibration* calib, int layer, int head, KvKind kind, float* x) {
  uint8_t buf[2 * D];
  switch (f) {
    case Format::bf16:
      return;
    case Format::fp8: {
      const float s = calib->fp8_scale(layer, head, kind);
      Fp8Block<D>::encode(x, s, buf);
      Fp8Block<D>::decode(buf, s, x);
      return;
    }
    case Format::int4:
      Int4Block<D, false>::encode(x, buf, buf + D / 2);
      Int4Block<D, false>::decode(buf, buf + D / 2, x);
      return;
    case Format::int4h:
      Int4Block<D, true>::encode(x, buf, buf + D / 2);
      Int4Block<D, true>::decode(buf, buf + D / 2, x);
      return;
    case Format::q4:
    case Format::q3_5:
    case Format::q3: {
      const QParams p = calib->q(f).params(calib->slot(layer, head, kind));
      auto run = [&]<int B>() {
        QBlock<D, B>::encode(p, x, buf, buf + QBlock<D, B>::kCodeBytes);
        QBlock<D, B>::decode(p, buf, buf + QBlock<D, B>::kCodeBytes, x);
      };
      if (f == Format::q4) run.template operator()<8>();
      else if (f == Format::q3_5) run.template operator()<7>();
      else run.template operator()<6>();
      return;
    }
  }
}

class FormatCodec final : public KvCodec {
 public:
  FormatCodec(Format f, const ModelConfig& cfg, const Calibration* calib)
      : f_(f), d_(cfg.head_dim), layers_(cfg.n_layers), heads_(cfg.n_kv_heads), calib_(calib),
        sinks_(format_info(f).sink_tokens) {}
  std::string name() const override { return std::string(format_name(f_)); }
  void store(int layer, KvKind kind, int n_tokens, const int* positions, int n_kv_heads, int head_dim,
             float* x) const override {
    KVPACK_CHECK(head_dim == d_ && n_kv_heads == heads_ && layer >= 0 && layer < layers_,
                 "codec {}: store() got layer {} / {} kv heads / head_dim {}, configured for {} layers / {} / {}",
                 name(), layer, n_kv_heads, head_dim, layers_, heads_, d_);
    for (int t = 0; t < n_tokens; ++t) {
      const bool sink = positions != nullptr && positions[t] < sinks_;
      for (int h = 0; h < n_kv_heads; ++h) {
        float* v = x + (static_cast<long>(t) * n_kv_heads + h) * head_dim;
        for (int i = 0; i < head_dim; ++i) v[i] = round_bf16(v[i]);
        if (sink) continue;
        if (d_ == 64) roundtrip<64>(f_, calib_, layer, h, kind, v);
        else roundtrip<128>(f_, calib_, layer, h, kind, v);
      }
    }
  }

 private:
  Format f_;
  int d_, layers_, heads_;
  const Calibration* calib_;
  int sinks_;
};

}  // namespace

std::unique_ptr<KvCodec> make_codec(Format f, const ModelConfig& cfg, const Calibration* calib) {
  if (f == Format::bf16) return make_bf16_codec();
  check_head_dim(f, cfg.head_dim);
  return std::make_unique<FormatCodec>(f, cfg, need_calib(f, cfg, calib));
}

BlockCodec::BlockCodec(Format f, int head_dim, const Calibration* calib)
    : f_(f), d_(head_dim), bytes_(block_layout(f, head_dim).bytes()), calib_(calib) {
  check_head_dim(f, head_dim);
  if (format_info(f).calibrated) {
    KVPACK_CHECK(calib != nullptr, "format {} needs a calibration file", format_name(f));
    KVPACK_CHECK(calib->head_dim() == head_dim, "format {}: calibration head_dim {} != {}", format_name(f),
                 calib->head_dim(), head_dim);
    if (f != Format::fp8) (void)calib->q(f);
  }
}

namespace {
template <int D>
void block_encode(Format f, const Calibration* c, int layer, int head, KvKind kind, const float* x, uint8_t* b) {
  switch (f) {
    case Format::bf16:
      for (int i = 0; i < D; ++i) {
        uint16_t h = f32_to_bf16(x[i]);
        b[2 * i] = static_cast<uint8_t>(h & 0xff);
        b[2 * i + 1] = static_cast<uint8_t>(h >> 8);
      }
      return;
    case Format::fp8: return Fp8Block<D>::encode(x, c->fp8_scale(layer, head, kind), b);
    case Format::int4: return Int4Block<D, false>::encode(x, b, b + D / 2);
    case Format::int4h: return Int4Block<D, true>::encode(x, b, b + D / 2);
    case Format::q4: return Q4Block<D>::encode(c->q(f).params(c->slot(layer, head, kind)), x, b, b + Q4Block<D>::kCodeBytes);
    case Format::q3_5: return Q35Block<D>::encode(c->q(f).params(c->slot(layer, head, kind)), x, b, b + Q35Block<D>::kCodeBytes);
    case Format::q3: return Q3Block<D>::encode(c->q(f).params(c->slot(layer, head, kind)), x, b, b + Q3Block<D>::kCodeBytes);
  }
}
template <int D>
void block_decode(Format f, const Calibration* c, int layer, int head, KvKind kind, const uint8_t* b, float* x) {
  switch (f) {
    case Format::bf16:
      for (int i = 0; i < D; ++i) x[i] = bf16_to_f32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
      return;
    case Format::fp8: return Fp8Block<D>::decode(b, c->fp8_scale(layer, head, kind), x);
    case Format::int4: return Int4Block<D, false>::decode(b, b + D / 2, x);
    case Format::int4h: return Int4Block<D, true>::decode(b, b + D / 2, x);
    case Format::q4: return Q4Block<D>::decode(c->q(f).params(c->slot(layer, head, kind)), b, b + Q4Block<D>::kCodeBytes, x);
    case Format::q3_5: return Q35Block<D>::decode(c->q(f).params(c->slot(layer, head, kind)), b, b + Q35Block<D>::kCodeBytes, x);
    case Format::q3: return Q3Block<D>::decode(c->q(f).params(c->slot(layer, head, kind)), b, b + Q3Block<D>::kCodeBytes, x);
  }
}
void check_slot(const Calibration* c, Format f, int layer, int head) {
  if (!format_info(f).calibrated) return;
  KVPACK_CHECK(layer >= 0 && layer < c->n_layers() && head >= 0 && head < c->n_kv_heads(),
               "format {}: (layer {}, kv head {}) outside the calibration's {} layers x {} kv heads", format_name(f),
               layer, head, c->n_layers(), c->n_kv_heads());
}
}  // namespace

void BlockCodec::encode(int layer, int head, KvKind kind, const float* x, uint8_t* block) const {
  check_slot(calib_, f_, layer, head);
  if (d_ == 64) block_encode<64>(f_, calib_, layer, head, kind, x, block);
  else block_encode<128>(f_, calib_, layer, head, kind, x, block);
}

void BlockCodec::decode(int layer, int head, KvKind kind, const uint8_t* block, float* out) const {
  check_slot(calib_, f_, layer, head);
  if (d_ == 64) block_decode<64>(f_, calib_, layer, head, kind, block, out);
  else block_decode<128>(f_, calib_, layer, head, kind, block, out);
}

}  // namespace kvpack
