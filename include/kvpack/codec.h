// KvCodec implementations for every format (the CPU reference codecs): store() replaces each K/V head vector with
// decode(encode(x)) using the SAME block cores as the CUDA kernels (include/kvpack/block/). Inputs are rounded to
// bf16 first (the cache is written from bf16 activations); sink tokens of kvpack's formats stay bf16.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kvpack/calibration.h"
#include "kvpack/formats.h"
#include "kvpack/kv_codec.h"
#include "kvpack/model_config.h"

namespace kvpack {

// calib may be null only for bf16/int4/int4h; otherwise throws naming the format. Throws when the calibration's
// shape does not match cfg, or cfg.head_dim is not 64/128 for a quantised format.
std::unique_ptr<KvCodec> make_codec(Format f, const ModelConfig& cfg, const Calibration* calib);

// Encode / decode one head vector of one (layer, kv head, K|V) slot to the block bytes (codes then metadata, exactly
// block_layout(f, head_dim).bytes()); the byte-level reference the CUDA write path is checked against.
// bf16 blocks are little-endian bf16. Throws on unsupported head_dim or missing calibration.
class BlockCodec {
 public:
  BlockCodec(Format f, int head_dim, const Calibration* calib);
  int bytes() const { return bytes_; }
  void encode(int layer, int head, KvKind kind, const float* x, uint8_t* block) const;
  void decode(int layer, int head, KvKind kind, const uint8_t* block, float* out) const;

 private:
  Format f_;
  int d_, bytes_;
  const Calibration* calib_;
};

}  // namespace kvpack
