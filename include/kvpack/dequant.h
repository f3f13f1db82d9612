// ggml tensor types and their CPU dequantizers, bit-exact with ggml's reference `dequantize_row_*` as computed
// without fused multiply-add (which is also what the Python `gguf` package's numpy dequantizers compute).
//
// The block layouts are the ones in llama.cpp's ggml-common.h; docs/MODEL_FILES.md describes every byte.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvpack {

// Values are ggml's `enum ggml_type` ids as stored in GGUF tensor infos. The first group are the types kvpack
// can dequantize (see ggml_type_supported); the rest are known so that files holding them can still be parsed,
// sized and inspected.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
  // Known to ggml, parsed and sized by kvpack, not dequantized.
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// "Q4_K", "BF16", ...; "unknown" for an id that is not a GgmlType enumerator.
std::string_view ggml_type_name(GgmlType t);
// Whether `id` is one of the ggml types listed above (unknown ids and ggml's removed ids 4, 5 are not).
bool ggml_type_known(uint32_t id);
// Whether dequantize_row supports the type.
bool ggml_type_supported(GgmlType t);
// Parses a name as printed by ggml_type_name ("q4_k" and "Q4_K" both work).
std::optional<GgmlType> parse_ggml_type(std::string_view name);

// Elements per block and bytes per block (1 and sizeof(element) for the plain types). Throw kvpack::Error for an
// unknown type.
int64_t ggml_block_size(GgmlType t);
int64_t ggml_type_size(GgmlType t);
// Bytes of a row of n elements; throws if n is not a multiple of the block size.
uint64_t ggml_row_size(GgmlType t, int64_t n);

// One row of n elements (n a multiple of the type's block size) from `src` (ggml_row_size(type, n) bytes, any
// alignment) into dst[0..n). Bit-exact with ggml (no FMA contraction). Throws kvpack::Error for an unsupported type
// or a bad n.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace kvpack
