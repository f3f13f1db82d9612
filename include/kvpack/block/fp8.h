// fp8 baseline block core: e4m3 with one static calibrated scale per (layer, kv head, K|V), as vLLM and
// TensorRT-LLM store an fp8 KV cache. Block = head_dim bytes of codes, no per-token metadata (8.0 bits/elem).
//   code[i] = e4m3(sanitize(x[i]) * (1 / scale))      (RNE, saturating at +-448)
//   x^[i]   = e4m3_to_f32(code[i]) * scale
// The kernel folds `scale` into the query (K) and the output (V); the per-element work is one cvt.
#pragma once
#include "kvpack/block/common.h"

namespace kvpack::block {

template <int D>
struct Fp8Block {
  static_assert(D == 64 || D == 128, "head_dim must be 64 or 128");
  static constexpr int kCodeBytes = D;
  static constexpr int kMetaBytes = 0;
  static constexpr int kBytes = kCodeBytes + kMetaBytes;

  // scale: the calibrated scale (> 0, finite); codes: D bytes.
  static KVPACK_HD void encode(const float* x, float scale, uint8_t* codes) {
    const float inv = 1.0f / scale;
    for (int i = 0; i < D; ++i) codes[i] = f32_to_e4m3(sanitize(x[i]) * inv);
  }
  static KVPACK_HD void decode(const uint8_t* codes, float scale, float* out) {
    for (int i = 0; i < D; ++i) out[i] = e4m3_to_f32(codes[i]) * scale;
  }
};
static_assert(Fp8Block<64>::kBytes == 64 && Fp8Block<128>::kBytes == 128);

}  // namespace kvpack::block
