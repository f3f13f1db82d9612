// Paged KV cache: layout of one (layer, K or V) page pool, and the two page-table views (FlashInfer CSR and vLLM
// block table + slot mapping). Byte-by-byte layout: docs/FORMATS.md, section "Paged cache layout".
//
// A pool is [num_pages][num_kv_heads][head_block_bytes] ("HND"): every (page, kv head) block is contiguous so a
// decode CTA that owns one kv head streams >= 256-byte runs (a 64-byte gather reaches only ~half the bandwidth).
// Inside a head block: first the codes of page_size tokens (token-major, code_bytes_per_token each), then the
// per-token metadata of the same tokens (meta_bytes_per_token each), then zero padding to 16 bytes. Codes and
// metadata are kept apart so the kernel's 16-byte loads of codes never straddle a metadata byte. q4, q3.5 and q3 instead
// store units of 16 tokens in their lane layout (PagedLayout::lanes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvpack/block/qx.h"
#include "kvpack/formats.h"

namespace kvpack {

struct PagedLayout {
  Format format = Format::bf16;
  int page_size = 16;           // tokens per page: 16, 32, 64 or 128
  int num_kv_heads = 0;
  int head_dim = 0;             // 64 or 128
  int code_bytes_per_token = 0; // packed codes of one token's head vector
  int meta_bytes_per_token = 0; // per-token metadata (scales) of one token's head vector
  int64_t head_block_bytes = 0; // bytes of one (page, kv head) block, a multiple of 16
  // q4, q3.5, q3: the block holds page_size / 16 units of 16 tokens in the lane layout (include/kvpack/block/q_lanes.h),
  // codes and scale byte together: code_bytes_per_token = B head_dim / 8 (B = 4, 3.5, 3), meta_bytes_per_token = 0.
  bool lanes = false;
  int64_t page_bytes() const { return head_block_bytes * num_kv_heads; }
  int64_t meta_offset() const { return int64_t{page_size} * code_bytes_per_token; }
};

// Validates (page_size in {16,32,64,128}, head_dim in {64,128}, num_kv_heads >= 1, format supported by the paged
// cache) and throws kvpack::Error naming the bad field.
PagedLayout make_paged_layout(Format format, int page_size, int num_kv_heads, int head_dim);
// Whether the paged kernels support this format (the answer and the dispatch come from the same table).
bool paged_format_supported(Format format);

// FlashInfer's CSR view of the page table (all device or all host pointers, int32):
//   indptr[batch + 1], indices[indptr[batch]], last_page_len[batch] (1..page_size).
// Sequence b owns pages indices[indptr[b] .. indptr[b+1]) and holds
//   (indptr[b+1] - indptr[b] - 1) * page_size + last_page_len[b] tokens (0 tokens when it owns no page).
struct CsrPageTable {
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
  int batch = 0;
};

// vLLM's view: block_table[batch][max_blocks_per_seq] (row-major), seq_lens[batch]. Writes use slot_mapping:
// slot = page * page_size + offset in page; a negative slot is padding and is skipped.
struct BlockTable {
  const int32_t* block_table = nullptr;
  const int32_t* seq_lens = nullptr;
  int max_blocks_per_seq = 0;
  int batch = 0;
};

// The one view the kernels read (both public views map onto it without copying): sequence b's j-th page is
// pages[row(b) + j] with row(b) = row_start ? row_start[b] : b * row_stride; its length is seq_lens[b] when set,
// else derived from row_start and last_page_len as in the CSR view.
struct PageTableView {
  const int32_t* pages = nullptr;
  const int32_t* row_start = nullptr;     // CSR indptr, or null
  const int32_t* seq_lens = nullptr;      // vLLM seq_lens, or null
  const int32_t* last_page_len = nullptr; // CSR last_page_len, or null
  int row_stride = 0;                     // vLLM max_blocks_per_seq
  int batch = 0;
};
PageTableView view_of(const CsrPageTable& t);
PageTableView view_of(const BlockTable& t);

// Host-side helpers (pointers in the view must be host pointers here).
int64_t seq_len_of(const PageTableView& v, int page_size, int b);
int32_t page_of(const PageTableView& v, int b, int64_t page_in_seq);

// Per-layer format parameters. Device pointers when passed to the CUDA entry points (decode.h), host pointers
// when passed to the CPU reference below. Which fields a format reads is listed per field.
struct FormatParams {
  const float* k_scale = nullptr;  // fp8: [num_kv_heads] dequantisation multiplier of K codes (null = 1)
  const float* v_scale = nullptr;  // fp8: [num_kv_heads] dequantisation multiplier of V codes (null = 1)
  block::QHeadTable qk, qv;        // q4/q3.5/q3: this layer's calibrated transforms, steps and bits, K and V
};

// Attention sinks of the formats that keep them (format_info(f).sink_tokens > 0: q4/q3.5/q3): positions
// 0 .. sink_tokens-1 of every sequence are also stored exactly, in bf16, in a sink pool per K and V:
//   [num_rows][sink_tokens][num_kv_heads][head_dim] bf16; sequence b owns row rows[b] (< 0: no sink row, its first
//   tokens are read from their codes like any other token).
// Writes address it with a sink slot per token: row * sink_tokens + position (< 0: not a sink token).
struct SinkView {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const int32_t* rows = nullptr;  // [batch]
  int64_t num_rows = 0;
};

// Owning host copy of q-format parameters for num_heads kv heads (one layer, K or V), arrays [heads][...].
struct QHostParams {
  Format format = Format::q4;
  int num_heads = 0, head_dim = 0;
  std::vector<float> mean, fwd, inv, step, inv_step, rms_weight;
  std::vector<uint8_t> group_bits;
  block::QHeadTable table() const;  // host pointers into this object, head_stride 1
  // The table with every array passed through place(vector) -> pointer (e.g. a device copy of it), head_stride 1.
  template <class Place>
  block::QHeadTable table_via(Place&& place) const {
    return block::QHeadTable::from(block::QParams{place(mean), place(fwd), place(inv), place(step), place(inv_step),
                                                  place(rms_weight), place(group_bits)});
  }
};
// Plausible synthetic parameters (tests, benchmarks) of K (is_v false) or V: a random orthogonal transform per head
// (G = F^T), a bit allocation filling the format's code bytes (q4: its fixed pattern; q3.5, q3: random, some 0-bit
// groups), steps of the optimal uniform quantiser of a unit Gaussian at each channel's bits, equal RMS weights.
// Deterministic in seed.
QHostParams synthetic_q_params(Format f, bool is_v, int num_heads, int head_dim, uint64_t seed);

// ---- CPU reference of the paged cache (host memory): the oracle for the CUDA kernels.
// Encodes tokens into their slots exactly as write_kv() must (byte for byte). k, v: [num_tokens][num_kv_heads]
// [head_dim] bf16; slots[num_tokens] (< 0 skipped). Throws kvpack::Error on a slot outside [0, num_pages*page_size),
// before anything is written. Runs on all hardware threads; a repeated slot keeps the order (the last write wins).
void paged_write_ref(const PagedLayout& layout, uint8_t* k_pool, uint8_t* v_pool, int64_t num_pages, const uint16_t* k,
                     const uint16_t* v, const int32_t* slots, int num_tokens, const FormatParams& params);
// Decodes one stored token vector (page, kv head, offset in page) to fp32: out[head_dim], in the model's basis, or
// with stored_basis = true in the basis the codes live in (int4h: Hadamard-rotated; what dequantize_pages returns).
void dequant_token_ref(const PagedLayout& layout, const uint8_t* pool, int64_t page, int kv_head, int offset, bool is_v,
                       const FormatParams& params, float* out, bool stored_basis = false);
// fp64 attention of one query token per sequence over the dequantised cache (host view and pools).
// q: [batch][num_qo_heads][head_dim] bf16; out: [batch][num_qo_heads][head_dim]; lse: [batch][num_qo_heads] (ln).
// precision_fp32 = true computes the same thing in plain fp32 (the "same-precision" yardstick of the tests).
// sinks (host pointers, may be null): formats with sink tokens read positions < sink_tokens from the sink pool.
// Runs on all hardware threads, with the same values for any thread count.
void decode_attention_ref(const PagedLayout& layout, const uint8_t* k_pool, const uint8_t* v_pool,
                          const PageTableView& table, const uint16_t* q, int num_qo_heads, double sm_scale,
                          const FormatParams& params, double* out, double* lse, bool precision_fp32 = false,
                          const SinkView* sinks = nullptr);

}  // namespace kvpack
