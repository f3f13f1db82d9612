// ggml dequantizers, transcribed from ggml-quants.c `dequantize_row_*` (reference C versions).
//
// Bit-exactness: ggml computes e.g. `x*d + m` in float. A compiler allowed to contract that into a fused
// multiply-add (GCC's default for C++ with -march=x86-64-v3) rounds once instead of twice and changes the last bit,
// so this file turns contraction off; results then equal the numpy dequantizers of the `gguf` Python package
// (which round every operation) bit for bit. The pragma must precede every include so that inline helpers
// (f16_to_f32) carry the same optimisation settings and still inline.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "kvpack/dequant.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <string>

#include "kvpack/bf16.h"
#include "kvpack/error.h"

namespace kvpack {
namespace {

constexpr int QK = 32;     // elements per block of the legacy types
constexpr int QK_K = 256;  // elements per super-block of the k-quants
constexpr int K_SCALE_SIZE = 12;

// Block structs as in ggml-common.h; fp16 fields are raw uint16_t. Sizes are checked against ggml's.
struct block_q4_0 { uint16_t d; uint8_t qs[QK / 2]; };
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct block_q8_0 { uint16_t d; int8_t qs[QK]; };
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct block_q4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210 && sizeof(block_q8_K) == 292);

struct TypeTraits {
  GgmlType type;
  std::string_view name;
  int64_t block_size;
  int64_t type_size;
};

// Every ggml type a GGUF file may hold (gguf.constants.GGML_QUANT_SIZES); ids 4 and 5 were removed from ggml.
constexpr std::array kTypes = {
    TypeTraits{GgmlType::F32, "F32", 1, 4},           TypeTraits{GgmlType::F16, "F16", 1, 2},
    TypeTraits{GgmlType::Q4_0, "Q4_0", 32, 18},       TypeTraits{GgmlType::Q4_1, "Q4_1", 32, 20},
    TypeTraits{GgmlType::Q5_0, "Q5_0", 32, 22},       TypeTraits{GgmlType::Q5_1, "Q5_1", 32, 24},
    TypeTraits{GgmlType::Q8_0, "Q8_0", 32, 34},       TypeTraits{GgmlType::Q8_1, "Q8_1", 32, 36},
    TypeTraits{GgmlType::Q2_K, "Q2_K", 256, 84},      TypeTraits{GgmlType::Q3_K, "Q3_K", 256, 110},
    TypeTraits{GgmlType::Q4_K, "Q4_K", 256, 144},     TypeTraits{GgmlType::Q5_K, "Q5_K", 256, 176},
    TypeTraits{GgmlType::Q6_K, "Q6_K", 256, 210},     TypeTraits{GgmlType::Q8_K, "Q8_K", 256, 292},
    TypeTraits{GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66}, TypeTraits{GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    TypeTraits{GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98}, TypeTraits{GgmlType::IQ1_S, "IQ1_S", 256, 50},
    TypeTraits{GgmlType::IQ4_NL, "IQ4_NL", 32, 18},   TypeTraits{GgmlType::IQ3_S, "IQ3_S", 256, 110},
    TypeTraits{GgmlType::IQ2_S, "IQ2_S", 256, 82},    TypeTraits{GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    TypeTraits{GgmlType::I8, "I8", 1, 1},             TypeTraits{GgmlType::I16, "I16", 1, 2},
    TypeTraits{GgmlType::I32, "I32", 1, 4},           TypeTraits{GgmlType::I64, "I64", 1, 8},
    TypeTraits{GgmlType::F64, "F64", 1, 8},           TypeTraits{GgmlType::IQ1_M, "IQ1_M", 256, 56},
    TypeTraits{GgmlType::BF16, "BF16", 1, 2},         TypeTraits{GgmlType::TQ1_0, "TQ1_0", 256, 54},
    TypeTraits{GgmlType::TQ2_0, "TQ2_0", 256, 66},    TypeTraits{GgmlType::MXFP4, "MXFP4", 32, 17},
};

const TypeTraits* traits(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

const TypeTraits& traits_or_throw(GgmlType t) {
  const TypeTraits* tr = traits(static_cast<uint32_t>(t));
  KVPACK_CHECK(tr != nullptr, "unknown ggml type id {}", static_cast<uint32_t>(t));
  return *tr;
}

float h(uint16_t x) { return f16_to_f32(x); }

void deq_q4_0(const block_q4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h(x[i].d);
    for (int j = 0; j < QK / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[i * QK + j] = x0 * d;
      y[i * QK + j + QK / 2] = x1 * d;
    }
  }
}

void deq_q4_1(const block_q4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h(x[i].d);
    const float m = h(x[i].m);
    for (int j = 0; j < QK / 2; ++j) {
      const int x0 = x[i].qs[j] & 0x0F;
      const int x1 = x[i].qs[j] >> 4;
      y[i * QK + j] = x0 * d + m;
      y[i * QK + j + QK / 2] = x1 * d + m;
    }
  }
}

void deq_q5_0(const block_q5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < QK / 2; ++j) {
      const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
      const int32_t x0 = ((x[i].qs[j] & 0x0F) | xh_0) - 16;
      const int32_t x1 = ((x[i].qs[j] >> 4) | xh_1) - 16;
      y[i * QK + j] = x0 * d;
      y[i * QK + j + QK / 2] = x1 * d;
    }
  }
}

void deq_q5_1(const block_q5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h(x[i].d);
    const float m = h(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < QK / 2; ++j) {
      const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
      const int x0 = (x[i].qs[j] & 0x0F) | xh_0;
      const int x1 = (x[i].qs[j] >> 4) | xh_1;
      y[i * QK + j] = x0 * d + m;
      y[i * QK + j + QK / 2] = x1 * d + m;
    }
  }
}

void deq_q8_0(const block_q8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h(x[i].d);
    for (int j = 0; j < QK; ++j) y[i * QK + j] = x[i].qs[j] * d;
  }
}

void deq_q2_K(const block_q2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h(x[i].d);
    const float min = h(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc = x[i].scales[is++];
        float dl = d * (sc & 0xF), ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l] >> shift) & 3) - ml;
        sc = x[i].scales[is++];
        dl = d * (sc & 0xF), ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l + 16] >> shift) & 3) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

void deq_q3_K(const block_q3_K* x, float* y, int64_t nb) {
  constexpr uint32_t kmask1 = 0x03030303;
  constexpr uint32_t kmask2 = 0x0f0f0f0f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d_all = h(x[i].d);
    const uint8_t* q = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    uint8_t m = 1;
    // The 16 6-bit scales are packed into 12 bytes; unpack as ggml does (little-endian words).
    uint32_t aux[4];
    std::memcpy(aux, x[i].scales, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = d_all * (scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * (static_cast<int8_t>((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
        dl = d_all * (scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * (static_cast<int8_t>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
        shift += 2;
        m <<= 1;
      }
      q += 32;
    }
  }
}

// The 8 6-bit scales and mins of a Q4_K/Q5_K super-block, packed into 12 bytes.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

void deq_q4_K(const block_q4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = h(x[i].d);
    const float min = h(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < QK_K; j += 64) {
      get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void deq_q5_K(const block_q5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    const float d = h(x[i].d);
    const float min = h(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < QK_K; j += 64) {
      get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

void deq_q6_K(const block_q6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < QK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void deq_q8_K(const block_q8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    for (int j = 0; j < QK_K; ++j) *y++ = x[i].d * x[i].qs[j];
}

void deq_f16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

void deq_bf16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

// Runs `fn` on blocks at `src` when it is suitably aligned for Block, else on an aligned copy one chunk at a time
// (tensor data in a GGUF file is aligned, but dequantize_row accepts any pointer).
template <typename Block, typename Fn>
void run_blocks(const void* src, float* dst, int64_t nb, int64_t block_elems, Fn fn) {
  if (reinterpret_cast<uintptr_t>(src) % alignof(Block) == 0) {
    fn(static_cast<const Block*>(src), dst, nb);
    return;
  }
  constexpr int64_t kChunk = 64;
  Block tmp[kChunk];
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < nb; b += kChunk) {
    const int64_t m = std::min(kChunk, nb - b);
    std::memcpy(tmp, bytes + b * sizeof(Block), static_cast<size_t>(m) * sizeof(Block));
    fn(tmp, dst + b * block_elems, m);
  }
}

}  // namespace

std::string_view ggml_type_name(GgmlType t) {
  const TypeTraits* tr = traits(static_cast<uint32_t>(t));
  return tr ? tr->name : std::string_view("unknown");
}

bool ggml_type_known(uint32_t id) { return traits(id) != nullptr; }

bool ggml_type_supported(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::Q8_K:
      return true;
    default:
      return false;
  }
}

std::optional<GgmlType> parse_ggml_type(std::string_view name) {
  for (const auto& t : kTypes) {
    if (t.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(name[i])) == static_cast<unsigned char>(t.name[i]);
    if (eq) return t.type;
  }
  return std::nullopt;
}

int64_t ggml_block_size(GgmlType t) { return traits_or_throw(t).block_size; }
int64_t ggml_type_size(GgmlType t) { return traits_or_throw(t).type_size; }

uint64_t ggml_row_size(GgmlType t, int64_t n) {
  const TypeTraits& tr = traits_or_throw(t);
  KVPACK_CHECK(n >= 0 && n % tr.block_size == 0, "{} row of {} elements: not a multiple of the block size {}",
               tr.name, n, tr.block_size);
  return static_cast<uint64_t>(n / tr.block_size) * static_cast<uint64_t>(tr.type_size);
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const TypeTraits& tr = traits_or_throw(type);
  KVPACK_CHECK(ggml_type_supported(type), "dequantize: ggml type {} is not supported (supported: F32, F16, BF16, "
               "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K)", tr.name);
  KVPACK_CHECK(n >= 0 && n % tr.block_size == 0,
               "dequantize: {} row of {} elements is not a multiple of the block size {}", tr.name, n, tr.block_size);
  const int64_t nb = n / tr.block_size;
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16:
      return run_blocks<uint16_t>(src, dst, nb, 1, deq_f16);
    case GgmlType::BF16:
      return run_blocks<uint16_t>(src, dst, nb, 1, deq_bf16);
    case GgmlType::Q4_0: return run_blocks<block_q4_0>(src, dst, nb, QK, deq_q4_0);
    case GgmlType::Q4_1: return run_blocks<block_q4_1>(src, dst, nb, QK, deq_q4_1);
    case GgmlType::Q5_0: return run_blocks<block_q5_0>(src, dst, nb, QK, deq_q5_0);
    case GgmlType::Q5_1: return run_blocks<block_q5_1>(src, dst, nb, QK, deq_q5_1);
    case GgmlType::Q8_0: return run_blocks<block_q8_0>(src, dst, nb, QK, deq_q8_0);
    case GgmlType::Q2_K: return run_blocks<block_q2_K>(src, dst, nb, QK_K, deq_q2_K);
    case GgmlType::Q3_K: return run_blocks<block_q3_K>(src, dst, nb, QK_K, deq_q3_K);
    case GgmlType::Q4_K: return run_blocks<block_q4_K>(src, dst, nb, QK_K, deq_q4_K);
    case GgmlType::Q5_K: return run_blocks<block_q5_K>(src, dst, nb, QK_K, deq_q5_K);
    case GgmlType::Q6_K: return run_blocks<block_q6_K>(src, dst, nb, QK_K, deq_q6_K);
    case GgmlType::Q8_K: return run_blocks<block_q8_K>(src, dst, nb, QK_K, deq_q8_K);
    default:
      break;
  }
  fail("dequantize: ggml type {} is not supported", tr.name);
}

}  // namespace kvpack
