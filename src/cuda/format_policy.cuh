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
//   write path: kVectorEncode ? encode_vec<D>(x fp32[D], codes, meta, ...) calling the format's block core
//     (include/kvpack/block/*.h, the same function the CPU reference calls) : encode8 (plain copies)
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

struct Bf16Policy {
  static constexpr Format kFormat = Format::bf16;
  static constexpr int kOctetBytes = 16;
  static constexpr bool kHasOctetScale = false, kRotate = false, kVectorEncode = false;
  static constexpr int kEncodeElems = 0;  // plain copies (encode8), no slice encoder
  __device__ __forceinline__ static void encode_group(const float*, int, uint8_t*, uint8_t*, const FormatParams&, int,
                                                      bool) {}
  template <int D>
  __device__ __forceinline__ static void encode_vec(const float*, uint8_t*, uint8_t*, const FormatParams&, int, bool) {}
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
  static constexpr int code_bytes(int D) { return block::block_layout(Format::fp8, D).code_bytes; }
  static constexpr int meta_bytes(int D) { return block::block_layout(Format::fp8, D).meta_bytes; }
  // e4m3 -> f16 is one cvt per pair on sm_89+ (exact: every e4m3 value is an f16), then f16 -> f32 (exact).
  __device__ __forceinline__ static void dequant8(const uint8_t* row, int octet, const uint8_t*, float out[8]) {
    const uint2 r = *reinterpret_cast<const uint2*>(row + octet * 8);
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const __half2_raw hr =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * j)), __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
        out[4 * i + 2 * j] = f.x;
        out[4 * i + 2 * j + 1] = f.y;
      }
  }
  __device__ __forceinline__ static float octet_scale(const uint8_t*, int) { return 1.f; }
  __device__ __forceinline__ static float k_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float v_token_scale(const uint8_t*) { return 1.f; }
  __device__ __forceinline__ static float q_scale(const FormatParams& p, int h) { return p.k_scale ? p.k_scale[h] : 1.f; }
  __device__ __forceinline__ static float out_scale(const FormatParams& p, int h) { return p.v_scale ? p.v_scale[h] : 1.f; }
  template <int D>
  __device__ __forceinline__ static void encode_vec(const float* x, uint8_t* codes, uint8_t*, const FormatParams& p,
                                                    int h, bool is_v) {
    const float* sc = is_v ? p.v_scale : p.k_scale;
    block::Fp8Block<D>::encode(x, sc ? sc[h] : 1.f, codes);
  }
  // Write path, 8 elements per thread (coalesced). Fp8Block::encode is elementwise; this applies the same scalar
  // core (block::f32_to_e4m3 of sanitize(x) * (1 / scale)) to a slice. The byte-exact GPU test guards the two.
  static constexpr int kEncodeElems = 8;
  __device__ __forceinline__ static void encode_group(const float* x, int group, uint8_t* codes, uint8_t*,
                                                      const FormatParams& p, int h, bool is_v) {
    const float* sc = is_v ? p.v_scale : p.k_scale;
    const float inv = 1.0f / (sc ? sc[h] : 1.f);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i / 4] |= uint32_t(block::f32_to_e4m3(block::sanitize(x[i]) * inv)) << (8 * (i % 4));
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
  template <int D>
  __device__ __forceinline__ static void encode_vec(const float* x, uint8_t* codes, uint8_t* meta, const FormatParams&,
                                                    int, bool) {
    block::Int4Block<D, Rotate>::encode(x, codes, meta);
  }
  // Write path for plain int4: one thread per 32-element group through the block core's q4_0_encode_group (int4h
  // needs the whole vector for its rotation: kEncodeElems = 0 keeps it on the per-vector path).
  static constexpr int kEncodeElems = Rotate ? 0 : 32;
  __device__ __forceinline__ static void encode_group(const float* x, int group, uint8_t* codes, uint8_t* meta,
                                                      const FormatParams&, int, bool) {
    __align__(16) uint8_t c[16];
    const uint16_t d = block::q4_0_encode_group(x, c);
    *reinterpret_cast<uint4*>(codes + 16 * group) = *reinterpret_cast<const uint4*>(c);
    *reinterpret_cast<uint16_t*>(meta + 2 * group) = d;
  }
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
