// int4 / int4h baseline block cores: llama.cpp's q4_0 applied to one token's head vector, optionally after a
// normalised Walsh-Hadamard rotation of the whole head vector (int4h, llama.cpp's rotated KV cache).
//
// Per group of 32 elements (ggml quantize_row_q4_0_ref, bit for bit): m = the element of largest magnitude (first
// one on ties), d = m / -8, code = min(15, trunc(x * (1/d) + 8.5)) (0 when d == 0), x^ = (code - 8) * fp16(d).
// 4 bits of code + 16 bits of fp16 scale per 32 elements = 4.5 bits/elem.
//
// Block layout for head_dim D (codes and metadata separable; codes 16-byte multiples):
//   bytes [0, D/2)            codes: group g (elements 32g..32g+31) in bytes [16g, 16g+16); byte 16g+j holds
//                             element 32g+j in its low nibble and element 32g+16+j in its high nibble (ggml order,
//                             so a lop3 on a 32-bit word yields 8 nibbles of two 16-element halves)
//   bytes [D/2, D/2 + D/16)   metadata: fp16 d of group g at byte D/2 + 2g, little-endian
// int4h: inputs are sanitised, rotated (x' = H x), then quantised as above; decode applies H again (H = H^T = H^-1).
// The kernel rotates the query by H instead (K) and the attention output once (V).
#pragma once
#include "kvpack/block/common.h"

namespace kvpack::block {

// ggml's q4_0 for 32 values: codes[16], returns the fp16 bits of d.
KVPACK_HD uint16_t q4_0_encode_group(const float* x, uint8_t* codes) {
  // Inputs are clamped to +-8*65504 so d stays a finite fp16; NaN -> 0.
  float v[32];
  float amax = 0.0f, m = 0.0f;
  for (int j = 0; j < 32; ++j) {
    // NaN -> 0, else clamped. Written with fminf / fmaxf / fabsf (the same values as the comparisons they replaced,
    // signed zeros included; test Int4.EncodeGroupMatchesItsDefinition) so that the GPU's write kernel, which is
    // issue-bound, folds them into min / max and operand modifiers (bench/NOTES.md v64).
    const float t = x[j] == x[j] ? fminf(fmaxf(x[j], -524032.0f), 524032.0f) : 0.0f;
    v[j] = t;
    const float a = fabsf(t);
    if (a > amax) {
      amax = a;
      m = t;
    }
  }
  const float d = m / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 16; ++j) {
    int q0 = static_cast<int>(fmaf(v[j], id, 8.5f));  // in [0, 16.5): truncation == floor
    int q1 = static_cast<int>(fmaf(v[j + 16], id, 8.5f));
    q0 = q0 > 15 ? 15 : q0;
    q1 = q1 > 15 ? 15 : q1;
    codes[j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
  return f32_to_f16(d);
}

KVPACK_HD void q4_0_decode_group(const uint8_t* codes, uint16_t d16, float* out) {
  const float d = f16_to_f32(d16);
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<float>((codes[j] & 15) - 8) * d;
    out[j + 16] = static_cast<float>((codes[j] >> 4) - 8) * d;
  }
}

template <int D, bool Rotate>
struct Int4Block {
  static_assert(D == 64 || D == 128, "head_dim must be 64 or 128");
  static constexpr int kGroups = D / 32;
  static constexpr int kCodeBytes = D / 2;
  static constexpr int kMetaBytes = 2 * kGroups;
  static constexpr int kBytes = kCodeBytes + kMetaBytes;

  // codes: kCodeBytes, meta: kMetaBytes (may point right after codes for the contiguous block).
  static KVPACK_HD void encode(const float* x, uint8_t* codes, uint8_t* meta) {
    float t[D];
    for (int i = 0; i < D; ++i) t[i] = Rotate ? sanitize(x[i]) : x[i];
    if constexpr (Rotate) hadamard<D>(t);
    for (int g = 0; g < kGroups; ++g) {
      uint16_t d = q4_0_encode_group(t + 32 * g, codes + 16 * g);
      meta[2 * g] = static_cast<uint8_t>(d & 0xff);
      meta[2 * g + 1] = static_cast<uint8_t>(d >> 8);
    }
  }
  // Decode in the rotated basis (what the kernel's dot products see): no inverse rotation.
  static KVPACK_HD void decode_rotated(const uint8_t* codes, const uint8_t* meta, float* out) {
    for (int g = 0; g < kGroups; ++g)
      q4_0_decode_group(codes + 16 * g, static_cast<uint16_t>(meta[2 * g] | (meta[2 * g + 1] << 8)), out + 32 * g);
  }
  // Decode in the model's basis.
  static KVPACK_HD void decode(const uint8_t* codes, const uint8_t* meta, float* out) {
    decode_rotated(codes, meta, out);
    if constexpr (Rotate) hadamard<D>(out);
  }
};
static_assert(Int4Block<64, false>::kBytes * 8 == 64 * 9 / 2 && Int4Block<128, true>::kBytes * 8 == 128 * 9 / 2,
              "int4 must cost 4.5 bits/elem");

}  // namespace kvpack::block
