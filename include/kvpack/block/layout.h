// Block sizes of every format as compile-time functions of (format, head_dim): the one table the paged cache,
// kernels and codecs agree on. A block is one token's head vector for one kv head, K or V.
#pragma once
#include "kvpack/block/fp8.h"
#include "kvpack/block/int4.h"
#include "kvpack/block/qx.h"
#include "kvpack/formats.h"

namespace kvpack::block {

struct BlockLayout {
  int code_bytes;  // packed codes of the head vector
  int meta_bytes;  // per-token metadata (int4: fp16 group scales; q*: the scale byte); stored after the codes
  constexpr int bytes() const { return code_bytes + meta_bytes; }
};

// {0, 0} for unsupported head dims (only 64 and 128 are supported).
constexpr BlockLayout block_layout(Format f, int head_dim) {
  if (head_dim != 64 && head_dim != 128) return {0, 0};
  switch (f) {
    case Format::bf16: return {2 * head_dim, 0};
    case Format::fp8: return {head_dim, 0};
    case Format::int4:
    case Format::int4h: return {head_dim / 2, head_dim / 16};
    case Format::q4: return {q_code_bytes(8, head_dim), 1};
    case Format::q3_5: return {q_code_bytes(7, head_dim), 1};
    case Format::q3: return {q_code_bytes(6, head_dim), 1};
  }
  return {0, 0};
}

static_assert(block_layout(Format::int4, 64).bytes() == Int4Block<64, false>::kBytes);
static_assert(block_layout(Format::q4, 128).bytes() == Q4Block<128>::kBytes);
static_assert(block_layout(Format::q3_5, 64).bytes() == Q35Block<64>::kBytes);
static_assert(block_layout(Format::q3, 128).bytes() == Q3Block<128>::kBytes);
static_assert(block_layout(Format::fp8, 128).bytes() == Fp8Block<128>::kBytes);

}  // namespace kvpack::block
