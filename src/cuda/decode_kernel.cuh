// Decode attention kernel template (included by one .cu per format so the device build compiles them in parallel).
// Decode attention over the paged cache: one query token per sequence, GQA, split-KV with a deterministic
// in-kernel merge (a fixed two-level tree: groups of 16 chunk partials folded in chunk order by the CTA that finishes
// the group's last chunk, then the groups folded in order by the last CTA of the (sequence, kv head)).
//
// Structure of one CTA (256 threads, one kv head of one sequence, chunks split, split+S, split+2S, ...):
//   a ring of `stages` tiles (each tile = kTile tokens of K or of V, codes then metadata; on sm_90 filled by bulk
//   copies that warp 0 issues, one per page run, on sm_80 by cp.async) streams K tiles then V tiles of every chunk;
//   per chunk: scores for all its tokens (tensor cores for bf16/fp8, an octet-per-thread FMA loop for
//   int4/int4h), an exact chunk softmax (max, exp2, sum), then P.V with fp32 accumulators (tensor cores except
//   int4/int4h), and the chunk's partial (m, l, acc) goes to the workspace. Per-chunk arithmetic never depends on
//   the plan, and the fold order is fixed, so results are bitwise identical across plans, batches and runs.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>

#include "bulk_copy.cuh"
#include "decode_internal.cuh"
#include "format_policy.cuh"
#include "kvpack/decode.h"
#include "kvpack/error.h"

namespace kvpack {
namespace cuda_detail {

// 8 warps per CTA: the v1 kernel with 4 warps was latency-bound at ~20% of the read bandwidth (bench/NOTES.md).
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxStages = 8;

__host__ __device__ constexpr int tile_tokens_for(int code_bytes) {
  // ~16 KB of codes per tile: 4 stages give 64 KB in flight per SM, what a streaming read needs on an H200.
  int t = 512;
  while (t > 32 && t * code_bytes > 16384) t /= 2;
  return t;
}

template <class P, int D>
struct Geo {
  static constexpr int kCode = P::code_bytes(D);
  static constexpr int kMeta = P::meta_bytes(D);
  static constexpr int kOct = D / 8;
  static constexpr int kTile = tile_tokens_for(kCode);
  static constexpr int kTileCodeBytes = kTile * kCode;
  static constexpr int kTileMetaBytes = (kTile * kMeta + 15) / 16 * 16;
  static constexpr int kStageBytes = kTileCodeBytes + kTileMetaBytes;
  // Score phase: one octet per thread (q for it lives in registers), kOct threads per token, shuffle reduction.
  static constexpr int kTPT = kOct;
  static constexpr int kTokPerPass = kThreads / kTPT;
  static constexpr int kSlices = kThreads / kOct;     // token slices in the P.V phase
  static constexpr int kSlicesPerWarp = 32 / kOct;    // reduced with shuffles before shared memory
  // Codes are loaded in 16-byte pieces, whole pieces per token (the page-run copies below also served the q formats'
  // 27-63-byte token-major codes until 2026-12-06).
  static_assert(kCode % 16 == 0, "codes must load in 16-byte pieces");
  static_assert(kMeta == 0 || 16 % (kMeta > 0 ? kMeta : 1) == 0 || kMeta % 16 == 0, "metadata pieces must tile 16 bytes");
  static_assert(kChunkTokens % kTile == 0 && kTile % kTokPerPass == 0, "tile must divide the chunk");
};

// v17 warp pipeline (sm_90, tensor-core formats): warp w of the CTA owns tokens [64 w, 64 w + 64) of every chunk
// and streams them as 16-token units (a page run never crosses a unit: pages hold >= 16 tokens) through its own
// ring of `depth` units carved from the stage buffers (depth = stages x stage bytes / (8 x unit), at most 16).
template <class P, int D>
struct WarpPipeGeo {
  using Gm = Geo<P, D>;
  static constexpr int kSubTok = kChunkTokens / kWarps;  // 64
  static constexpr int kSteps = kSubTok / 16;
  static constexpr int kUnitCode = 16 * Gm::kCode;
  static constexpr int kUnitMeta = (16 * Gm::kMeta + 15) / 16 * 16;
  static constexpr int kUnit = kUnitCode + kUnitMeta;
  static_assert(kUnitCode % 16 == 0, "a unit's codes must be whole 16-byte pieces");
  static_assert(2 * Gm::kStageBytes >= kWarps * kUnit, "two stages must hold one unit per warp");
};
constexpr int kMaxDepth = 16;
// v79: the warp pipeline's scores swap-AB (16 K rows as A, the heads as N); 0 = v17-v78's (the query as A). A
// different, fixed, summation order of each warp's softmax sum, so the last bits of bf16 / fp8 differ from 0's.
#ifndef KVPACK_PIPE_SWAP_K
#define KVPACK_PIPE_SWAP_K 1
#endif
// v80: the warp pipeline's per-chunk merge of the 8 warp partials without CTA barriers. Every thread arrives on an
// mbarrier once its warp's partial is in shared memory; one warp (chunk index mod 8, rotating) waits for all 256
// arrivals, merges (the same arithmetic in the same warp order: the same bits) and stores the chunk's partial, then
// arrives on a second mbarrier that a warp waits on before it overwrites its partial at the next chunk. The other 7
// warps go straight on to the next chunk. -1 (the default): bf16 only, where it measured 1.014-1.041x at 32q/8kv on
// an H100; fp8 lost there at 128k (0.94-0.99x; bench/NOTES.md v80). 1: both formats, 0: neither (v17-v79's two
// __syncthreads per chunk).
#ifndef KVPACK_PIPE_ASYNC_MERGE
#define KVPACK_PIPE_ASYNC_MERGE -1
#endif
template <class P>
inline constexpr bool kWarpPipeFormat = P::kMmaK && P::kMmaV;

template <int GMAX>
__host__ __device__ constexpr size_t smem_extra_bytes(int D) {
  // q_s[GMAX][D] + p_s[kChunk][GMAX] + red_s[kWarps][GMAX][D], all fp32
  return sizeof(float) * (size_t(GMAX) * D + size_t(kChunkTokens) * GMAX + size_t(kWarps) * GMAX * D);
}

struct DecodeKernelParams {
  const uint16_t* q;
  const uint8_t* k_pool;
  const uint8_t* v_pool;
  int64_t num_pages;
  PageTableView table;
  FormatParams fp;
  float qk_scale_log2;  // sm_scale * log2(e): scores live in the log2 domain so exp2 is one instruction
  uint16_t* out;
  float* lse;
  float* ws_acc;   // [batch][num_kv_heads][max_chunks][group][D]
  float2* ws_ml;   // [batch][num_kv_heads][max_chunks][group] (max, sum) in the log2 domain
  int* sem;        // [batch][num_kv_heads] arrival counters, reset to 0 by the merging CTA (graph-safe)
  int* fold_sem;   // [batch][num_kv_heads][max_groups] fold-group arrival counters, reset by the group's folder
  uint32_t* ws_qh;  // [batch][num_kv_heads][32 lanes][D / 8] q4 / q3.5 / q3: the lean kernel's prepared query fragments
  float4* ws_qc;    // [batch][num_kv_heads][8 heads] q4 / q3.5 / q3: (2^-E, q'.o, q.mu, 0) per head of the group
  int32_t* status;
  int num_qo_heads, num_kv_heads, group, page_size, page_shift, num_splits, stages, max_chunks, max_groups;
  int leaf;  // DecodePlan::leaf (the lean kernel's mode; -1: the launcher's rule)
  // The lean launcher's (decode_lean.cuh, LeanInst::kGroup): 1 when the lean kernel's warps folded whole fold groups
  // and stored one partial per group (in its first chunk slot), which lean_merge_kernel then takes as the group's.
  int lean_group_fold;
  // decode_step (q formats, sm_90): the query preparation was launched with PDL behind the step's write kernel. It
  // then prepares the query while the write runs, waits for the write's grid (griddepcontrol.wait) and only then lets
  // the lean kernel start its copies (the new token's page among them). 0: run_decode's order (write, if any, done).
  int prep_after_write;
  int64_t max_context;
  int64_t head_block_bytes;
  // Sink tokens (formats with format_info().sink_tokens > 0): [rows][sink_tokens][num_kv_heads][D] bf16 pools.
  const uint16_t* k_sinks;
  const uint16_t* v_sinks;
  const int32_t* sink_rows;  // [batch] or null
  int64_t num_sink_rows;
  int sink_tokens;           // 0 for formats without sinks
};

// Sequence b's length, read on the device (the grid never depends on it), clamped to [0, max_context] (`over`: it
// was longer), and its page-table row. Every decode kernel reads the page table through this.
__device__ __forceinline__ int64_t seq_len_of(const DecodeKernelParams& p, int b, int64_t& row, bool& over) {
  int64_t len;
  if (p.table.row_start) {
    const int r0 = p.table.row_start[b], r1 = p.table.row_start[b + 1];
    row = r0;
    len = p.table.seq_lens ? p.table.seq_lens[b]
                           : (r1 - r0 <= 0 ? 0 : int64_t(r1 - r0 - 1) * p.page_size + p.table.last_page_len[b]);
  } else {
    row = int64_t{b} * p.table.row_stride;
    len = p.table.seq_lens[b];
  }
  over = len > p.max_context;
  return len < 0 ? 0 : over ? p.max_context : len;
}
// Attention sinks of sequence b (len tokens): how many of its first positions come from the exact bf16 sink pool
// (0 without a sink row), its sink row, and `bad`: a row outside the pool (status bit 2).
__device__ __forceinline__ int sink_count(const DecodeKernelParams& p, int b, int64_t len, int64_t& sink_row, bool& bad) {
  sink_row = 0;
  bad = false;
  if (p.sink_tokens <= 0 || !p.sink_rows) return 0;
  sink_row = p.sink_rows[b];
  bad = sink_row >= p.num_sink_rows;
  return sink_row >= 0 && !bad ? (len < p.sink_tokens ? static_cast<int>(len) : p.sink_tokens) : 0;
}

// f16 operands: the power of two 2^E that puts a vector's largest magnitude mx in [2^13, 2^14) (full f16
// precision, far from overflow); the fp32 result is scaled back by 2^-E exactly. E = 0 for mx 0 or not finite.
__device__ __forceinline__ int f16_range_exponent(float mx) {
  int e = 0;
  if (mx > 0.f && mx <= 3.0e38f) frexpf(mx, &e);
  return mx > 0.f && mx <= 3.0e38f ? min(max(14 - e, -120), 120) : 0;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait(int n) {
  // wait_group takes an immediate; stages - 1 is at most kMaxStages - 1.
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::); break;
  }
}

// Sum v[] over the `lanes` consecutive lanes of a token (lanes a power of two >= N), scattering the results: on
// return v[0] holds the full sum of head (part / (lanes / N)) where part = lane % lanes. Summation order is fixed.
template <int N, int Lanes>
__device__ __forceinline__ int reduce_scatter(float (&v)[N], int part) {
  static_assert(Lanes >= N, "needs at least as many lanes as heads");
  int head = 0;
  constexpr int kLevels = [] { int l = 0; for (int x = Lanes; x > 1; x /= 2) ++l; return l; }();
#pragma unroll
  for (int lv = 0; lv < kLevels; ++lv) {
    const int off = Lanes >> (lv + 1);
    const int n = N >> lv;  // heads still carried (>= 1)
    if (n > 1) {
      const bool upper = (part & off) != 0;
#pragma unroll
      for (int j = 0; j < N / 2; ++j) {
        if (j < n / 2) {
          const float send = upper ? v[j] : v[j + n / 2];
          const float keep = upper ? v[j + n / 2] : v[j];
          v[j] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
      }
      head += upper ? n / 2 : 0;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    }
  }
  return head;
}

// The normalised Walsh-Hadamard transform of rows x[0..N) of length D in shared memory, all threads cooperating
// (one butterfly per thread per stage). Same butterfly order and final scale as block::hadamard<D> (adds only, then
// one multiply), so each row gets exactly the bits the serial block core gives. Ends with a barrier.
template <int N, int D>
__device__ __forceinline__ void hadamard_cooperative(float* x) {
  for (int len = 1; len < D; len <<= 1) {
    __syncthreads();
    for (int i = threadIdx.x; i < N * D / 2; i += blockDim.x) {
      const int row = i / (D / 2), k = i % (D / 2);
      const int j = (k / len) * 2 * len + (k % len);  // butterfly (j, j + len) of this stage
      float* r = x + row * D;
      const float a = r[j], b = r[j + len];
      r[j] = a + b;
      r[j + len] = a - b;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < N * D; i += blockDim.x) x[i] *= block::hadamard_scale<D>();
  __syncthreads();
}

struct Cursor {
  int c;     // chunk index in the sequence
  int kind;  // 0 = K tiles, 1 = V tiles
  int tile;  // tile index inside the chunk
};

// Resident CTAs per SM the kernel is compiled for (its register cap: 2 -> at most 128 registers, 16 warps per SM).
// Up to 4 query heads every path fits 128 registers. With 8 heads the CUDA-core path (int4/int4h) needs ~230 (q and
// the accumulators alone are 128): one CTA per SM. The tensor-core paths with 8 heads and head_dim 128 want ~170;
// capped at 128 they spill a few registers and one CTA runs ~15% slower, but two CTAs per SM run 1.2-1.4x faster
// whenever the grid has more CTAs than the GPU has SMs (run 20261203T142455Z). So they get both variants and the
// launch picks by grid size (kFatVariant, launch_decode).
template <class P, int GMAX>
inline constexpr int kLeanMinBlocks = GMAX <= 4 || P::kMmaK ? 2 : 1;
template <class P, int D, int GMAX>
inline constexpr bool kFatVariant = kLeanMinBlocks<P, GMAX> == 2 && GMAX == 8 && D == 128;

// The merge's fold: the partials in workspace slots base + first, + kStride, ... (count of them), folded in that
// order into (m, l, o) for this thread's kPairs (head, element) pairs; the partials are fetched kB at a time for all
// pairs before they are folded, so n partials cost ~n / kB dependent L2 round trips.
template <int D, int kPairs, int kB, int kStride>
__device__ __forceinline__ void fold_partials(const DecodeKernelParams& p, int64_t base, int first, int count,
                                              float (&m)[kPairs], float (&l)[kPairs], float (&o)[kPairs]) {
  const int tid = threadIdx.x, npairs = p.group * D;
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    m[k] = -INFINITY;
    l[k] = 0.f;
    o[k] = 0.f;
  }
  for (int c0 = 0; c0 < count; c0 += kB) {
    float2 ml[kPairs][kB];
    float a[kPairs][kB];
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int i = tid + k * kThreads;
      const int g = i < npairs ? i / D : 0;
#pragma unroll
      for (int j = 0; j < kB; ++j) {
        const bool ok = i < npairs && c0 + j < count;
        const int64_t slot = base + first + int64_t{c0 + j} * kStride;
        ml[k][j] = ok ? __ldcg(p.ws_ml + slot * p.group + g) : make_float2(-INFINITY, 0.f);
        a[k][j] = ok ? __ldcg(p.ws_acc + slot * p.group * D + i) : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < kPairs; ++k)
#pragma unroll
      for (int j = 0; j < kB; ++j) {
        if (c0 + j >= count) break;  // fixed order: first, first + kStride, ... is the definition of the result
        const float mn = fmaxf(m[k], ml[k][j].x);
        const float mr = mn == -INFINITY ? 0.f : mn;  // only sink-masked chunks so far: weights stay 0
        const float sa = exp2f(m[k] - mr), sc = exp2f(ml[k][j].x - mr);
        l[k] = l[k] * sa + ml[k][j].y * sc;
        o[k] = o[k] * sa + a[k][j] * sc;
        m[k] = mn;
      }
  }
}

// v21, level 1 of the two-level fold (see the kernel's merge): every chunk this CTA computed arrives at its fold
// group's counter (one thread per chunk); for each group whose last chunk this was, the CTA folds the group's
// partials in chunk order into the group's first slot and resets the counter (graph-safe). (Not inlining it was
// tried: the kernel parameters then go through the stack, and the 128-register variants spill more, not less.)
template <int D, int kPairs, int kB>
__device__ __forceinline__ void fold_groups(const DecodeKernelParams& p, int64_t base, int seq_head, int split,
                                         int n_chunks) {
  __shared__ unsigned fold_mask_s[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, npairs = p.group * D;
  const int mine = split < n_chunks ? (n_chunks - split + p.num_splits - 1) / p.num_splits : 0;
  for (int j0 = 0; j0 < mine; j0 += kThreads) {
    bool folds = false;
    if (j0 + tid < mine) {
      const int c = split + (j0 + tid) * p.num_splits, gi = c / kFoldChunks;
      const int gsize = min(kFoldChunks, n_chunks - gi * kFoldChunks);
      int* gs = p.fold_sem + int64_t{seq_head} * p.max_groups + gi;
      folds = atomicAdd(gs, 1) == gsize - 1;
      if (folds) atomicExch(gs, 0);
    }
    const unsigned bal = __ballot_sync(0xffffffffu, folds);
    if (lane == 0) fold_mask_s[warp] = bal;
    __syncthreads();
    __threadfence();
    for (int w2 = 0; w2 < kWarps; ++w2)
      for (unsigned bits = fold_mask_s[w2]; bits; bits &= bits - 1) {
        const int c = split + (j0 + w2 * 32 + __ffs(bits) - 1) * p.num_splits, gi = c / kFoldChunks;
        float m[kPairs], l[kPairs], o[kPairs];
        fold_partials<D, kPairs, kB, 1>(p, base, gi * kFoldChunks, min(kFoldChunks, n_chunks - gi * kFoldChunks), m,
                                        l, o);
        __syncthreads();  // every thread has read the group's first slot before it is overwritten
        const int64_t slot = base + int64_t{gi} * kFoldChunks;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const int i = tid + k * kThreads;
          if (i >= npairs) continue;
          p.ws_acc[slot * p.group * D + i] = o[k];
          if (i % D == 0) p.ws_ml[slot * p.group + i / D] = make_float2(m[k], l[k]);
        }
      }
    __syncthreads();  // fold_mask_s is rewritten by the next round
  }
  __threadfence();
  __syncthreads();
}

template <class P, int D, int GMAX, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks) decode_kernel(const DecodeKernelParams p) {
  static_assert(!P::kQ, "q4 / q3.5 / q3 decode on the lean kernel only (decode_lean.cuh)");
  using Gm = Geo<P, D>;
  constexpr int kTile = Gm::kTile;
  extern __shared__ __align__(16) uint8_t smem[];
  float* q_s = reinterpret_cast<float*>(smem + size_t(p.stages) * Gm::kStageBytes);  // [GMAX][D]
  float* p_s = q_s + GMAX * D;                                                        // [kChunk][GMAX]
  float* red_s = p_s + kChunkTokens * GMAX;                                           // [kSlices][GMAX][D]
  __shared__ float m_s[GMAX], l_s[GMAX];
  __shared__ int last_s;

  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.num_kv_heads;

  int64_t row;
  bool over, bad_sink;
  const int64_t len = seq_len_of(p, b, row, over);
  if (over && split == 0 && h == 0 && tid == 0 && p.status) atomicOr(p.status, 2);
  const int n_chunks = static_cast<int>((len + kChunkTokens - 1) / kChunkTokens);
  // Attention sinks: positions < n_sink come from the exact bf16 sink pool (folded in by the merging CTA) and are
  // masked out of the chunks.
  int64_t sink_row;
  const int n_sink = sink_count(p, b, len, sink_row, bad_sink);
  if (bad_sink && split == 0 && h == 0 && tid == 0 && p.status) atomicOr(p.status, 4);

  // The query, scaled once (softmax scale, log2 e, per-head format scale): never per element of K.
  const float qs = p.qk_scale_log2 * P::q_scale(p.fp, h);
  for (int i = tid; i < GMAX * D; i += kThreads) {
    const int g = i / D, d = i % D;
    q_s[i] = g < p.group ? bf16_to_f32(p.q[(int64_t{b} * p.num_qo_heads + h * p.group + g) * D + d]) * qs : 0.f;
  }
  if constexpr (P::kRotate) {
    // Keys are stored Hadamard-rotated: rotate the query once instead ((Hq).(Hk) = q.k), one thread per head.
    __syncthreads();
    hadamard_cooperative<GMAX, D>(q_s);
  }

  auto ntiles = [&](int c) {
    const int64_t rem = len - int64_t{c} * kChunkTokens;
    const int v = rem < kChunkTokens ? static_cast<int>(rem) : kChunkTokens;
    return (v + kTile - 1) / kTile;
  };
  auto advance = [&](Cursor& cu) {
    if (++cu.tile == ntiles(cu.c)) {
      cu.tile = 0;
      if (cu.kind == 0) {
        cu.kind = 1;
      } else {
        cu.kind = 0;
        cu.c += p.num_splits;
      }
    }
  };
  // Tile loads. v10 profile (ncu source view, fp8 32q/8kv b=8 32k): the v9 form of this loop (64-bit positions,
  // a 64-bit multiply chain per 16-byte piece and an atomic branch) was ~60 instructions per piece and half of all
  // instructions the kernel executed. Now positions are 32-bit (plan() caps max_context at 2^30), the page's byte
  // offset is one wide multiply, pieces are unrolled with their in-tile offsets as constants, and a bad page only
  // sets a flag (reported once per thread at the end).
  const int32_t* prow = p.table.pages + row;
  const int len32 = static_cast<int>(len);
  const uint32_t npages32 = static_cast<uint32_t>(p.num_pages < 0x7fffffff ? p.num_pages : 0x7fffffff);
  const int64_t page_stride = int64_t{H} * p.head_block_bytes;
  const int page_mask = p.page_size - 1;
  // This CTA's kv head in the K (kind 0) or V (kind 1) pool; page pg's block is at head_base(kind) + pg * page_stride.
  auto head_base = [&](int kind) { return (kind ? p.v_pool : p.k_pool) + int64_t{h} * p.head_block_bytes; };
  bool bad_page = false;
  auto issue = [&](const Cursor& cu, int slot) {
    uint8_t* dst = smem + size_t(slot) * Gm::kStageBytes;
    const uint8_t* hpool = head_base(cu.kind);
    const int t0 = cu.c * kChunkTokens + cu.tile * kTile;
    constexpr int kPieces = Gm::kTileCodeBytes / 16;
#pragma unroll
    for (int k = 0; k < (kPieces + kThreads - 1) / kThreads; ++k) {
      const int i = tid + k * kThreads;
      if (kPieces % kThreads != 0 && i >= kPieces) break;
      const int byte = i * 16, tok = byte / Gm::kCode, inrow = byte - tok * Gm::kCode;
      const int t = t0 + tok;
      const void* src = hpool;
      int bytes = 0;
      if (t < len32) {
        const int32_t pg = __ldg(prow + (t >> p.page_shift));  // page sizes are powers of two
        if (static_cast<uint32_t>(pg) < npages32) {
          src = hpool + pg * page_stride + ((t & page_mask) * Gm::kCode + inrow);
          bytes = 16;
        } else {
          bad_page = true;
        }
      }
      cp_async16(dst + byte, src, bytes);  // bytes = 0 zero-fills: padding tokens never hold stale NaNs
    }
    if constexpr (Gm::kMeta > 0) {
      constexpr int kM = Gm::kMeta > 0 ? Gm::kMeta : 1;
      constexpr int kMetaPieces = Gm::kTileMetaBytes / 16;
#pragma unroll
      for (int k = 0; k < (kMetaPieces + kThreads - 1) / kThreads; ++k) {
        const int i = tid + k * kThreads;
        if (kMetaPieces % kThreads != 0 && i >= kMetaPieces) break;
        const int byte = i * 16, tok = byte / kM, inrow = byte - tok * kM;
        const int t = t0 + tok;
        const void* src = hpool;
        int bytes = 0;
        if (t < len32 && tok < kTile) {
          const int32_t pg = __ldg(prow + (t >> p.page_shift));
          if (static_cast<uint32_t>(pg) < npages32) {
            src = hpool + pg * page_stride + (p.page_size * Gm::kCode + (t & page_mask) * Gm::kMeta + inrow);
            bytes = 16;
          }
        }
        cp_async16(dst + Gm::kTileCodeBytes + byte, src, bytes);
      }
    }
  };

  // Bulk path: warp 0 issues a tile as one copy per page run (lane i: run i; a tile has at most 512 / 16 runs) and
  // arms the slot's mbarrier with the tile's byte count; every thread waits on it. Bytes of the tile no copy writes
  // (past the sequence's end, or pages outside the pool) are zero-filled by warp 0 first, so stale shared memory
  // never reaches P.V (0 * NaN). The slot being filled was released by the previous iteration's closing barrier.
  constexpr bool kBulk = KVPACK_DECODE_BULK != 0;
  constexpr bool kPipe = kBulk && kWarpPipeFormat<P>;
  __shared__ alignas(8) uint64_t bar_s[kMaxStages];
  uint32_t phase_bits = 0;
  static_assert(kTile / 16 <= 32, "one lane per page run");
  auto zero_smem = [&](uint8_t* d, int from, int to) {  // 16-byte aligned bounds; warp 0's lanes cooperate
    for (int o = from + lane * 16; o < to; o += 32 * 16) *reinterpret_cast<uint4*>(d + o) = make_uint4(0, 0, 0, 0);
  };
  auto issue_bulk = [&](const Cursor& cu, int slot) {
    if (warp != 0) return;
    uint8_t* dst = smem + size_t(slot) * Gm::kStageBytes;
    const uint8_t* hpool = head_base(cu.kind);
    const int t0 = cu.c * kChunkTokens + cu.tile * kTile;
    const int ntok = min(kTile, len32 - t0);  // > 0: the cursor only visits tiles holding tokens
    const int run = min(p.page_size, kTile);  // pages never cross a tile boundary, nor tiles a page's
    const int tok_off = lane * run;
    uint8_t* cdst = dst + tok_off * Gm::kCode;
    uint8_t* mdst = dst + Gm::kTileCodeBytes + tok_off * Gm::kMeta;
    uint32_t cbytes = 0, mbytes = 0;
    const uint8_t* csrc = nullptr;
    const uint8_t* msrc = nullptr;
    bool zeroed = false;
    if (tok_off < ntok) {
      const int t = t0 + tok_off, n = min(run, ntok - tok_off), off = t & page_mask;
      // Whole 16-byte pieces; they stay inside the page (page_size x code or meta bytes is a multiple of 16).
      cbytes = (n * Gm::kCode + 15) & ~15;
      mbytes = (n * Gm::kMeta + 15) & ~15;
      const int32_t pg = __ldg(prow + (t >> p.page_shift));
      if (static_cast<uint32_t>(pg) < npages32) {
        const uint8_t* block = hpool + pg * page_stride;
        csrc = block + off * Gm::kCode;
        msrc = block + p.page_size * Gm::kCode + off * Gm::kMeta;
      } else {
        bad_page = true;
        zeroed = true;
        for (uint32_t o = 0; o < cbytes; o += 16) *reinterpret_cast<uint4*>(cdst + o) = make_uint4(0, 0, 0, 0);
        for (uint32_t o = 0; o < mbytes; o += 16) *reinterpret_cast<uint4*>(mdst + o) = make_uint4(0, 0, 0, 0);
        cbytes = mbytes = 0;
      }
    }
    if (ntok < kTile) {
      zeroed = true;
      zero_smem(dst, (ntok * Gm::kCode + 15) & ~15, Gm::kTileCodeBytes);
      if constexpr (Gm::kMeta > 0) zero_smem(dst + Gm::kTileCodeBytes, (ntok * Gm::kMeta + 15) & ~15, Gm::kTileMetaBytes);
    }
    if (__any_sync(0xffffffffu, zeroed)) fence_proxy_async_smem();
    const uint32_t total = __reduce_add_sync(0xffffffffu, cbytes + mbytes);
    if (lane == 0) mbar_arrive_expect_tx(&bar_s[slot], total);
    __syncwarp();
    if (cbytes) bulk_copy(cdst, csrc, cbytes, &bar_s[slot]);
    if (mbytes) bulk_copy(mdst, msrc, mbytes, &bar_s[slot]);
  };
  if constexpr (kBulk) {
    if (tid == 0)
      for (int s = 0; s < p.stages; ++s) mbar_init(&bar_s[s], 1);
    __syncthreads();
  }

  constexpr int kAccRows = P::kMmaV ? 1 : GMAX;
  float acc[kAccRows][8];
#pragma unroll
  for (int g = 0; g < kAccRows; ++g)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  // Tensor-core q path: O^T fragments, m-tile mt = rows (channel mt % 4, channel mt % 4 + 4) of group r + 8 (mt / 4),
  // columns = query heads 2 t4, 2 t4 + 1.
  constexpr int kAcc2 = P::kMmaV ? D / 16 : 1;
  [[maybe_unused]] float acc2[kAcc2][4];
#pragma unroll
  for (int m = 0; m < kAcc2; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc2[m][i] = 0.f;

  Cursor prod{split, 0, 0}, cons{split, 0, 0};
  for (int s = 0; s < p.stages - 1; ++s) {
    if (!kPipe && prod.c < n_chunks) {
      if constexpr (kBulk) issue_bulk(prod, s);
      else issue(prod, s);
      advance(prod);
    }
    if constexpr (!kBulk) cp_async_commit();
  }
  __syncthreads();  // q_s visible
  // This thread's octet of every query head, for the whole CTA lifetime: no shared-memory traffic for q.
  const int part = tid % Gm::kTPT;
  [[maybe_unused]] float qreg[P::kMmaK ? 1 : GMAX][8];
  // Tensor-core scores (kMmaK): A = the raw bf16 query (exact; 16 rows = heads, rows >= 8 zero), its columns
  // permuted like the format's B fragments (mma_dim_base); the softmax scale multiplies the fp32 score afterwards.
  // The same registers are head r's B fragment (k rows 2 t4.., column r) for the warp pipeline's swap-AB scores (v79).
  [[maybe_unused]] uint32_t qa[P::kMmaK ? D / 16 : 1][2];
  if constexpr (P::kMmaK) {
    const int r = lane >> 2, t4 = lane & 3;
    const uint16_t* qrow = p.q + (int64_t{b} * p.num_qo_heads + h * p.group + (r < p.group ? r : 0)) * D;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int base = P::mma_dim_base(ks, t4);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        qa[ks][hh] = r < p.group && r < GMAX ? P::pack_q(qrow[base + 2 * hh], qrow[base + 2 * hh + 1]) : 0u;
    }
  } else {
#pragma unroll
    for (int g = 0; g < GMAX; ++g)
#pragma unroll
      for (int i = 0; i < 8; ++i) qreg[g][i] = q_s[g * D + part * 8 + i];
  }
  // A chunk's partial (per-warp P.V sums in red_s, then m, l) to the workspace: the warps are summed in order.
  auto store_chunk_partial = [&](int c) {
    __syncthreads();
    const int64_t base = (int64_t{b} * H + h) * p.max_chunks + c;
    for (int i = tid; i < p.group * D; i += kThreads) {
      const int g = i / D, d = i % D;
      float a = 0.f;
      for (int w2 = 0; w2 < kWarps; ++w2) a += red_s[(w2 * GMAX + g) * D + d];
      p.ws_acc[base * p.group * D + i] = a;
    }
    if (tid < p.group) p.ws_ml[base * p.group + tid] = make_float2(m_s[tid], l_s[tid]);
  };
  if constexpr (kPipe) {
    // v17 warp pipeline (sm_90, tensor-core formats). Warp w owns tokens [64 w, 64 w + 64) of every chunk, K and V,
    // and streams them through its own ring of 16-token units (one bulk copy of codes, one of metadata, its own
    // mbarriers): no CTA barrier per tile and no producer to wait for. Per chunk the warp computes its scores, an
    // exact softmax of its 64 tokens (max, exp2, fixed-order sum) and P.V; the chunk's partial is the 8 warps'
    // partials merged in warp order (two CTA barriers per chunk instead of six). The decomposition is fixed per
    // format and head_dim, so the bits never depend on the plan, the batch or the run.
    using Wp = WarpPipeGeo<P, D>;
    constexpr int kSteps = Wp::kSteps;
    __shared__ alignas(8) uint64_t wbar_s[kWarps][kMaxDepth];
    __shared__ float2 wml_s[kWarps][GMAX];
    const int depth = min(kMaxDepth, max(1, (p.stages * Gm::kStageBytes) / (kWarps * Wp::kUnit)));
    uint8_t* ring = smem + size_t(warp) * depth * Wp::kUnit;
    float* pw = p_s + warp * Wp::kSubTok * GMAX;  // [64 tokens][GMAX] weights of this warp's tokens
    if (lane < depth) mbar_init(&wbar_s[warp][lane], 1);
    // KVPACK_PIPE_ASYNC_MERGE: merge_bar_s[0] "the chunk's 8 partials are in shared memory" (every thread arrives),
    // merge_bar_s[1] "the merge has read them" (the merging warp's 32 lanes arrive); one CTA barrier after their
    // initialisation.
    constexpr bool kAsyncMerge =
        KVPACK_PIPE_ASYNC_MERGE > 0 || (KVPACK_PIPE_ASYNC_MERGE < 0 && std::is_same_v<P, Bf16Policy>);
    __shared__ alignas(8) uint64_t merge_bar_s[2];
    if constexpr (kAsyncMerge) {
      if (tid == 0) {
        mbar_init(&merge_bar_s[0], kThreads);
        mbar_init(&merge_bar_s[1], 32);
      }
      __syncthreads();
    }
    __syncwarp();
    const int r = lane >> 2, t4 = lane & 3;
    const int sub0 = warp * Wp::kSubTok;
    auto wsteps = [&](int c) {  // this warp's 16-token steps in chunk c
      const int rem = len32 - c * kChunkTokens - sub0;
      return rem <= 0 ? 0 : (rem >= Wp::kSubTok ? kSteps : (rem + 15) / 16);
    };
    Cursor pc{split, 0, 0};  // producer: (chunk, K|V, step)
    while (pc.c < n_chunks && wsteps(pc.c) == 0) pc.c += p.num_splits;
    // A unit (K|V, 16 tokens from t) of this warp: its page, byte counts (0 for a page outside the pool, whose
    // bytes are zero-filled instead) and the offsets of its codes and metadata in the page's head block.
    struct UnitSrc {
      int32_t pg;
      uint32_t cbytes, mbytes;
      int coff, moff;
    };
    auto unit_src = [&](int t) {
      const int ntok = min(16, len32 - t);
      UnitSrc d;
      d.pg = __ldg(prow + (t >> p.page_shift));
      const bool ok = static_cast<uint32_t>(d.pg) < npages32;
      bad_page |= !ok;
      d.cbytes = ok ? (ntok * Gm::kCode + 15) & ~15 : 0;
      d.mbytes = ok ? (ntok * Gm::kMeta + 15) & ~15 : 0;
      const int off = t & page_mask;
      d.coff = off * Gm::kCode;
      d.moff = p.page_size * Gm::kCode + off * Gm::kMeta;
      return d;
    };
    auto needs_zero = [&](uint32_t cbytes, uint32_t mbytes) {
      return cbytes < Wp::kUnitCode || mbytes < Wp::kUnitMeta;
    };
    // Bytes no copy writes (past the sequence's end, a page outside the pool) are zero-filled by the warp before the
    // copies start (never stale NaNs in P.V).
    auto zero_fill = [&](uint8_t* dst, int cbytes, int mbytes) {
      for (int o = cbytes + lane * 16; o < Wp::kUnitCode; o += 32 * 16)
        *reinterpret_cast<uint4*>(dst + o) = make_uint4(0, 0, 0, 0);
      for (int o = mbytes + lane * 16; o < Wp::kUnitMeta; o += 32 * 16)
        *reinterpret_cast<uint4*>(dst + Wp::kUnitCode + o) = make_uint4(0, 0, 0, 0);
      fence_proxy_async_smem();
    };
    auto wnext = [&](Cursor& u) {
      if (++u.tile < wsteps(u.c)) return;
      u.tile = 0;
      if (u.kind == 0) {
        u.kind = 1;
        return;
      }
      u.kind = 0;
      do u.c += p.num_splits;
      while (u.c < n_chunks && wsteps(u.c) == 0);
    };
    // Unit u into ring slot s: the zero fill, then one lane arms the slot's mbarrier and issues the copies.
    auto issue_unit = [&](const Cursor& u, int s) {
      uint8_t* dst = ring + s * Wp::kUnit;
      const UnitSrc d = unit_src(u.c * kChunkTokens + sub0 + u.tile * 16);
      if (needs_zero(d.cbytes, d.mbytes)) zero_fill(dst, d.cbytes, d.mbytes);
      __syncwarp();
      if (lane == 0) {
        mbar_arrive_expect_tx(&wbar_s[warp][s], d.cbytes + d.mbytes);
        const uint8_t* block = head_base(u.kind) + d.pg * page_stride;
        if (d.cbytes) bulk_copy(dst, block + d.coff, d.cbytes, &wbar_s[warp][s]);
        if (d.mbytes) bulk_copy(dst + Wp::kUnitCode, block + d.moff, d.mbytes, &wbar_s[warp][s]);
      }
    };
    for (int s = 0; s < depth && pc.c < n_chunks; ++s) {
      issue_unit(pc, s);
      wnext(pc);
    }
    int cslot = 0;
    uint32_t wphase = 0;
    auto wait_unit = [&]() -> const uint8_t* {
      mbar_wait(&wbar_s[warp][cslot], (wphase >> cslot) & 1u);
      wphase ^= 1u << cslot;
      return ring + cslot * Wp::kUnit;
    };
    auto release_unit = [&]() {  // the slot just read gets the next unit in the same order
      __syncwarp();
      if (pc.c < n_chunks) {
        issue_unit(pc, cslot);
        wnext(pc);
      }
      cslot = cslot + 1 == depth ? 0 : cslot + 1;
    };
    // Which of a thread's 4 scores per step belongs to which of its heads / tokens. KVPACK_PIPE_SWAP_K (v79): the
    // scores swap-AB as well (A = 16 K rows, B = the query's heads as N = 8: qa is already head r's B fragment),
    // so thread (r, t4) gets tokens r, r + 8 of heads 2 t4, 2 t4 + 1. One HMMA chain of D / 16 per 16-token step
    // instead of two whose A (the query) is half zero rows, and no copies of the query into each HMMA's A
    // registers (v78's H100 profile of fp8 at 32q/8kv: IMAD, mostly those moves, 21% of the executed instructions).
    constexpr bool kSwapK = KVPACK_PIPE_SWAP_K != 0;
    constexpr int kHeadsPer = kSwapK ? 2 : 1;
    auto head_of = [&](int i) { return kSwapK ? 2 * t4 + (i & 1) : r; };
    auto tok_of = [&](int i) { return kSwapK ? r + 8 * (i >> 1) : 8 * (i >> 1) + 2 * t4 + (i & 1); };
    // Lanes holding the same heads (other tokens): the t4 quad, or (swap-AB) the 8 rows.
    constexpr int kRedFirst = kSwapK ? 4 : 1, kRedEnd = kSwapK ? 32 : 4;

    for (int c = split; c < n_chunks; c += p.num_splits) {
      const int chunk0 = c * kChunkTokens;
      const int nst = wsteps(c);
      float sc[kSteps][4];
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[st][i] = -INFINITY;
        if (st < nst) {
          const uint8_t* u = wait_unit();
          const uint8_t* meta = u + Wp::kUnitCode;
          const int t0 = chunk0 + sub0 + st * 16;
          const int valid = min(16, len32 - t0);
          if constexpr (kSwapK) {
            // a0 / a2: token r's k-step words (dims base, base + 2: the permutation qa uses), a1 / a3: token r + 8's.
            uint32_t b0[D / 16][2], b8[D / 16][2];
            P::template mma_b<D>(u + r * Gm::kCode, t4, b0);
            P::template mma_b<D>(u + (8 + r) * Gm::kCode, t4, b8);
            float cc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks)
              P::mma_full(cc, b0[ks][0], b8[ks][0], b0[ks][1], b8[ks][1], qa[ks][0], qa[ks][1]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              sc[st][i] = head_of(i) < GMAX && tok_of(i) < valid ? cc[i] * qs : -INFINITY;
          } else {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              uint32_t bf[D / 16][2];
              P::template mma_b<D>(u + (8 * nt + r) * Gm::kCode, t4, bf);
              float cc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
              for (int ks = 0; ks < D / 16; ++ks) P::mma(cc, qa[ks][0], qa[ks][1], bf[ks][0], bf[ks][1]);
#pragma unroll
              for (int i = 0; i < 2; ++i) {
                const int tok = 8 * nt + 2 * t4 + i;
                sc[st][2 * nt + i] = r < GMAX && tok < valid ? cc[i] * qs : -INFINITY;
              }
            }
          }
          release_unit();
        }
      }
      // Exact softmax of this warp's tokens: max (order-free), exp2, sum in a fixed order (thread, then lanes).
      float mw[kHeadsPer], lw[kHeadsPer], mref[kHeadsPer];
#pragma unroll
      for (int j = 0; j < kHeadsPer; ++j) mw[j] = -INFINITY, lw[j] = 0.f;
#pragma unroll
      for (int st = 0; st < kSteps; ++st)
#pragma unroll
        for (int i = 0; i < 4; ++i) mw[i % kHeadsPer] = fmaxf(mw[i % kHeadsPer], sc[st][i]);
#pragma unroll
      for (int j = 0; j < kHeadsPer; ++j) {
#pragma unroll
        for (int off = kRedFirst; off < kRedEnd; off *= 2) mw[j] = fmaxf(mw[j], __shfl_xor_sync(0xffffffffu, mw[j], off));
        mref[j] = mw[j] == -INFINITY ? 0.f : mw[j];  // only masked tokens: all weights 0
      }
#pragma unroll
      for (int st = 0; st < kSteps; ++st)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float e = exp2f(sc[st][i] - mref[i % kHeadsPer]);
          lw[i % kHeadsPer] += e;
          if (st < nst && head_of(i) < GMAX) pw[(st * 16 + tok_of(i)) * GMAX + head_of(i)] = e;
        }
#pragma unroll
      for (int j = 0; j < kHeadsPer; ++j) {
#pragma unroll
        for (int off = kRedFirst; off < kRedEnd; off *= 2) lw[j] += __shfl_xor_sync(0xffffffffu, lw[j], off);
      }
      __syncwarp();
      // P.V on tensor cores, swap-AB (as the CTA-tile loop below): O^T += V^T . P^T, 16 tokens per mma k-step.
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        if (st < nst) {
          const uint8_t* u = wait_unit();
          const uint8_t* meta = u + Wp::kUnitCode;
          const int valid = min(16, len32 - (chunk0 + sub0 + st * 16));
          const float* pr = pw + st * 16 * GMAX;
          uint32_t pb[4];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int ta = 2 * t4 + 8 * hh;
            float w0 = 0.f, w1 = 0.f;
            if (r < GMAX) {
              if (ta < valid) w0 = pr[ta * GMAX + r];
              if (ta + 1 < valid) w1 = pr[(ta + 1) * GMAX + r];
            }
            P::pack_w(w0, w1, pb[hh], pb[2 + hh]);
          }
          const uint8_t* ra = u + (2 * t4) * Gm::kCode;
          uint32_t lo[D / 16][2], hi[D / 16][2];
          P::template v_pairs<D>(ra, ra + Gm::kCode, r, lo);
          P::template v_pairs<D>(ra + 8 * Gm::kCode, ra + 9 * Gm::kCode, r, hi);
#pragma unroll
          for (int mt = 0; mt < D / 16; ++mt) {
            P::mma_full(acc2[mt], lo[mt][0], lo[mt][1], hi[mt][0], hi[mt][1], pb[0], pb[1]);
            P::mma_full(acc2[mt], lo[mt][0], lo[mt][1], hi[mt][0], hi[mt][1], pb[2], pb[3]);
          }
          release_unit();
        }
      }
      // The warp's partial to shared memory, then the chunk's partial = the warps merged in order.
      // KVPACK_PIPE_ASYNC_MERGE: before this warp overwrites its partial, the previous chunk's merge has read it.
      // ci: this chunk's index in the CTA's sequence of chunks (the same for every warp).
      if constexpr (kAsyncMerge) {
        const int ci = (c - split) / p.num_splits;
        if (ci > 0) mbar_wait(&merge_bar_s[1], (ci - 1) & 1);
      }
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        const int d = r * (D / 8) + 2 * mt;
        const int d8 = d + 1;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int g = 2 * t4 + i;
          if (g < GMAX) {
            red_s[(warp * GMAX + g) * D + d] = acc2[mt][i];
            red_s[(warp * GMAX + g) * D + d8] = acc2[mt][2 + i];
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc2[mt][i] = 0.f;
      }
      if constexpr (kSwapK) {
#pragma unroll
        for (int j = 0; j < kHeadsPer; ++j)
          if (r == 0 && head_of(j) < GMAX) wml_s[warp][head_of(j)] = make_float2(mw[j], lw[j]);
      } else if (t4 == 0 && r < GMAX) {
        wml_s[warp][r] = make_float2(mw[0], lw[0]);
      }
      if constexpr (kAsyncMerge) {
        const int64_t base = (int64_t{b} * H + h) * p.max_chunks + c;
        const int ci = (c - split) / p.num_splits;
        mbar_arrive(&merge_bar_s[0]);
        if (warp == ci % kWarps) {
          mbar_wait(&merge_bar_s[0], ci & 1);
          // The arithmetic of the barrier path below, each head's weights computed once per lane, not per element.
          for (int g = 0; g < p.group; ++g) {
            float m = -INFINITY;
#pragma unroll
            for (int w2 = 0; w2 < kWarps; ++w2) m = fmaxf(m, wml_s[w2][g].x);
            const float mr = m == -INFINITY ? 0.f : m;
            float f[kWarps], l = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < kWarps; ++w2) {
              f[w2] = exp2f(wml_s[w2][g].x - mr);
              l = fmaf(wml_s[w2][g].y, f[w2], l);
            }
#pragma unroll
            for (int d = lane; d < D; d += 32) {
              float a = 0.f;
#pragma unroll
              for (int w2 = 0; w2 < kWarps; ++w2) a = fmaf(red_s[(w2 * GMAX + g) * D + d], f[w2], a);
              p.ws_acc[(base * p.group + g) * D + d] = a;
            }
            if (lane == 0) p.ws_ml[base * p.group + g] = make_float2(m, l);
          }
          mbar_arrive(&merge_bar_s[1]);
        }
      } else {
        __syncthreads();
        const int64_t base = (int64_t{b} * H + h) * p.max_chunks + c;
        for (int i = tid; i < p.group * D; i += kThreads) {
          const int g = i / D, d = i % D;
          float m = -INFINITY;
#pragma unroll
          for (int w2 = 0; w2 < kWarps; ++w2) m = fmaxf(m, wml_s[w2][g].x);
          const float mr = m == -INFINITY ? 0.f : m;
          float a = 0.f, l = 0.f;
#pragma unroll
          for (int w2 = 0; w2 < kWarps; ++w2) {
            const float f = exp2f(wml_s[w2][g].x - mr);
            a = fmaf(red_s[(w2 * GMAX + g) * D + d], f, a);
            l = fmaf(wml_s[w2][g].y, f, l);
          }
          p.ws_acc[base * p.group * D + i] = a;
          if (d == 0) p.ws_ml[base * p.group + g] = make_float2(m, l);
        }
        __syncthreads();
      }
    }
  } else {
  int slot = 0, pslot = p.stages - 1;
  while (cons.c < n_chunks) {
    if (prod.c < n_chunks) {
      if constexpr (kBulk) issue_bulk(prod, pslot);
      else issue(prod, pslot);
      advance(prod);
    }
    pslot = pslot + 1 == p.stages ? 0 : pslot + 1;
    if constexpr (kBulk) {
      mbar_wait(&bar_s[slot], (phase_bits >> slot) & 1u);
      phase_bits ^= 1u << slot;
    } else {
      cp_async_commit();
      cp_async_wait(p.stages - 1);
      __syncthreads();
    }

    const uint8_t* tile = smem + size_t(slot) * Gm::kStageBytes;
    const uint8_t* meta = tile + Gm::kTileCodeBytes;
    const int64_t chunk0 = int64_t{cons.c} * kChunkTokens;
    const int tloc0 = cons.tile * kTile;
    const int64_t rem = len - chunk0 - tloc0;
    const int valid = rem < kTile ? static_cast<int>(rem) : kTile;
    const int chunk_valid = len - chunk0 < kChunkTokens ? static_cast<int>(len - chunk0) : kChunkTokens;
    const bool last_tile = cons.tile + 1 == ntiles(cons.c);

    if (cons.kind == 0) {
      if constexpr (P::kMmaK) {
        // Scores on tensor cores: warp w takes n-tiles of 8 tokens; thread (r = lane/4, t4 = lane%4) loads token r's
        // fragment words (16-byte loads) and gets back scores of head r for tokens 2*t4, 2*t4 + 1.
        const int r = lane >> 2, t4 = lane & 3;
        for (int nt = warp; nt < kTile / 8; nt += kWarps) {
          const int tok0 = nt * 8;
          uint32_t bf[D / 16][2];
          P::template mma_b<D>(tile + (tok0 + r) * Gm::kCode, t4, bf);
          float c[4] = {0.f, 0.f, 0.f, 0.f};
  #pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) P::mma(c, qa[ks][0], qa[ks][1], bf[ks][0], bf[ks][1]);
          if (r < GMAX) {
  #pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int tok = tok0 + 2 * t4 + i;
              p_s[(tloc0 + tok) * GMAX + r] = tok < valid ? c[i] * qs : -INFINITY;
            }
          }
        }
      } else {
        // Scores: kOct threads per token, one octet each (q in registers); fixed-order shuffle reduction.
        const int tk = tid / Gm::kTPT;
  #pragma unroll 2
        for (int pass = 0; pass < kTile / Gm::kTokPerPass; ++pass) {
          const int tok = pass * Gm::kTokPerPass + tk;
          const uint8_t* rowp = tile + tok * Gm::kCode;
          const uint8_t* mp = meta + tok * Gm::kMeta;
          float s[GMAX];
          float x[8];
          P::dequant8(rowp, part, mp, x);
          // Formats with a scale per octet (int4's group scale) scale the octet's sum once.
          [[maybe_unused]] const float osc = P::octet_scale(mp, part);
  #pragma unroll
          for (int g = 0; g < GMAX; ++g) {
            float t = qreg[g][0] * x[0];
  #pragma unroll
            for (int i = 1; i < 8; ++i) t = fmaf(qreg[g][i], x[i], t);
            s[g] = P::kHasOctetScale ? t * osc : t;
          }
          // Reduce-scatter over the token's kOct lanes: each level halves the heads a lane carries (GMAX - 1 + ...
          // shuffles instead of log2(kOct) x GMAX); lane part ends with head part / (kOct / GMAX). Fixed order.
          const int head = reduce_scatter<GMAX, Gm::kTPT>(s, part);
          if (part % (Gm::kTPT / GMAX) == 0)
            p_s[(tloc0 + tok) * GMAX + head] = tok < valid ? s[0] * P::k_token_scale(mp) : -INFINITY;
        }
      }
      if (last_tile) {
        __syncthreads();
        // Exact softmax of the chunk: warp w owns heads w, w+4; max is order-free, the sum's order is fixed.
        for (int g = warp; g < GMAX; g += kWarps) {
          float m = -INFINITY;
          for (int t = lane; t < chunk_valid; t += 32) m = fmaxf(m, p_s[t * GMAX + g]);
#pragma unroll
          for (int off = 16; off >= 1; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
          float sum = 0.f;
          const float mref = m == -INFINITY ? 0.f : m;  // a chunk of sink positions only: all weights 0
          for (int t = lane; t < chunk_valid; t += 32) {
            const float e = exp2f(p_s[t * GMAX + g] - mref);
            p_s[t * GMAX + g] = e;
            sum += e;
          }
#pragma unroll
          for (int off = 16; off >= 1; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
          if (lane == 0) {
            m_s[g] = m;
            l_s[g] = sum;
          }
        }
      }
    } else if constexpr (P::kMmaV) {
      // P.V on tensor cores, swap-AB: O^T (head dim x heads) += V^T (head dim x 16 tokens) . P^T (16 tokens x heads).
      // Warp w takes 16-token steps w, w + 8, ...; thread (r, t4) decodes tokens 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9
      // of its rows and pairs the tokens with byte permutes; B = p in f16, 0 past the valid
      // tokens (their codes are zero-filled, so finite).
      const int r = lane >> 2, t4 = lane & 3;
      for (int s16 = warp; s16 * 16 < valid; s16 += kWarps) {
        const int t0 = s16 * 16;
        // B = the weights in f16 hi + lo (pb[0..1] hi, pb[2..3] lo): the products keep ~22 bits, as fp32 would.
        uint32_t pb[4];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int ta = t0 + 2 * t4 + 8 * hh;
          float w0 = 0.f, w1 = 0.f;
          if (r < GMAX) {
            if (ta < valid) w0 = p_s[(tloc0 + ta) * GMAX + r];
            if (ta + 1 < valid) w1 = p_s[(tloc0 + ta + 1) * GMAX + r];
          }
          P::pack_w(w0, w1, pb[hh], pb[2 + hh]);
        }
        // Thread r owns elements [r D/8, (r + 1) D/8) of every token; m-tile mt has rows elements 2 mt (row r)
        // and 2 mt + 1 (row r + 8) of them.
        const uint8_t* ra = tile + (t0 + 2 * t4) * Gm::kCode;
        uint32_t lo[D / 16][2], hi[D / 16][2];
        P::template v_pairs<D>(ra, ra + Gm::kCode, r, lo);
        P::template v_pairs<D>(ra + 8 * Gm::kCode, ra + 9 * Gm::kCode, r, hi);
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) {
          P::mma_full(acc2[mt], lo[mt][0], lo[mt][1], hi[mt][0], hi[mt][1], pb[0], pb[1]);
          P::mma_full(acc2[mt], lo[mt][0], lo[mt][1], hi[mt][0], hi[mt][1], pb[2], pb[3]);
        }
      }
      if (last_tile) {
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) {
          // Element (dimension) of rows r and r + 8 of m-tile mt.
          const int d = r * (D / 8) + 2 * mt;
          const int d8 = d + 1;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int g = 2 * t4 + i;
            if (g < GMAX) {
              red_s[(warp * GMAX + g) * D + d] = acc2[mt][i];
              red_s[(warp * GMAX + g) * D + d8] = acc2[mt][2 + i];
            }
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc2[mt][i] = 0.f;
        }
        store_chunk_partial(cons.c);
      }
    } else {
      // P.V: thread (octet vo, slice vs) accumulates its 8 output elements over tokens vs, vs+kSlices, ...
      const int vo = tid % Gm::kOct, vs = tid / Gm::kOct;
#pragma unroll 2
      for (int t = vs; t < valid; t += Gm::kSlices) {
        const uint8_t* mp = meta + t * Gm::kMeta;
        float x[8];
        P::dequant8(tile + t * Gm::kCode, vo, mp, x);
        const float vsc = P::kHasOctetScale ? P::v_token_scale(mp) * P::octet_scale(mp, vo) : P::v_token_scale(mp);
        const float* pr = p_s + (tloc0 + t) * GMAX;
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
          const float w = pr[g] * vsc;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(w, x[i], acc[g][i]);
        }
      }
      if (last_tile) {
        // Slices of one warp first (shuffles, fixed order), then the warps in order through shared memory.
#pragma unroll
        for (int g = 0; g < GMAX; ++g)
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            float a = acc[g][i];
#pragma unroll
            for (int off = Gm::kOct; off < 32; off *= 2) a += __shfl_xor_sync(0xffffffffu, a, off);
            if (lane < Gm::kOct) red_s[(warp * GMAX + g) * D + vo * 8 + i] = a;
            acc[g][i] = 0.f;
          }
        store_chunk_partial(cons.c);
      }
    }
    __syncthreads();
    advance(cons);
    slot = slot + 1 == p.stages ? 0 : slot + 1;
  }
  }  // !kPipe
  if constexpr (!kBulk) cp_async_wait(0);
  if (bad_page && p.status) atomicOr(p.status, 1);

  // Each thread folds kPairs (head, element) pairs; the partials are fetched kBatch at a time for all its pairs
  // before the (sequential, fixed-order) fold, so n partials cost ~n / kBatch L2 round trips instead of n.
  constexpr int kPairs = (GMAX * D + kThreads - 1) / kThreads;
  constexpr int kBatch = kPairs >= 2 ? 8 : 16;
  // A group fold runs inside the arrival loop, where 8-deep batches of 4 pairs need ~200 registers: half as deep in
  // the variants capped at 128 registers (two CTAs per SM), full depth in the one-CTA-per-SM variant.
  constexpr int kGroupBatch = kPairs >= 4 && MinBlocks >= 2 ? 4 : kBatch;
  const int npairs = p.group * D;
  const int64_t base = (int64_t{b} * H + h) * p.max_chunks;
  float m[kPairs], l[kPairs], o[kPairs];

  // v21: a two-level fold with a fixed tree. Chunks 16 g .. 16 g + 15 form fold group g; the last CTA to finish a
  // chunk of group g folds the group's partials in chunk order into slot 16 g, and the merging CTA folds the groups'
  // partials in group order (v1-v20 folded all chunks in one chain: at batch 1 x 128k one CTA read 256 partials in
  // 32 dependent rounds). A sequence of <= 16 chunks is one group, folded directly (folding one partial again is
  // exact). The tree depends only on the sequence length, so the bits stay plan-, batch- and run-independent.
  __threadfence();
  __syncthreads();
  if (n_chunks > kFoldChunks) fold_groups<D, kPairs, kGroupBatch>(p, base, b * H + h, split, n_chunks);
  // Arrival: the last CTA of this (sequence, kv head) merges; it resets the counter so a graph replay starts clean.
  if (tid == 0) {
    const int old = atomicAdd(p.sem + (b * H + h), 1);
    const bool last = old == p.num_splits - 1;
    if (last) atomicExch(p.sem + (b * H + h), 0);
    last_s = last;
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();

  const float os = P::out_scale(p.fp, h);
  float* o_s = red_s;  // [group][D] merged output before the (optional) inverse rotation
  if (n_chunks > kFoldChunks)
    fold_partials<D, kPairs, kBatch, kFoldChunks>(p, base, 0, (n_chunks + kFoldChunks - 1) / kFoldChunks, m, l, o);
  else fold_partials<D, kPairs, kBatch, 1>(p, base, 0, n_chunks, m, l, o);
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
  const int i = tid + k * kThreads;
  if (i >= npairs) continue;
  const int g = i / D, d = i % D;
  const int qh = h * p.group + g;
  const float res = n_chunks > 0 ? o[k] / l[k] * os : 0.f;
  if constexpr (P::kRotate) o_s[i] = res;
  else p.out[(int64_t{b} * p.num_qo_heads + qh) * D + d] = f32_to_bf16(res);
  if (p.lse && d == 0)
    p.lse[int64_t{b} * p.num_qo_heads + qh] =
        n_chunks > 0 ? (m[k] + log2f(l[k])) * 0.69314718055994530942f : -INFINITY;
  }
  if constexpr (P::kRotate) {
  // Values are stored rotated: one inverse rotation (H = H^-1) of the output, never per element of V.
  __syncthreads();
  hadamard_cooperative<GMAX, D>(o_s);  // rows >= group hold stale data: transformed, never stored
  __syncthreads();
  for (int i = tid; i < p.group * D; i += kThreads)
    p.out[(int64_t{b} * p.num_qo_heads + h * p.group) * D + i] = f32_to_bf16(o_s[i]);
  }
}

// Raising the dynamic shared-memory limit is a host-side attribute, not a stream operation: done once per
// instantiation (to the maximum any plan can ask) so run() stays capturable.
template <class P, int D, int GMAX, int MinBlocks>
void ensure_smem_attr() {
  using Gm = Geo<P, D>;
  static std::once_flag once;
  std::call_once(once, [] {
    const size_t max_smem = size_t(kMaxStages) * Gm::kStageBytes + smem_extra_bytes<GMAX>(D);
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaFuncSetAttribute(decode_kernel<P, D, GMAX, MinBlocks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(std::min<size_t>(max_smem, optin)));
    cudaGetLastError();  // no device (host-only planning): leave the error unsticky
  });
}

template <class P, int D, int GMAX>
void launch_decode(const DecodeKernelParams& kp, int batch, cudaStream_t stream) {
  using Gm = Geo<P, D>;
  const size_t smem = size_t(kp.stages) * Gm::kStageBytes + smem_extra_bytes<GMAX>(D);
  dim3 grid(kp.num_splits, kp.num_kv_heads, batch);
  // One wave or less: per-CTA latency decides, so the uncapped (one CTA per SM) variant. The choice depends only on
  // the plan and the GPU, and both variants run the same arithmetic (identical PTX up to the register cap).
  if constexpr (kFatVariant<P, D, GMAX>) {
    if (int64_t{kp.num_splits} * kp.num_kv_heads * batch <= device_sm_count()) {
      ensure_smem_attr<P, D, GMAX, 1>();
      decode_kernel<P, D, GMAX, 1><<<grid, kThreads, smem, stream>>>(kp);
      return;
    }
  }
  constexpr int kMin = kLeanMinBlocks<P, GMAX>;
  ensure_smem_attr<P, D, GMAX, kMin>();
  decode_kernel<P, D, GMAX, kMin><<<grid, kThreads, smem, stream>>>(kp);
}

// The lean kernel (decode_lean.cuh: q4, q3.5 and q3 always, fp8 at head_dim 128 on sm_90 for the shapes of
// fp8_lean_default): defined in decode_lean.cu; returns false when it does not apply (then the regular kernel runs).
bool launch_lean_decode(Format f, const DecodeKernelParams& kp, int head_dim, int batch, cudaStream_t st);

// Launch for one format: instantiated in decode_<format>.cu.
template <class P>
void launch_decode_format(const DecodeKernelParams& kp, int head_dim, int batch, cudaStream_t st) {
  if (launch_lean_decode(P::kFormat, kp, head_dim, batch, st)) return;
  if constexpr (lane_bits_x2(P::kFormat) != 0) {
    // The q formats' lane layout has only the lean kernel as its reader (launch_lean_decode took it above or threw),
    // so the regular kernel is not instantiated for them.
    KVPACK_CU_CHECK(false, "decode: format '{}' has no regular-kernel path", format_name(P::kFormat));
  } else {
    KVPACK_DISPATCH_HEAD_DIM(head_dim, D, [&] {
      if (kp.group == 1) launch_decode<P, D, 1>(kp, batch, st);
      else if (kp.group == 2) launch_decode<P, D, 2>(kp, batch, st);
      else if (kp.group <= 4) launch_decode<P, D, 4>(kp, batch, st);
      else launch_decode<P, D, 8>(kp, batch, st);
    });
  }
}
// Resident CTAs per SM of this format's kernel for (head_dim, group, stages) (occupancy API; 1 without a GPU).
template <class P>
int ctas_per_sm_format(int head_dim, int group, int stages) {
  if constexpr (lane_bits_x2(P::kFormat) != 0) return lean_ctas_per_sm(P::kFormat, head_dim);  // lean kernel only
  else return KVPACK_DISPATCH_HEAD_DIM(head_dim, D, [&]() -> int {
    auto q = [&](auto kernel, size_t smem) {
      int n = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem) != cudaSuccess) {
        cudaGetLastError();
        return 1;
      }
      return n < 1 ? 1 : n;
    };
    using Gm = Geo<P, D>;
    const size_t st = size_t(stages) * Gm::kStageBytes;
    // The variant that runs when CTAs outnumber SMs (occupancy only matters then).
    auto of = [&]<int G>() {
      constexpr int m = kLeanMinBlocks<P, G>;
      ensure_smem_attr<P, D, G, m>();
      return q(decode_kernel<P, D, G, m>, st + smem_extra_bytes<G>(D));
    };
    if (group == 1) return of.template operator()<1>();
    if (group == 2) return of.template operator()<2>();
    if (group <= 4) return of.template operator()<4>();
    return of.template operator()<8>();
  });
}
extern template int ctas_per_sm_format<Bf16Policy>(int, int, int);
extern template int ctas_per_sm_format<Fp8Policy>(int, int, int);
extern template int ctas_per_sm_format<Int4Policy<false>>(int, int, int);
extern template int ctas_per_sm_format<Int4Policy<true>>(int, int, int);
extern template int ctas_per_sm_format<QPolicy<8>>(int, int, int);
extern template int ctas_per_sm_format<QPolicy<7>>(int, int, int);
extern template int ctas_per_sm_format<QPolicy<6>>(int, int, int);
extern template void launch_decode_format<Bf16Policy>(const DecodeKernelParams&, int, int, cudaStream_t);
extern template void launch_decode_format<Fp8Policy>(const DecodeKernelParams&, int, int, cudaStream_t);
extern template void launch_decode_format<Int4Policy<false>>(const DecodeKernelParams&, int, int, cudaStream_t);
extern template void launch_decode_format<Int4Policy<true>>(const DecodeKernelParams&, int, int, cudaStream_t);
extern template void launch_decode_format<QPolicy<8>>(const DecodeKernelParams&, int, int, cudaStream_t);
extern template void launch_decode_format<QPolicy<7>>(const DecodeKernelParams&, int, int, cudaStream_t);
extern template void launch_decode_format<QPolicy<6>>(const DecodeKernelParams&, int, int, cudaStream_t);

}  // namespace cuda_detail
}  // namespace kvpack
