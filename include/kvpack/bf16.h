// bf16/fp16 scalar conversions usable on host and device (bit-exact, round-to-nearest-even).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVPACK_HD __host__ __device__ __forceinline__
#define KVPACK_UNROLL _Pragma("unroll")
#else
#define KVPACK_HD inline
#define KVPACK_UNROLL
#endif

namespace kvpack {

KVPACK_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KVPACK_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN.
KVPACK_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
KVPACK_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
KVPACK_HD float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE fp16 -> fp32 (exact, handles subnormals/inf/nan).
KVPACK_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  return bits_f32(u);
}

// fp32 -> IEEE fp16, round to nearest even, overflow -> inf.
KVPACK_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {  // subnormal or zero in fp16
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - 1 ... places value at 2^-24 units
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t r = m >> shift;
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

}  // namespace kvpack
