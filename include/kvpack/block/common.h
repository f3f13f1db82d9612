// Scalar pieces shared by every block core (host + device): input sanitising, fp8 e4m3, the normalised Walsh-
// Hadamard transform and the 8-bit log2 per-token scale. All arithmetic is written so the host compiler and nvcc
// produce the same bits: every multiply-add is an explicit fmaf (both sides may contract a*b+c on their own, and
// not necessarily the same way), no transcendental functions (libm and CUDA's differ in the last ulp), only
// IEEE-exact operations (+ - * / sqrtf rintf floorf) and constant tables.
#pragma once
#include <cmath>
#include <cstdint>

#include "kvpack/bf16.h"

namespace kvpack::block {

// Largest magnitude any quantized format accepts; larger finite values and +-inf saturate to it, NaN becomes 0.
// 65504 (the fp16 maximum) is far above any real K/V activation and keeps every derived quantity finite.
constexpr float kMaxInput = 65504.0f;

// Four consecutive floats; on the GPU one 16-byte load (the caller keeps p 16-byte aligned), on the CPU four loads.
KVPACK_HD void load4(const float* p, float (&v)[4]) {
#if defined(__CUDA_ARCH__)
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
#else
  v[0] = p[0], v[1] = p[1], v[2] = p[2], v[3] = p[3];
#endif
}

// NaN -> 0, else clamped to +-kMaxInput (fminf / fmaxf of a number: the same as the comparisons, v64).
KVPACK_HD float sanitize(float x) { return x == x ? fminf(fmaxf(x, -kMaxInput), kMaxInput) : 0.0f; }

// ---- fp8 e4m3 ("fn": bias 7, no inf, S.1111.111 = NaN, max 448), exactly like CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round to nearest even, |x| >= 448 (and inf) -> +-448,
// NaN -> 0x7f.
KVPACK_HD uint8_t f32_to_e4m3(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // sm_89+: the hardware conversion, specified as the same function for every non-NaN input (RNE, satfinite:
  // +-448; the callers sanitize NaN away first), one instruction instead of ~15 (the fp8 write path was
  // instruction-bound, bench/NOTES.md v63). x goes to the low byte. BlockCoreGpu.E4m3EncodeMatchesTheHost checks
  // it against the code below (the host's) over 5 M inputs, PagedWriteGpu.ByteExactVsCpuEncoder the pools.
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(r & 0xffu);
#else
  uint32_t u = f32_bits(x);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  float fa = bits_f32(a);
  if (fa >= 448.0f) return static_cast<uint8_t>(sign | 0x7e);
  if (fa < 0.015625f) {  // below 2^-6: subnormal grid of 2^-9 (exact scaling, then RNE to an integer 0..8)
    float q = rintf(fa * 512.0f);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));  // q == 8 is the smallest normal, 0x08
  }
  uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);  // RNE to 3 mantissa bits (carry may bump the exponent)
  uint32_t e = (r >> 23) - 127u + 7u;
  uint32_t m = (r >> 20) & 7u;
  return static_cast<uint8_t>(sign | (e << 3) | m);
#endif
}

// f32_to_e4m3 of two values, lo in the low byte: one cvt for both on sm_89+ (the fp8 write kernel, v64).
KVPACK_HD uint16_t f32x2_to_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint16_t>(f32_to_e4m3(lo) | (f32_to_e4m3(hi) << 8));
#endif
}

KVPACK_HD float e4m3_to_f32(uint8_t c) {
  uint32_t e = (c >> 3) & 15u, m = c & 7u;
  float v;
  if (e == 15 && m == 7) {
    v = bits_f32(0x7fc00000u);
  } else if (e == 0) {
    v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
  } else {
    v = bits_f32(((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e-7), exact
  }
  return (c & 0x80) ? -v : v;
}

// ---- normalised Walsh-Hadamard transform (Sylvester order), in place; its own inverse. Butterflies are adds
// only, then one multiply by 1/sqrt(n), so host and device agree bit for bit.
// The butterfly stages len = 1 .. N/2 without the final scale (hadamard below; the GPU's int4h write runs the
// stages of len < 32 with this on each thread's 32 elements and the wider ones across threads, v64b).
template <int N>
KVPACK_HD void hadamard_butterflies(float* x) {
  static_assert(N >= 2 && (N & (N - 1)) == 0, "Hadamard size must be a power of two");
  for (int len = 1; len < N; len <<= 1)
    for (int i = 0; i < N; i += 2 * len)
      for (int j = i; j < i + len; ++j) {
        float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}
// 1/sqrt(N) for the sizes used (8..128); N = 4^k gives an exact power of two.
template <int N>
constexpr float hadamard_scale() {
  constexpr float s = N == 2     ? 0.70710678118654752f
                      : N == 4   ? 0.5f
                      : N == 8   ? 0.35355339059327376f
                      : N == 16  ? 0.25f
                      : N == 32  ? 0.17677669529663688f
                      : N == 64  ? 0.125f
                      : N == 128 ? 0.08838834764831845f
                      : N == 256 ? 0.0625f
                                 : 0.0f;
  static_assert(s != 0.0f, "unsupported Hadamard size");
  return s;
}
template <int N>
KVPACK_HD void hadamard(float* x) {
  hadamard_butterflies<N>(x);
  for (int i = 0; i < N; ++i) x[i] *= hadamard_scale<N>();
}

// ---- per-token scale byte: tau = 2^((e - 128) / 16), e in 0..255, i.e. 2^-8 .. 2^7.94 in steps of 4.4%.
// Decoding is a table lookup times a power of two (exact); encoding picks the nearest step in the log domain by
// comparing the mantissa against the 16 midpoints 2^((j + 0.5) / 16), so no log2f is needed.
namespace detail {
KVPACK_HD float scale_frac(int j) {
  constexpr float t[16] = {1.000000000e+00f, 1.044273734e+00f, 1.090507746e+00f, 1.138788581e+00f,
                           1.189207077e+00f, 1.241857767e+00f, 1.296839595e+00f, 1.354255557e+00f,
                           1.414213538e+00f, 1.476826191e+00f, 1.542210817e+00f, 1.610490322e+00f,
                           1.681792855e+00f, 1.756252170e+00f, 1.834008098e+00f, 1.915206552e+00f};
  return t[j];
}
KVPACK_HD float scale_frac_inv(int j) {
  constexpr float t[16] = {1.000000000e+00f, 9.576032758e-01f, 9.170040488e-01f, 8.781260848e-01f,
                           8.408964276e-01f, 8.052451611e-01f, 7.711054087e-01f, 7.384130955e-01f,
                           7.071067691e-01f, 6.771277785e-01f, 6.484197974e-01f, 6.209288836e-01f,
                           5.946035385e-01f, 5.693942904e-01f, 5.452538729e-01f, 5.221368670e-01f};
  return t[j];
}
KVPACK_HD float scale_mid(int j) {
  constexpr float t[16] = {1.021897197e+00f, 1.067140460e+00f, 1.114386797e+00f, 1.163724899e+00f,
                           1.215247393e+00f, 1.269050956e+00f, 1.325236678e+00f, 1.383909941e+00f,
                           1.445180774e+00f, 1.509164453e+00f, 1.575980902e+00f, 1.645755529e+00f,
                           1.718619347e+00f, 1.794709086e+00f, 1.874167681e+00f, 1.957144141e+00f};
  return t[j];
}
KVPACK_HD float pow2i(int e) { return bits_f32(static_cast<uint32_t>(127 + e) << 23); }  // e in [-126, 127]
}  // namespace detail

// Nearest scale byte to r (in log2), saturating at 0 and 255; r <= 0 or NaN -> 0, +inf -> 255.
KVPACK_HD uint8_t encode_scale_byte(float r) {
  if (!(r > 0.0f)) return 0;
  uint32_t u = f32_bits(r);
  if (u >= 0x7f800000u) return 255;
  int E = static_cast<int>(u >> 23) - 127;
  if (E < -9) return 0;
  if (E > 8) return 255;
  float m = bits_f32((u & 0x7fffffu) | 0x3f800000u);
  int j = 0;
  while (j < 16 && m >= detail::scale_mid(j)) ++j;
  int e = 16 * E + j + 128;
  return static_cast<uint8_t>(e < 0 ? 0 : (e > 255 ? 255 : e));
}
KVPACK_HD float decode_scale_byte(uint8_t e) { return detail::scale_frac(e & 15) * detail::pow2i((e >> 4) - 8); }
KVPACK_HD float decode_scale_byte_inv(uint8_t e) {
  return detail::scale_frac_inv(e & 15) * detail::pow2i(8 - (e >> 4));
}

}  // namespace kvpack::block
