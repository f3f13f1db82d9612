// CPU reference of the paged KV cache: layout, page-table views, the reference write path (byte-exact oracle for
// write_kv) and fp64 reference decode attention over the dequantised cache (oracle for run_decode).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kvpack/bf16.h"
#include "kvpack/block/layout.h"
#include "kvpack/block/q_lanes.h"
#include "kvpack/decode.h"
#include "kvpack/error.h"
#include "kvpack/paged.h"
#include "kvpack/parallel.h"

namespace kvpack {
namespace {

struct TokenBytes {
  int code = 0;
  int meta = 0;
};

// Bytes per token vector of each format the paged cache supports. One table answers both "supported?" and "how
// big" (STYLE: one dispatch point per axis).
// Sizes come from the formats' block table (include/kvpack/block/layout.h): every format is in the paged cache.
bool token_bytes(Format f, int head_dim, TokenBytes& tb) {
  const auto bl = block::block_layout(f, head_dim);
  tb = {bl.code_bytes, bl.meta_bytes};
  return bl.code_bytes > 0;
}

const block::QHeadTable& q_table(const FormatParams& p, bool is_v, Format f) {
  const block::QHeadTable& t = is_v ? p.qv : p.qk;
  KVPACK_CHECK(t.valid(), "paged cache: format '{}' needs its {} parameters (FormatParams::{}) and got none",
               format_name(f), is_v ? "V" : "K", is_v ? "qv" : "qk");
  return t;
}

float head_scale(const FormatParams& p, int head, bool is_v) {
  const float* s = is_v ? p.v_scale : p.k_scale;
  return s ? s[head] : 1.0f;
}

}  // namespace

bool paged_format_supported(Format format) {
  TokenBytes tb;
  return token_bytes(format, 64, tb);
}

PagedLayout make_paged_layout(Format format, int page_size, int num_kv_heads, int head_dim) {
  KVPACK_CHECK(page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128,
               "paged layout: page_size {} is not one of 16, 32, 64, 128", page_size);
  KVPACK_CHECK(head_dim == 64 || head_dim == 128, "paged layout: head_dim {} is not 64 or 128", head_dim);
  KVPACK_CHECK(num_kv_heads >= 1 && num_kv_heads <= 1024, "paged layout: num_kv_heads {} out of range [1, 1024]",
               num_kv_heads);
  TokenBytes tb;
  KVPACK_CHECK(token_bytes(format, head_dim, tb), "paged layout: format '{}' is not supported by the paged cache yet",
               format_name(format));
  PagedLayout l;
  l.format = format;
  l.page_size = page_size;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.code_bytes_per_token = tb.code;
  l.meta_bytes_per_token = tb.meta;
  if (lane_bits_x2(format)) {  // the lane layout: a token's codes and scale byte together, in units of 16 tokens
    l.lanes = true;
    l.code_bytes_per_token = tb.code + tb.meta;
    l.meta_bytes_per_token = 0;
  }
  int64_t raw = int64_t{page_size} * (tb.code + tb.meta);
  l.head_block_bytes = (raw + 15) / 16 * 16;  // 16-byte aligned so every load can be 16 bytes wide
  return l;
}

PageTableView view_of(const CsrPageTable& t) {
  PageTableView v;
  v.pages = t.indices;
  v.row_start = t.indptr;
  v.last_page_len = t.last_page_len;
  v.batch = t.batch;
  return v;
}

PageTableView view_of(const BlockTable& t) {
  PageTableView v;
  v.pages = t.block_table;
  v.seq_lens = t.seq_lens;
  v.row_stride = t.max_blocks_per_seq;
  v.batch = t.batch;
  return v;
}

int64_t seq_len_of(const PageTableView& v, int page_size, int b) {
  if (v.seq_lens) return v.seq_lens[b];
  int64_t n = v.row_start[b + 1] - v.row_start[b];
  return n <= 0 ? 0 : (n - 1) * page_size + v.last_page_len[b];
}

int32_t page_of(const PageTableView& v, int b, int64_t page_in_seq) {
  int64_t row = v.row_start ? int64_t{v.row_start[b]} : int64_t{b} * v.row_stride;
  return v.pages[row + page_in_seq];
}

std::vector<int32_t> slots_from_csr(const CsrPageTable& t, int page_size, const std::vector<int32_t>& seq_of_token,
                                    const std::vector<int64_t>& position_of_token) {
  KVPACK_CHECK(seq_of_token.size() == position_of_token.size(), "slots_from_csr: {} sequence ids but {} positions",
               seq_of_token.size(), position_of_token.size());
  KVPACK_CHECK(t.indptr && t.indices, "slots_from_csr: null page table");
  std::vector<int32_t> slots(seq_of_token.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    int b = seq_of_token[i];
    int64_t p = position_of_token[i];
    if (b < 0 || p < 0) {
      slots[i] = -1;
      continue;
    }
    KVPACK_CHECK(b < t.batch, "slots_from_csr: token {} names sequence {} of a batch of {}", i, b, t.batch);
    int64_t npages = t.indptr[b + 1] - t.indptr[b];
    KVPACK_CHECK(p / page_size < npages, "slots_from_csr: token {} position {} is beyond sequence {}'s {} pages", i, p,
                 b, npages);
    slots[i] = t.indices[t.indptr[b] + p / page_size] * page_size + static_cast<int32_t>(p % page_size);
  }
  return slots;
}

namespace {
// The lane layout (q4, q3.5, q3): the unit holding token `off` of a (page, head) block, and the token's index in it.
template <class Pool>
Pool* lane_unit(const PagedLayout& l, Pool* pool, int64_t page, int head, int off) {
  return pool + page * l.page_bytes() + head * l.head_block_bytes + int64_t{off / 16} * 16 * l.code_bytes_per_token;
}
// fn.template operator()<Block, Lanes>() with the block core and lane layout of (format, D, K|V).
template <int D, class Fn>
void with_lanes(Format f, bool is_v, Fn&& fn) {
  if (f == Format::q4) {
    if (is_v) fn.template operator()<block::Q4Block<D>, block::Q4Lanes<D, true>>();
    else fn.template operator()<block::Q4Block<D>, block::Q4Lanes<D, false>>();
  } else if (f == Format::q3_5) {
    if (is_v) fn.template operator()<block::Q35Block<D>, block::Q35Lanes<D, true>>();
    else fn.template operator()<block::Q35Block<D>, block::Q35Lanes<D, false>>();
  } else {
    if (is_v) fn.template operator()<block::Q3Block<D>, block::Q3Lanes<D, true>>();
    else fn.template operator()<block::Q3Block<D>, block::Q3Lanes<D, false>>();
  }
}
template <int D>
void lane_store(Format f, const block::QParams& p, bool is_v, const uint8_t* codes, uint8_t e, uint8_t* unit, int t) {
  with_lanes<D>(f, is_v, [&]<class Blk, class L>() {
    int k[D];
    Blk::unpack(p, codes, k);
    L::store_token(k, e, t, unit);
  });
}
template <int D>
void lane_load(Format f, const block::QParams& p, bool is_v, const uint8_t* unit, int t, uint8_t* codes, uint8_t& e) {
  with_lanes<D>(f, is_v, [&]<class Blk, class L>() {
    int k[D];
    L::load_token(unit, t, k, e);
    Blk::pack(p, k, codes);
  });
}

uint8_t* token_codes(const PagedLayout& l, uint8_t* pool, int64_t page, int head, int off) {
  return pool + page * l.page_bytes() + head * l.head_block_bytes + int64_t{off} * l.code_bytes_per_token;
}
const uint8_t* token_codes(const PagedLayout& l, const uint8_t* pool, int64_t page, int head, int off) {
  return pool + page * l.page_bytes() + head * l.head_block_bytes + int64_t{off} * l.code_bytes_per_token;
}

template <int D>
void encode_token_ref_d(const PagedLayout& l, const float* x, uint8_t* codes, uint8_t* meta, int head, bool is_v,
                        const FormatParams& p) {
  switch (l.format) {
    case Format::fp8: block::Fp8Block<D>::encode(x, head_scale(p, head, is_v), codes); return;
    case Format::int4: block::Int4Block<D, false>::encode(x, codes, meta); return;
    case Format::int4h: block::Int4Block<D, true>::encode(x, codes, meta); return;
    case Format::q4: block::Q4Block<D>::encode(q_table(p, is_v, l.format).head(head, D), x, codes, meta); return;
    case Format::q3_5: block::Q35Block<D>::encode(q_table(p, is_v, l.format).head(head, D), x, codes, meta); return;
    case Format::q3: block::Q3Block<D>::encode(q_table(p, is_v, l.format).head(head, D), x, codes, meta); return;
    default: fail("paged_write_ref: format '{}' not supported", format_name(l.format));
  }
}

void encode_token_ref(const PagedLayout& l, const uint16_t* x, uint8_t* codes, uint8_t* meta, int head, bool is_v,
                      const FormatParams& p) {
  float xf[128];
  for (int d = 0; d < l.head_dim; ++d) xf[d] = bf16_to_f32(x[d]);
  switch (l.format) {
    case Format::bf16:
      std::memcpy(codes, x, size_t(l.head_dim) * 2);
      return;
    case Format::fp8:
    case Format::int4:
    case Format::int4h:
    case Format::q4:
    case Format::q3_5:
    case Format::q3:
      if (l.head_dim == 64) encode_token_ref_d<64>(l, xf, codes, meta, head, is_v, p);
      else encode_token_ref_d<128>(l, xf, codes, meta, head, is_v, p);
      return;
    default:
      fail("paged_write_ref: format '{}' not supported", format_name(l.format));
  }
}
}  // namespace

void paged_write_ref(const PagedLayout& l, uint8_t* k_pool, uint8_t* v_pool, int64_t num_pages, const uint16_t* k,
                     const uint16_t* v, const int32_t* slots, int num_tokens, const FormatParams& params) {
  KVPACK_CHECK(k_pool && v_pool && k && v && (slots || num_tokens == 0), "paged_write_ref: null pointer argument");
  const int64_t cap = num_pages * l.page_size;
  const int64_t stride = int64_t{l.num_kv_heads} * l.head_dim;
  // Every slot is checked before anything is written (the first bad one is reported).
  for (int i = 0; i < num_tokens; ++i)
    KVPACK_CHECK(slots[i] < cap, "paged_write_ref: slot_mapping[{}] = {} is outside the pool of {} pages x {} tokens",
                 i, slots[i], num_pages, l.page_size);
  auto write_token = [&](int64_t i) {
    const int64_t s = slots[i];
    if (s < 0) return;
    const int64_t page = s / l.page_size;
    const int off = static_cast<int>(s % l.page_size);
    for (int h = 0; h < l.num_kv_heads; ++h) {
      for (int kv = 0; kv < 2; ++kv) {
        uint8_t* pool = kv ? v_pool : k_pool;
        const uint16_t* x = (kv ? v : k) + i * stride + int64_t{h} * l.head_dim;
        if (l.lanes) {  // the logical block, then its halves and bytes into the unit
          uint8_t codes[64], e = 0;
          encode_token_ref(l, x, codes, &e, h, kv == 1, params);
          const block::QParams qp = q_table(params, kv == 1, l.format).head(h, l.head_dim);
          uint8_t* unit = lane_unit(l, pool, page, h, off);
          if (l.head_dim == 64) lane_store<64>(l.format, qp, kv == 1, codes, e, unit, off % 16);
          else lane_store<128>(l.format, qp, kv == 1, codes, e, unit, off % 16);
          continue;
        }
        uint8_t* codes = token_codes(l, pool, page, h, off);
        uint8_t* meta = pool + page * l.page_bytes() + h * l.head_block_bytes + l.meta_offset() +
                        int64_t{off} * l.meta_bytes_per_token;
        encode_token_ref(l, x, codes, meta, h, kv == 1, params);
      }
    }
  };
  // A token writes only bytes of its own slot (its codes and metadata; in the lane layout its own halves, bytes and
  // nibble bytes of the unit, block/q_lanes.h), so tokens in distinct slots are encoded on all threads with the
  // sequential loop's bytes. A repeated slot (the last write wins) keeps the order: one thread.
  constexpr int kChunk = 64;
  bool in_order = num_tokens <= kChunk;  // one chunk, or a repeated slot
  if (!in_order) {
    std::vector<int32_t> used;
    used.reserve(size_t(num_tokens));
    for (int i = 0; i < num_tokens; ++i)
      if (slots[i] >= 0) used.push_back(slots[i]);
    std::sort(used.begin(), used.end());
    in_order = std::adjacent_find(used.begin(), used.end()) != used.end();
  }
  if (in_order) {
    for (int i = 0; i < num_tokens; ++i) write_token(i);
    return;
  }
  parallel_items((num_tokens + kChunk - 1) / kChunk, hardware_threads(), [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min<int64_t>(num_tokens, (c + 1) * kChunk); ++i) write_token(i);
  });
}

namespace {
template <int D>
void dequant_d(const PagedLayout& l, const uint8_t* codes, const uint8_t* meta, int h, bool is_v,
               const FormatParams& p, float* out, bool stored_basis) {
  switch (l.format) {
    case Format::fp8: block::Fp8Block<D>::decode(codes, head_scale(p, h, is_v), out); return;
    case Format::int4: block::Int4Block<D, false>::decode(codes, meta, out); return;
    case Format::int4h:
      if (stored_basis) block::Int4Block<D, true>::decode_rotated(codes, meta, out);
      else block::Int4Block<D, true>::decode(codes, meta, out);
      return;
    // q formats: always the model's basis (the kernels' dequantiser returns it too).
    case Format::q4: block::Q4Block<D>::decode(q_table(p, is_v, l.format).head(h, D), codes, meta, out); return;
    case Format::q3_5: block::Q35Block<D>::decode(q_table(p, is_v, l.format).head(h, D), codes, meta, out); return;
    case Format::q3: block::Q3Block<D>::decode(q_table(p, is_v, l.format).head(h, D), codes, meta, out); return;
    default: fail("dequant_token_ref: format '{}' not supported", format_name(l.format));
  }
}
}  // namespace

void dequant_token_ref(const PagedLayout& l, const uint8_t* pool, int64_t page, int h, int off, bool is_v,
                       const FormatParams& p, float* out, bool stored_basis) {
  if (l.lanes) {  // the token's halves and bytes back into its logical block, then the block core's decoder
    uint8_t codes[64], e = 0;
    const block::QParams qp = q_table(p, is_v, l.format).head(h, l.head_dim);
    const uint8_t* unit = lane_unit(l, pool, page, h, off);
    if (l.head_dim == 64) {
      lane_load<64>(l.format, qp, is_v, unit, off % 16, codes, e);
      dequant_d<64>(l, codes, &e, h, is_v, p, out, false);
    } else {
      lane_load<128>(l.format, qp, is_v, unit, off % 16, codes, e);
      dequant_d<128>(l, codes, &e, h, is_v, p, out, false);
    }
    return;
  }
  const uint8_t* codes = token_codes(l, pool, page, h, off);
  const uint8_t* meta = pool + page * l.page_bytes() + h * l.head_block_bytes + l.meta_offset() +
                        int64_t{off} * l.meta_bytes_per_token;
  switch (l.format) {
    case Format::fp8:
    case Format::int4:
    case Format::int4h:
    case Format::q4:
    case Format::q3_5:
    case Format::q3:
      if (l.head_dim == 64) dequant_d<64>(l, codes, meta, h, is_v, p, out, stored_basis);
      else dequant_d<128>(l, codes, meta, h, is_v, p, out, stored_basis);
      return;
    case Format::bf16: {
      for (int d = 0; d < l.head_dim; ++d) {
        uint16_t b;
        std::memcpy(&b, codes + 2 * d, 2);
        out[d] = bf16_to_f32(b);
      }
      return;
    }
    default:
      fail("dequant_token_ref: format '{}' not supported", format_name(l.format));
  }
}

void decode_attention_ref(const PagedLayout& l, const uint8_t* k_pool, const uint8_t* v_pool, const PageTableView& t,
                          const uint16_t* q, int num_qo_heads, double sm_scale, const FormatParams& params,
                          double* out, double* lse, bool fp32, const SinkView* sinks) {
  const int D = l.head_dim;
  KVPACK_CHECK(num_qo_heads % l.num_kv_heads == 0, "decode_attention_ref: {} query heads not a multiple of {} kv heads",
               num_qo_heads, l.num_kv_heads);
  const int G = num_qo_heads / l.num_kv_heads;
  // On all threads: a (sequence, kv head)'s tokens are dequantised in chunks, then its query heads run one per
  // thread. Each value is computed in the same order whatever the thread count.
  const int threads = hardware_threads();
  for (int b = 0; b < t.batch; ++b) {
    const int64_t n = seq_len_of(t, l.page_size, b);
    for (int h = 0; h < l.num_kv_heads; ++h) {
      // Dequantise this (sequence, head) once.
      std::vector<float> K(size_t(n) * D), V(size_t(n) * D);
      const int n_sink_fmt = format_info(l.format).sink_tokens;
      const bool has_sinks = n_sink_fmt > 0 && sinks && sinks->rows && sinks->rows[b] >= 0 &&
                             sinks->rows[b] < sinks->num_rows;
      constexpr int64_t kChunk = 256;
      parallel_items((n + kChunk - 1) / kChunk, threads, [&](int64_t c) {
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
          if (has_sinks && i < n_sink_fmt) {  // attention sink: stored exactly
            const int64_t at = ((int64_t{sinks->rows[b]} * n_sink_fmt + i) * l.num_kv_heads + h) * D;
            for (int d = 0; d < D; ++d) {
              K[i * D + d] = bf16_to_f32(sinks->k[at + d]);
              V[i * D + d] = bf16_to_f32(sinks->v[at + d]);
            }
            continue;
          }
          int64_t page = page_of(t, b, i / l.page_size);
          dequant_token_ref(l, k_pool, page, h, static_cast<int>(i % l.page_size), false, params, &K[i * D]);
          dequant_token_ref(l, v_pool, page, h, static_cast<int>(i % l.page_size), true, params, &V[i * D]);
        }
      });
      parallel_items(G, threads, [&](int64_t gi) {
        const int g = static_cast<int>(gi);
        const int qh = h * G + g;
        const uint16_t* qv = q + (int64_t{b} * num_qo_heads + qh) * D;
        double* o = out + (int64_t{b} * num_qo_heads + qh) * D;
        if (n == 0) {
          for (int d = 0; d < D; ++d) o[d] = 0;
          if (lse) lse[int64_t{b} * num_qo_heads + qh] = -std::numeric_limits<double>::infinity();
          return;
        }
        if (!fp32) {
          std::vector<double> s(n);
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t i = 0; i < n; ++i) {
            double acc = 0;
            for (int d = 0; d < D; ++d) acc += double(bf16_to_f32(qv[d])) * K[i * D + d];
            s[i] = acc * sm_scale;
            m = std::max(m, s[i]);
          }
          double sum = 0;
          for (int64_t i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - m));
          for (int d = 0; d < D; ++d) {
            double acc = 0;
            for (int64_t i = 0; i < n; ++i) acc += s[i] * V[i * D + d];
            o[d] = acc / sum;
          }
          if (lse) lse[int64_t{b} * num_qo_heads + qh] = m + std::log(sum);
        } else {
          // Plain fp32: what a straightforward same-precision implementation computes (the tests' yardstick).
          std::vector<float> s(n);
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t i = 0; i < n; ++i) {
            float acc = 0;
            for (int d = 0; d < D; ++d) acc += bf16_to_f32(qv[d]) * K[i * D + d];
            s[i] = acc * static_cast<float>(sm_scale);
            m = std::max(m, s[i]);
          }
          float sum = 0;
          for (int64_t i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - m));
          for (int d = 0; d < D; ++d) {
            float acc = 0;
            for (int64_t i = 0; i < n; ++i) acc += s[i] * V[i * D + d];
            o[d] = round_bf16(acc / sum);  // the output is bf16 like the kernel's
          }
          if (lse) lse[int64_t{b} * num_qo_heads + qh] = m + std::log(sum);
        }
      });
    }
  }
}

}  // namespace kvpack
