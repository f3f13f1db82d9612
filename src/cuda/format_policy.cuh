// Format policies of the paged kernels: how a format's codes and per-token metadata become fp32 values.
//
// Every kernel is written once against this interface; a format plugs in as one struct:
//   kCodeBytes(D), kMetaBytes(D): bytes per token vector (must match make_paged_layout's table)
//   dequant8(row, octet, meta, out): 8 consecutive elements [8*octet, 8*octet+8) of one token vector
//   k_token_scale(meta) / v_token_scale(meta): per-token factor folded into the score / the probability
//   q_scale(params, head) / out_scale(params, head): per-(layer, kv head) factor folded into q and the output
//   octet_scale(meta, octet): a factor shared by the octet's 8 elements (int4's fp16 group scale), applied once
//     per octet to the partial dot product / the probability, never per element (kHasOctetScale)
//   kRotate: the stored vectors are Hadamard-rotated; the kernel rotates q once and the output once
//   write path: kVectorEncode ? (q formats: write_kv.cu's q kernels; the others: encode_group(x fp32[kEncodeElems],
//     ...) on slices, after group_transform, calling the format's block core (include/kvpack/block/*.h, the same
//     functions the CPU reference calls)) : encode8 (plain copies)
// Work is organised in octets (8 elements) so one thread's inner loop is the same for every format: a 16/8/4-byte
// shared-memory load, a few integer ops to dequantise, 8 FMAs per query head.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cstdint>

#include "kvpack/block/layout.h"

#include "kvpack/bf16.h"
#include "kvpack/error.h"
#include "kvpack/formats.h"
#include "kvpack/paged.h"

namespace kvpack::cuda_detail {

// mma.sync m16n8k16, fp32 accumulate. A rows 8..15 are zero (a group has at most 8 query heads).
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
// mma.sync m16n8k16 f16 with all four A registers (P.V with the head dimension as M: swap-AB).
__device__ __forceinline__ void mma_f16_full(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t f32x2_to_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Two e4m3 bytes -> f16x2 (exact: every e4m3 value is an f16), from the low (H = 0) or the high (H = 1) 16 bits of a
// word. On sm_89+ one cvt that reads the register's half directly (F2FP ... R.H1: no shift or mask first; v68); the
// same conversion, so the same bits, as __nv_cvt_fp8x2_to_halfraw2 of the shifted half (the fallback elsewhere).
template <int H>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_half(uint32_t w) {
  static_assert(H == 0 || H == 1, "the low or the high half");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t d;
  if constexpr (H == 0)
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;}\n" : "=r"(d) : "r"(w));
  else
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;}\n" : "=r"(d) : "r"(w));
  return d;
#else
  const __half2_raw hr =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(H ? w >> 16 : w & 0xffffu), __NV_E4M3);
  return uint32_t(hr.x) | (uint32_t(hr.y) << 16);
#endif
}
// Head-dimension permutation shared by A (query) and B (codes) fragments: thread t4 of a quad owns the 16-byte
// chunks t4, t4 + 4, ... of a token row (E elements each); k-step ks takes 4 consecutive elements of one of them,
// so B comes from conflict-light 16-byte loads instead of scattered 4-byte ones. Returns the first of the 4 dims.
template <int E>
__device__ __forceinline__ int mma_dim_base_e(int ks, int t4) {
  const int j = ks / (E / 4), hh = ks % (E / 4);
  return (t4 + 4 * j) * E + 4 * hh;
}

struct Bf16Policy {
  static constexpr Format kFormat = Format::bf16;
  static constexpr int kOctetBytes = 16;
  static constexpr bool kHasOctetScale = false, kRotate = false, kVectorEncode = false;
  static constexpr int kEncodeElems = 0;  // plain copies (encode8), no slice encoder
  static constexpr bool kMmaK = true;      // scores on tensor cores (bf16 mma), v6: all GPU tests pass on the H200
  static constexpr bool kQ = false;        // not a calibrated q format (QPolicy)
  static constexpr bool kMmaV = true;  // P.V on tensor cores (swap-AB, bf16 pairs of two tokens by byte permutes), v10
  __device__ __forceinline__ static int mma_dim_base(int ks, int t4) { return mma_dim_base_e<8>(ks, t4); }
  __device__ __forceinline__ static uint32_t pack_q(uint16_t lo, uint16_t hi) { return lo | (uint32_t(hi) << 16); }
  __device__ __forceinline__ static void mma(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    mma_bf16(c, a0, a2, b0, b1);
  }
  // B words for every k-step of one token row: 16 bytes = 8 bf16 = two k-steps (2 words each).
  template <int D>
  __device__ __forceinline__ static void mma_b(const uint8_t* row, int t4, uint32_t (&bf)[D / 16][2]) {
#pragma unroll
    for (int j = 0; j < D / 32; ++j) {
      const uint4 v = *reinterpret_cast<const uint4*>(row + (t4 + 4 * j) * 16);
      bf[2 * j][0] = v.x;
      bf[2 * j][1] = v.y;
      bf[2 * j + 1][0] = v.z;
      bf[2 * j + 1][1] = v.w;
    }
  }
  // P.V (kMmaV): A fragments of the swap-AB mma from tokens a and b, thread r's D/8 elements [r D/8, (r+1) D/8):
  // out[mt][0] = (element 2 mt of a, of b) (row r of m-tile mt), out[mt][1] = element 2 mt + 1 (row r + 8).
  template <int D>
  __device__ __forceinline__ static void v_pairs(const uint8_t* a, const uint8_t* b, int r, uint32_t (&out)[D / 16][2]) {
#pragma unroll
    for (int k = 0; k < D / 64; ++k) {
      const uint4 va = *reinterpret_cast<const uint4*>(a + r * (D / 4) + 16 * k);
      const uint4 vb = *reinterpret_cast<const uint4*>(b + r * (D / 4) + 16 * k);
      const uint32_t wa[4] = {va.x, va.y, va.z, va.w}, wb[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        out[4 * k + w][0] = __byte_perm(wa[w], wb[w], 0x5410);
        out[4 * k + w][1] = __byte_perm(wa[w], wb[w], 0x7632);
      }
    }
  }
  // The weights w0, w1 as a bf16 hi + lo pair of registers (~16 bits kept).
  __device__ __forceinline__ static void pack_w(float w0, float w1, uint32_t& hi, uint32_t& lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(w0, w1);
    const float2 f = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(w0 - f.x, w1 - f.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  }
  __device__ __forceinline__ static void mma_full(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static const float* group_scale(const FormatParams&, int, bool) { return nullptr; }
  __device__ __forceinline__ static float group_ctx(float) { return 0.f; }
  template <int D>
  __device__ __forceinline__ static void group_transform(float*, int) {}
  __device__ __forceinline__ static void encode_group(const float*, int, uint8_t*, uint8_t*, float) {}
  __device__ __forceinline__ static float octet_scale(const uint8_t*, int) { return 1.f; }
  static constexpr int code_bytes(int D) { return 2 * D; }
  static constexpr int meta_bytes(int) { return 0; }

  // bf16 -> fp32 is a 16-bit shift: 2 integer ops per pair.
  __device__ __forceinline__ static void dequant8(const uint8_t* row, int octet, const uint8_t*, float out[8]) {
    uint4 r = *reinterpret_cast<const uint4*>(row + octet * 16);
    uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  __device__ __forceinline__ static float k_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float v_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float q_scale(const FormatParams&, int) { return 1.f; }
  __device__ __forceinline__ static float out_scale(const FormatParams&, int) { return 1.f; }

  __device__ __forceinline__ static void encode8(const uint16_t* in, int octet, uint8_t* row, uint8_t*,
                                                 const FormatParams&, int, bool) {
    *reinterpret_cast<uint4*>(row + octet * 16) = *reinterpret_cast<const uint4*>(in + octet * 8);
  }
};

// fp8 e4m3 with a static per-(layer, kv head) scale folded into q (K) and the output (V).
struct Fp8Policy {
  static constexpr Format kFormat = Format::fp8;
  static constexpr bool kHasOctetScale = false, kRotate = false, kVectorEncode = true;
  static constexpr bool kMmaK = true;   // tensor-core scores (e4m3 -> f16 exact), v6: all GPU tests pass
  static constexpr bool kQ = false;
  // P.V on tensor cores too (swap-AB, e4m3 pairs of two tokens -> f16x2 with one cvt), v10
  static constexpr bool kMmaV = true;
  static constexpr int code_bytes(int D) { return block::block_layout(Format::fp8, D).code_bytes; }
  __device__ __forceinline__ static int mma_dim_base(int ks, int t4) { return mma_dim_base_e<16>(ks, t4); }
  __device__ __forceinline__ static uint32_t pack_q(uint16_t lo, uint16_t hi) {
    const __half2 h2 = __floats2half2_rn(bf16_to_f32(lo), bf16_to_f32(hi));
    return *reinterpret_cast<const uint32_t*>(&h2);
  }
  __device__ __forceinline__ static void mma(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    mma_f16(c, a0, a2, b0, b1);
  }
  // 16 bytes = 16 e4m3 = four k-steps (one 32-bit word, two cvt each).
  template <int D>
  __device__ __forceinline__ static void mma_b(const uint8_t* row, int t4, uint32_t (&bf)[D / 16][2]) {
#pragma unroll
    for (int j = 0; j < D / 64; ++j) {
      const uint4 v = *reinterpret_cast<const uint4*>(row + (t4 + 4 * j) * 16);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) {
        bf[4 * j + hh][0] = e4m3x2_to_f16x2_half<0>(w[hh]);
        bf[4 * j + hh][1] = e4m3x2_to_f16x2_half<1>(w[hh]);
      }
    }
  }
  static constexpr int meta_bytes(int D) { return block::block_layout(Format::fp8, D).meta_bytes; }
  // P.V (kMmaV): A fragments of the swap-AB mma from tokens a and b, thread r's D/8 elements [r D/8, (r+1) D/8):
  // out[mt][0] = (element 2 mt of a, of b) (row r of m-tile mt), out[mt][1] = element 2 mt + 1 (row r + 8); two
  // byte permutes and four cvt per 4 elements of each token.
  template <int D>
  __device__ __forceinline__ static void v_pairs(const uint8_t* a, const uint8_t* b, int r, uint32_t (&out)[D / 16][2]) {
    uint32_t wa[D / 32], wb[D / 32];
    if constexpr (D == 128) {
      const uint4 va = *reinterpret_cast<const uint4*>(a + r * 16), vb = *reinterpret_cast<const uint4*>(b + r * 16);
      wa[0] = va.x, wa[1] = va.y, wa[2] = va.z, wa[3] = va.w;
      wb[0] = vb.x, wb[1] = vb.y, wb[2] = vb.z, wb[3] = vb.w;
    } else {
      const uint2 va = *reinterpret_cast<const uint2*>(a + r * 8), vb = *reinterpret_cast<const uint2*>(b + r * 8);
      wa[0] = va.x, wa[1] = va.y;
      wb[0] = vb.x, wb[1] = vb.y;
    }
#pragma unroll
    for (int w = 0; w < D / 32; ++w) {
      const uint32_t x = __byte_perm(wa[w], wb[w], 0x5140), y = __byte_perm(wa[w], wb[w], 0x7362);
      out[2 * w][0] = e4m3x2_to_f16x2_half<0>(x);
      out[2 * w][1] = e4m3x2_to_f16x2_half<1>(x);
      out[2 * w + 1][0] = e4m3x2_to_f16x2_half<0>(y);
      out[2 * w + 1][1] = e4m3x2_to_f16x2_half<1>(y);
    }
  }
  // The weights w0, w1 as an f16 hi + lo pair of registers (~22 bits kept, as fp32 products would).
  __device__ __forceinline__ static void pack_w(float w0, float w1, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(w0, w1);
    const float2 f = __half22float2(h);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = f32x2_to_f16x2(w0 - f.x, w1 - f.y);
  }
  __device__ __forceinline__ static void mma_full(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
    mma_f16_full(c, a0, a1, a2, a3, b0, b1);
  }
  // e4m3 -> f16 is one cvt per pair on sm_89+ (exact: every e4m3 value is an f16), then f16 -> f32 (exact).
  __device__ __forceinline__ static void dequant8(const uint8_t* row, int octet, const uint8_t*, float out[8]) {
    const uint2 r = *reinterpret_cast<const uint2*>(row + octet * 8);
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t h2 = j ? e4m3x2_to_f16x2_half<1>(w[i]) : e4m3x2_to_f16x2_half<0>(w[i]);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
        out[4 * i + 2 * j] = f.x;
        out[4 * i + 2 * j + 1] = f.y;
      }
  }
  __device__ __forceinline__ static float octet_scale(const uint8_t*, int) { return 1.f; }
  __device__ __forceinline__ static float k_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float v_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float q_scale(const FormatParams& p, int h) { return p.k_scale ? p.k_scale[h] : 1.f; }
  __device__ __forceinline__ static float out_scale(const FormatParams& p, int h) { return p.v_scale ? p.v_scale[h] : 1.f; }
  // Write path, 8 elements per thread (coalesced). Fp8Block::encode is elementwise; this applies the same scalar
  // core (block::f32_to_e4m3 of sanitize(x) * (1 / scale)) to a slice. The byte-exact GPU test guards the two.
  // The write kernel loads the head's scale (group_scale: where it is, nullptr for 1) early, once per thread, and
  // passes group_ctx(scale) = 1 / scale to each group it encodes.
  static constexpr int kEncodeElems = 8;
  __device__ __forceinline__ static const float* group_scale(const FormatParams& p, int h, bool is_v) {
    const float* sc = is_v ? p.v_scale : p.k_scale;
    return sc ? sc + h : nullptr;
  }
  __device__ __forceinline__ static float group_ctx(float scale) { return 1.0f / scale; }
  template <int D>
  __device__ __forceinline__ static void group_transform(float*, int) {}
  __device__ __forceinline__ static void encode_group(const float* x, int group, uint8_t* codes, uint8_t*, float inv) {
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i += 2)
      w[i / 4] |= uint32_t(block::f32x2_to_e4m3x2(block::sanitize(x[i]) * inv, block::sanitize(x[i + 1]) * inv))
                  << (8 * (i % 4));
    *reinterpret_cast<uint2*>(codes + group * 8) = make_uint2(w[0], w[1]);
  }
};

// int4 / int4h (ggml q4_0 per 32 elements, fp16 group scale; int4h after a Hadamard rotation of the head vector).
// Group g's 16 code bytes hold elements 32g+j (low nibble) and 32g+16+j (high nibble) of byte j, so octet k of the
// group is one 8-byte load (bytes (k&1)*8..) and one nibble shift ((k>>1)*4).
template <bool Rotate>
struct Int4Policy {
  static constexpr Format kFormat = Rotate ? Format::int4h : Format::int4;
  static constexpr bool kHasOctetScale = true, kRotate = Rotate, kVectorEncode = true;
  static constexpr bool kMmaK = false;  // CUDA-core scores (a group scale per 32 elements; tensor path not done)
  static constexpr bool kQ = false;
  static constexpr bool kMmaV = false;
  __device__ __forceinline__ static int mma_dim_base(int, int) { return 0; }
  __device__ __forceinline__ static uint32_t pack_q(uint16_t, uint16_t) { return 0; }
  __device__ __forceinline__ static void mma(float (&)[4], uint32_t, uint32_t, uint32_t, uint32_t) {}
  template <int D>
  __device__ __forceinline__ static void mma_b(const uint8_t*, int, uint32_t (&)[D / 16][2]) {}
  static constexpr int code_bytes(int D) { return block::block_layout(kFormat, D).code_bytes; }
  static constexpr int meta_bytes(int D) { return block::block_layout(kFormat, D).meta_bytes; }
  __device__ __forceinline__ static void dequant8(const uint8_t* row, int octet, const uint8_t*, float out[8]) {
    const int g = octet >> 2, k = octet & 3;
    const uint2 r = *reinterpret_cast<const uint2*>(row + 16 * g + (k & 1) * 8);
    const int sh = (k >> 1) * 4;
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // 2^23 + n as a float bit pattern, minus (2^23 + 8): exactly n - 8 without an int->float conversion.
        const uint32_t n = (w[i] >> (8 * j + sh)) & 15u;
        out[4 * i + j] = __uint_as_float(0x4B000000u | n) - 8388616.0f;
      }
  }
  __device__ __forceinline__ static float octet_scale(const uint8_t* meta, int octet) {
    return __half2float(reinterpret_cast<const __half*>(meta)[octet >> 2]);
  }
  __device__ __forceinline__ static float k_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float v_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float q_scale(const FormatParams&, int) { return 1.f; }
  __device__ __forceinline__ static float out_scale(const FormatParams&, int) { return 1.f; }
  // Write path: one thread per 32-element group through the block core's q4_0_encode_group. int4h first rotates
  // the whole head vector (Int4Block::encode: sanitize, then block::hadamard<D>), here across the D / 32 threads of
  // one vector, which are neighbouring lanes (the write kernel's group index is its fastest): each thread runs the
  // butterflies of len < 32 on its own 32 elements (block::hadamard_butterflies<32>), the wider stages exchange
  // with the partner lane (grp ^ len), then the one final scale. Every butterfly adds or subtracts the same two
  // values as the serial core's, so the bits are the same (PagedWriteGpu.ByteExactVsCpuEncoder; v64b: int4h's
  // write had kept the whole rotated vector in local memory, 592 bytes per thread, and read 15% of the bandwidth).
  static constexpr int kEncodeElems = 32;
  __device__ __forceinline__ static const float* group_scale(const FormatParams&, int, bool) { return nullptr; }
  __device__ __forceinline__ static float group_ctx(float) { return 0.f; }
  template <int D>
  __device__ __forceinline__ static void group_transform(float* x, int grp) {
    if constexpr (Rotate) {
      constexpr int kG = D / 32;  // threads of one head vector
      const unsigned lane = threadIdx.x & 31u;
      const unsigned mask = ((1u << kG) - 1u) << (lane & ~unsigned(kG - 1));
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] = block::sanitize(x[i]);
      block::hadamard_butterflies<32>(x);
#pragma unroll
      for (int len = 1; len < kG; len <<= 1) {  // the stage of len 32 * len: element i of lanes grp and grp ^ len
        const bool lower = (grp & len) == 0;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float o = __shfl_xor_sync(mask, x[i], len);
          x[i] = lower ? x[i] + o : o - x[i];
        }
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] *= block::hadamard_scale<D>();
    }
  }
  __device__ __forceinline__ static void encode_group(const float* x, int group, uint8_t* codes, uint8_t* meta, float) {
    __align__(16) uint8_t c[16];
    const uint16_t d = block::q4_0_encode_group(x, c);
    *reinterpret_cast<uint4*>(codes + 16 * group) = *reinterpret_cast<const uint4*>(c);
    *reinterpret_cast<uint16_t*>(meta + 2 * group) = d;
  }
};

// q4 / q3.5 / q3 (block::QBlock): the write path's view (the block core's encoder, its logical block's sizes). They
// decode on the lean kernel only (decode_lean.cuh, the lane layout of block/q_lanes.h); the regular kernel's q path
// (per-slot widths, token-major codes) was removed on 2026-12-06 (bench/NOTES.md v44).
template <int BitsX2>
struct QPolicy {
  static constexpr Format kFormat = BitsX2 == 8 ? Format::q4 : BitsX2 == 7 ? Format::q3_5 : Format::q3;
  static constexpr bool kVectorEncode = true;
  static constexpr bool kQ = true;
  static constexpr int kEncodeElems = 0;
  static constexpr int code_bytes(int D) { return block::block_layout(kFormat, D).code_bytes; }
  static constexpr int meta_bytes(int D) { return block::block_layout(kFormat, D).meta_bytes; }
  template <int D>
  using Block = block::QBlock<D, BitsX2>;
  __device__ __forceinline__ static const float* group_scale(const FormatParams&, int, bool) { return nullptr; }
  __device__ __forceinline__ static float group_ctx(float) { return 0.f; }
  template <int D>
  __device__ __forceinline__ static void group_transform(float*, int) {}
  __device__ __forceinline__ static void encode_group(const float*, int, uint8_t*, uint8_t*, float) {}
};

// nvcc 13's front end cannot evaluate fmt 9's consteval format-string check ("did not produce a valid constant
// expression"), so .cu files check with runtime format strings through this macro instead of KVPACK_CHECK.
#define KVPACK_CU_CHECK(cond, f, ...)                                         \
  do {                                                                        \
    if (!(cond)) ::kvpack::fail(fmt::runtime(f) __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

[[noreturn]] inline void unsupported_format(Format f) {
  ::kvpack::fail(fmt::runtime("CUDA paged kernels: format '{}' not supported"), format_name(f));
}
[[noreturn]] inline void unsupported_head_dim(int d) {
  ::kvpack::fail(fmt::runtime("CUDA paged kernels: head_dim {} not supported (64, 128)"), d);
}

// Dispatch on the format (one point; the same list answers "supported?" on the device side).
#define KVPACK_DISPATCH_FORMAT(fmt, Policy, ...)                                          \
  [&] {                                                                                   \
    switch (fmt) {                                                                        \
      case ::kvpack::Format::bf16: {                                                      \
        using Policy = ::kvpack::cuda_detail::Bf16Policy;                                 \
        return __VA_ARGS__();                                                             \
      }                                                                                   \
      case ::kvpack::Format::fp8: {                                                       \
        using Policy = ::kvpack::cuda_detail::Fp8Policy;                                  \
        return __VA_ARGS__();                                                             \
      }                                                                                   \
      case ::kvpack::Format::int4: {                                                      \
        using Policy = ::kvpack::cuda_detail::Int4Policy<false>;                          \
        return __VA_ARGS__();                                                             \
      }                                                                                   \
      case ::kvpack::Format::int4h: {                                                     \
        using Policy = ::kvpack::cuda_detail::Int4Policy<true>;                           \
        return __VA_ARGS__();                                                             \
      }                                                                                   \
      case ::kvpack::Format::q4: {                                                        \
        using Policy = ::kvpack::cuda_detail::QPolicy<8>;                                 \
        return __VA_ARGS__();                                                             \
      }                                                                                   \
      case ::kvpack::Format::q3_5: {                                                      \
        using Policy = ::kvpack::cuda_detail::QPolicy<7>;                                 \
        return __VA_ARGS__();                                                             \
      }                                                                                   \
      case ::kvpack::Format::q3: {                                                        \
        using Policy = ::kvpack::cuda_detail::QPolicy<6>;                                 \
        return __VA_ARGS__();                                                             \
      }                                                                                   \
      default:                                                                            \
        ::kvpack::cuda_detail::unsupported_format(fmt);                                   \
    }                                                                                     \
  }()

#define KVPACK_DISPATCH_HEAD_DIM(d, D, ...)                           \
  [&] {                                                               \
    if ((d) == 64) {                                                  \
      constexpr int D = 64;                                           \
      return __VA_ARGS__();                                           \
    } else if ((d) == 128) {                                          \
      constexpr int D = 128;                                          \
      return __VA_ARGS__();                                           \
    }                                                                 \
    ::kvpack::cuda_detail::unsupported_head_dim(d);                   \
  }()

#define KVPACK_CUDA_CHECK(expr)                                                                       \
  do {                                                                                                \
    cudaError_t e_ = (expr);                                                                          \
    if (e_ != cudaSuccess)                                                                            \
      ::kvpack::fail(fmt::runtime("CUDA error {} at {}:{}: {}"), int(e_), __FILE__, __LINE__,          \
                     cudaGetErrorString(e_));                                                         \
  } while (0)

}  // namespace kvpack::cuda_detail
