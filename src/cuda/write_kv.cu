// Paged KV write path (quantise new bf16 K/V tokens into their slots) and the whole-page dequantiser (tests).
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "decode_internal.cuh"
#include "format_policy.cuh"
#include "kvpack/block/q_lanes.h"
#include "kvpack/decode.h"
#include "kvpack/error.h"

namespace kvpack {

int& write_small_tokens() {
  static int t = [] {
    const int v = env_int("KVPACK_WRITE_SMALL_TOK", 0);
    return v == 0 || v == 2 || v == 4 || v == 8 ? v : 0;
  }();
  return t;
}
int& write_small_max() {
  static int t = [] {
    const int v = env_int("KVPACK_WRITE_SMALL_MAX", 0);
    return v >= 0 ? v : 0;
  }();
  return t;
}

namespace cuda_detail {

// A token's slot -> the (page, kv head) block it lands in and its offset there. Padding (slot < 0) and slots
// outside the pool (reported in status bit 1, never written) give nullptr. Every write kernel goes through this.
__device__ __forceinline__ uint8_t* slot_block(int64_t slot, int64_t num_pages, int page_size, int num_kv_heads,
                                               int head, int64_t head_block_bytes, uint8_t* pool, int32_t* status,
                                               int& off) {
  // page_size is a power of two (make_layout checks it, write_kv again): shifts, not a 64-bit division (v64).
  const int sh = __ffs(page_size) - 1;
  if (slot < 0) return nullptr;
  if (slot >= (num_pages << sh)) {
    if (status) atomicOr(status, 1);
    return nullptr;
  }
  const int64_t page = slot >> sh;
  off = static_cast<int>(slot & (page_size - 1));
  return pool + (page * num_kv_heads + head) * head_block_bytes;
}

// A 16-byte load issued where it stands, beside the slot's load: plain and .nc loads whose values are used only after
// the slot's checks were sunk below the checks' EXIT by the compiler, i.e. issued only once the slot's load had
// returned (v63, sm_90a SASS); a relaxed gpu-scope load is not moved across it (LDG.E.128.STRONG.GPU, from L2: the
// inputs are read once).
__device__ __forceinline__ uint4 ld_early(const uint4* p) {
  uint4 r;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ int32_t ld_early(const int32_t* p) {
  int32_t r;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ float ld_early(const float* p) {
  float r;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(r) : "l"(p));
  return r;
}

// One thread per (token, kv head, K/V, octet): neighbouring threads write neighbouring 16/8/4-byte pieces of one
// token vector, so both the bf16 reads and the code writes are coalesced. Prefill (many tokens) and decode (one
// per sequence) are the same launch with a different num_tokens.
template <class P, int D>
__global__ void write_kv_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                                const int32_t* __restrict__ slots, int num_tokens, int num_kv_heads, int page_size,
                                int64_t head_block_bytes, int64_t num_pages, uint8_t* __restrict__ k_pool,
                                uint8_t* __restrict__ v_pool, FormatParams params, int32_t* status) {
  constexpr int kOct = D / 8;
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t total = int64_t{num_tokens} * num_kv_heads * 2 * kOct;
  if (idx >= total) return;
  const int octet = static_cast<int>(idx % kOct);
  int64_t r = idx / kOct;
  const int kv = static_cast<int>(r % 2);
  r /= 2;
  const int head = static_cast<int>(r % num_kv_heads);
  const int64_t tok = r / num_kv_heads;
  int off = 0;
  uint8_t* block = slot_block(slots[tok], num_pages, page_size, num_kv_heads, head, head_block_bytes, kv ? v_pool : k_pool,
                              status, off);
  if (!block) return;
  uint8_t* row = block + int64_t{off} * P::code_bytes(D);
  uint8_t* meta = block + int64_t{page_size} * P::code_bytes(D) + int64_t{off} * P::meta_bytes(D);
  const uint16_t* in = (kv ? v : k) + (tok * num_kv_heads + head) * D;
  P::encode8(in, octet, row, meta, params, head, kv == 1);
}

// Formats whose encoder works on slices (fp8: 8 elements, int4 and int4h: 32): one thread per (kv head, K/V, group of
// kEncodeElems elements) of kGroupTokens<P> consecutive tokens. Neighbouring threads read neighbouring 16-byte
// pieces of one token row and write neighbouring code bytes (coalesced, as before v64); a thread's tokens share its
// index arithmetic and its scale. Every load a thread makes (the scale, each token's slot and input) is issued
// before the first slot is checked (ld_early), so they are all in flight together: v63 found the compiler sinking
// plain loads below the slot checks' exits (bench/NOTES.md v63, v64).
template <class P>
inline constexpr int kGroupTokens = P::kEncodeElems >= 32 ? 2 : 4;  // 64-128 bytes of input in flight per thread
// (int4h's rotation exchanges values between the D / E lanes of one vector: every early return and skip below is the
// same for all of them, since they share the token, the kv head and so the slot.)

template <class P, int D>
__global__ void write_kv_group_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                                      const int32_t* __restrict__ slots, int num_tokens, int num_kv_heads,
                                      int page_size, int64_t head_block_bytes, int64_t num_pages,
                                      uint8_t* __restrict__ k_pool, uint8_t* __restrict__ v_pool, FormatParams params,
                                      int32_t* status) {
  // (instantiated for every format by the dispatch; only formats with kEncodeElems > 0 launch it)
  constexpr int E = P::kEncodeElems > 0 ? P::kEncodeElems : 8, kGroups = D / E, U = kGroupTokens<P>;
  // The launcher keeps ceil(num_tokens / U) x per_token threads below 2^31: 32-bit index arithmetic.
  const uint32_t per_token = static_cast<uint32_t>(num_kv_heads) * 2 * kGroups;
  const uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t tile = idx / per_token, part = idx - tile * per_token;
  const int tok0 = static_cast<int>(tile) * U;
  if (tok0 >= num_tokens) return;
  const int grp = static_cast<int>(part % kGroups);
  const int kv = static_cast<int>((part / kGroups) % 2);
  const int head = static_cast<int>(part / kGroups / 2);
  const float* scale_p = P::group_scale(params, head, kv == 1);
  const float scale = scale_p ? ld_early(scale_p) : 1.0f;
  const uint16_t* in0 = (kv ? v : k) + (int64_t{tok0} * num_kv_heads + head) * D + grp * E;
  const int64_t tok_stride = int64_t{num_kv_heads} * D;
  int32_t slot[U];
  uint4 raw[U][E / 8];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (tok0 + u >= num_tokens) break;
    slot[u] = ld_early(slots + tok0 + u);
    const uint4* in = reinterpret_cast<const uint4*>(in0 + u * tok_stride);
#pragma unroll
    for (int i = 0; i < E / 8; ++i) raw[u][i] = ld_early(in + i);
  }
  const float ctx = P::group_ctx(scale);
  uint8_t* pool = kv ? v_pool : k_pool;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (tok0 + u >= num_tokens) break;
    int off = 0;
    uint8_t* block = slot_block(slot[u], num_pages, page_size, num_kv_heads, head, head_block_bytes, pool, status, off);
    if (!block) continue;
    float x[E];
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
      const uint32_t w[4] = {raw[u][i].x, raw[u][i].y, raw[u][i].z, raw[u][i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        x[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
        x[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      }
    }
    P::template group_transform<D>(x, grp);  // int4h: the vector's rotation, across its D / E lanes
    P::encode_group(x, grp, block + int64_t{off} * P::code_bytes(D),
                    block + int64_t{page_size} * P::code_bytes(D) + int64_t{off} * P::meta_bytes(D), ctx);
  }
}

// q formats, the launches q_write_kind does not give the small kernel: one CTA of 512 threads per (tile of tokens,
// kv head, K|V). The head's forward transform F is staged in shared memory once per CTA. Two forms by launch size
// (QWriteKind):
//   kRows (under kQTilesFrom tokens, where the small grid would not fit 1.5 waves: 32q/8kv 193-511 tokens): tiles
//     of 32 tokens, lanes = tokens, each warp its D/16 rows together (transform_rows; every F read a broadcast)
//     (v13b);
//   kTiles (prefill): tiles of 64 tokens, each thread a register tile of D/32 rows x 4 tokens (dot_tile: 16-byte
//     loads of F and of the centred inputs, rows padded to D + 4, 8 shared loads per 64 FMAs instead of one load
//     per FMA) (v16: prefill 1.27x; on 16-64-token launches its 64-token tiles were 0.78-0.83x, hence kRows there).
// The scale byte's search runs one thread per (token, candidate), the pick one thread per token; then one thread per
// (token, group of 8 channels) quantises its group and writes its bytes. Bit-identical to the CPU encoder by
// construction in every form: each coefficient is summed over c in order by the block core (transform_rows /
// dot_tile), the scale byte is its scale_byte_of (as scale_byte_rms, scale_error per candidate, scale_pick), each
// group's bytes its quantize_group (what quantize() runs group by group). The other launches (decode steps; v62: up
// to 511 tokens while the small grid fits 1.5 waves) take write_kv_q_small_kernel below. History in bench/NOTES.md.
constexpr int kQThreads = 512;
constexpr int kQTilesFrom = 512;  // PagedWriteGpu.ByteExactVsCpuEncoder's launches fall on both sides
// kSmall: write_kv_q_small_kernel (below); kRows and kTiles: write_kv_q_kernel's two forms.
enum class QWriteKind { kSmall, kRows, kTiles };
template <int D, QWriteKind K>
struct QWriteGeo {
  static_assert(K != QWriteKind::kSmall, "the small kernel's geometry is QSmallGeo");
  static constexpr bool kTiles = K == QWriteKind::kTiles;
  static constexpr int kTok = kTiles ? 64 : 32;                       // tokens per CTA
  static constexpr int kF = kTiles ? D + 4 : D;                       // F's row stride
  static constexpr int kRow = kTiles ? D + 4 : D + 1;                 // rows of the centred inputs / coefficients
  // F, then t_s, then y_s (kTiles writes the coefficients over t_s once all are computed).
  static constexpr size_t kSmem = sizeof(float) * (size_t(D) * kF + (kTiles ? 1 : 2) * size_t(kTok) * kRow);
};
// The lane layout's stores (block/q_lanes.h), the last phase of every q write kernel: one thread per (token, piece)
// of the first n tokens, the piece's bits from the token's codes (code_of(t, c), channel c) and scale byte e_of(t),
// one 16- or 8-bit store into its unit (units_s[t], nullptr: not written) at the token's index tin_s[t]. A piece
// holds bits of its token only, so tokens written by other launches or threads are never touched. The offsets, bits
// and sizes all come from the one layout of the token's side (K or V).
template <class P, int D, class EOf, class CodeOf>
__device__ __forceinline__ void store_pieces(int n, int kv, uint8_t* const* units_s, const uint8_t* tin_s, EOf&& e_of,
                                             CodeOf&& code_of) {
  constexpr int kLaneB2 = lane_bits_x2(P::kFormat);
  static_assert(kLaneB2 != 0, "the q formats are stored in the lane layout");
  using L = block::QLanes<kLaneB2, D, false>;
  using LV = block::QLanes<kLaneB2, D, true>;
  static_assert(L::kPieces == LV::kPieces, "K and V tokens own as many pieces");
  for (int i = threadIdx.x; i < n * L::kPieces; i += blockDim.x) {
    const int tt = i / L::kPieces, j = i % L::kPieces;
    uint8_t* unit = units_s[tt];
    if (!unit) continue;
    auto code = [&](int c) { return code_of(tt, c); };
    auto store = [&]<class Lx>() {
      const int o = Lx::piece_offset(tin_s[tt], j);
      const uint16_t h = Lx::piece_value_of(code, e_of(tt), j);
      if (Lx::piece_bytes(j) == 2) *reinterpret_cast<uint16_t*>(unit + o) = h;
      else unit[o] = static_cast<uint8_t>(h);
    };
    if (kv) store.template operator()<LV>();
    else store.template operator()<L>();
  }
}

// decode_step: the query preparation, launched with PDL behind the step's write (lean_q_prep_kernel), may start as
// soon as every CTA of the write's grid has started. It reads nothing the write stores, and it waits for the write's
// grid to complete before it lets the lean kernel (which reads the new tokens' pages) start. A no-op without PDL.
__device__ __forceinline__ void write_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <class P, int D, QWriteKind K>
__global__ void __launch_bounds__(kQThreads) write_kv_q_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                                                               const int32_t* __restrict__ slots, int num_tokens,
                                                               int num_kv_heads, int page_size, int64_t head_block_bytes,
                                                               int64_t num_pages, uint8_t* __restrict__ k_pool,
                                                               uint8_t* __restrict__ v_pool, FormatParams params,
                                                               int32_t* status) {
  using Block = typename P::template Block<D>;
  using G = QWriteGeo<D, K>;
  constexpr int kCode = P::code_bytes(D), kMeta = P::meta_bytes(D), kGroups = D / 8;
  constexpr int kTok = G::kTok, kF = G::kF, kRow = G::kRow;
  extern __shared__ __align__(16) float qsm[];
  float* F = qsm;                                    // [D][kF] row-major
  float* t_s = F + D * kF;                           // [kTok][kRow] centred inputs
  float* y_s = G::kTiles ? t_s : t_s + kTok * kRow;  // [kTok][kRow] transformed coefficients
  __shared__ float inv_tau_s[kTok];
  __shared__ uint8_t* codes_s[kTok];  // each token's code row in the pool (q4, q3.5, q3: its unit), nullptr when not written
  // q4, q3.5, q3 (lane layout, block/q_lanes.h): each token's logical block (the block core's code bytes and scale byte),
  // built here first, then stored piece by piece (16-bit halves, 8-bit bytes, q3.5's nibble bytes) into its unit.
  constexpr int kLaneB2 = lane_bits_x2(P::kFormat);
  constexpr bool kLanes = kLaneB2 != 0;
  constexpr int kBlk = kLanes ? kCode + 1 : 1;
  __shared__ uint8_t blk_s[kLanes ? kTok : 1][kBlk];
  __shared__ uint8_t tin_s[kLanes ? kTok : 1];  // the token's index in its unit
  __shared__ int goff_s[kGroups];
  // The per-channel tables the scale search and the quantiser read for every candidate and channel (17 x D reads
  // per token), staged once per CTA: the same values, so the same bits, without a global-memory load in the
  // search's chains.
  __shared__ float step_s[D], inv_step_s[D], rmsw_s[D];
  __shared__ uint8_t gbits_s[kGroups];
  write_allow_dependents();
  const int head = static_cast<int>(blockIdx.y >> 1), kv = static_cast<int>(blockIdx.y & 1);
  const int64_t tok0 = int64_t{blockIdx.x} * kTok;
  const block::QParams p0 = (kv ? params.qv : params.qk).head(head, D);
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    step_s[c] = p0.step[c];
    inv_step_s[c] = p0.inv_step[c];
    rmsw_s[c] = p0.rms_weight[c];
    if (c < kGroups) gbits_s[c] = p0.group_bits[c];
  }
  // F's D x D floats: every thread's loads issued before its stores (one L2 round trip per CTA, not D * D / 4 /
  // kQThreads of them in a row: the 1-8-token decode step is this kernel's latency, v41).
  constexpr int kFv = D * D / 4 / kQThreads;
  static_assert(kFv * kQThreads == D * D / 4, "F is whole float4s per thread");
  float4 fv[kFv];
#pragma unroll
  for (int k = 0; k < kFv; ++k) fv[k] = __ldg(reinterpret_cast<const float4*>(p0.fwd) + threadIdx.x + k * kQThreads);
  // The slot of the thread's token (threads < kTok), read now: it is used after the search.
  const int32_t my_slot = threadIdx.x < kTok && tok0 + threadIdx.x < num_tokens ? slots[tok0 + threadIdx.x] : -1;
#pragma unroll
  for (int k = 0; k < kFv; ++k) {
    const int i = threadIdx.x + k * kQThreads;
    const float4 f = fv[k];
    const int r = (4 * i) / D, c = (4 * i) % D;
    *reinterpret_cast<float4*>(F + r * kF + c) = f;
  }
  const uint16_t* src = kv ? v : k;
  // Compile-time trip count (kQThreads, not blockDim.x): unrolled, the loads of all iterations are in flight together.
#pragma unroll
  for (int i = threadIdx.x; i < kTok * D; i += kQThreads) {
    const int tt = i / D, c = i % D;
    const int64_t tok = tok0 + tt;
    const float x = tok < num_tokens ? bf16_to_f32(src[(tok * num_kv_heads + head) * D + c]) : 0.f;
    t_s[tt * kRow + c] = Block::centre(p0, x, c);
  }
  if (threadIdx.x < kGroups) goff_s[threadIdx.x] = Block::group_offset(p0, threadIdx.x);
  __syncthreads();
  block::QParams p = p0;
  p.fwd = F;  // kRows reads F's rows through transform_rows (row-major, stride D)
  p.step = step_s, p.inv_step = inv_step_s, p.rms_weight = rmsw_s, p.group_bits = gbits_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if constexpr (G::kTiles) {
    // Thread = (row group rg: rows rg + 32 i, token group tg: tokens tg + 16 j); a warp's lanes share two row
    // groups (their F quads 4 banks apart) and cover 16 token groups (their input quads on distinct banks per
    // 8-lane phase).
    constexpr int R = D / 32, T = kTok / 16;
    static_assert(kQThreads == 16 * 32 && 32 * R == D && 16 * T == kTok, "512 threads = 32 row groups x 16 token groups");
    const int tg = lane % 16, rg = 2 * warp + lane / 16;
    float yt[R][T];
    Block::template dot_tile<R, T>(F + rg * kF, 32 * kF, t_s + tg * kRow, 16 * kRow, yt);
    __syncthreads();  // every thread has read t_s: it becomes y_s
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < T; ++j) y_s[(tg + 16 * j) * kRow + rg + 32 * i] = yt[i][j];
  } else {
    // Lanes = tokens; warp w computes rows w, w + 16, ... together (D / 16 independent FMA chains per lane).
    static_assert(kTok == 32, "lanes are tokens");
    constexpr int kRowsPerWarp = D / (kQThreads / 32);
    static_assert(kRowsPerWarp * (kQThreads / 32) == D, "warps x rows = D");
    float yr[kRowsPerWarp];
    Block::template transform_rows<kRowsPerWarp>(p, t_s + lane * kRow, warp, kQThreads / 32, yr);
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) y_s[lane * kRow + warp + j * (kQThreads / 32)] = yr[j];
  }
  __syncthreads();
  // The scale byte's search (the block core's scale_byte_of, spread over threads): one thread per token finds the
  // RMS choice e0, one thread per (token, candidate) computes that candidate's error with the core's scale_error,
  // and the token's thread picks with the core's scale_pick: the same errors in the same order, so the same byte.
  constexpr int kCand = Block::kScaleCandidates;
  __shared__ uint8_t e0_s[kTok];
  __shared__ float serr_s[kTok * kCand];
  if (threadIdx.x < kTok && tok0 + threadIdx.x < num_tokens)
    e0_s[threadIdx.x] = Block::scale_byte_rms(p, y_s + threadIdx.x * kRow);
  __syncthreads();
  for (int i = threadIdx.x; i < kTok * kCand; i += blockDim.x) {
    const int tt = i / kCand;
    if (tok0 + tt >= num_tokens) continue;
    const int e = Block::scale_candidate(e0_s[tt], i % kCand);
    if (e >= 0) serr_s[i] = Block::scale_error(p, y_s + tt * kRow, static_cast<uint8_t>(e));
  }
  __syncthreads();
  // Per token (threads < kTok, one per token): its slot resolved once, the scale byte stored, 1/tau and the code
  // row shared with the token's group threads.
  if (threadIdx.x < kTok) {
    const int64_t tok = tok0 + threadIdx.x;
    const float* errs = serr_s + threadIdx.x * kCand;
    const uint8_t e =
        tok < num_tokens ? Block::scale_pick(e0_s[threadIdx.x], [&](int j) { return errs[j]; }) : uint8_t{0};
    inv_tau_s[threadIdx.x] = block::decode_scale_byte_inv(e);
    int off = 0;
    uint8_t* blk = tok < num_tokens ? slot_block(my_slot, num_pages, page_size, num_kv_heads, head, head_block_bytes,
                                                 kv ? v_pool : k_pool, status, off)
                                    : nullptr;
    if constexpr (kLanes) {
      blk_s[threadIdx.x][kCode] = e;
      tin_s[threadIdx.x] = static_cast<uint8_t>(off % 16);
      codes_s[threadIdx.x] = blk ? blk + int64_t{off / 16} * 16 * (kCode + 1) : nullptr;
    } else {
      if (blk) blk[int64_t{page_size} * kCode + int64_t{off} * kMeta] = e;
      codes_s[threadIdx.x] = blk ? blk + int64_t{off} * kCode : nullptr;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTok * kGroups; i += blockDim.x) {
    const int tt = i / kGroups, g = i % kGroups;
    if (uint8_t* row = codes_s[tt])
      Block::quantize_group(p, y_s + tt * kRow, inv_tau_s[tt], g, goff_s[g], kLanes ? blk_s[tt] : row);
  }
  if constexpr (kLanes) {
    // The pieces, from each token's logical block.
    __syncthreads();
    store_pieces<P, D>(kTok, kv, codes_s, tin_s, [&](int t) { return blk_s[t][kCode]; }, [&](int t, int c) {
      return Block::group_code(blk_s[t] + goff_s[c / 8], gbits_s[c / 8], c % 8);
    });
  }
}

// Measurement builds only (-DCMAKE_CUDA_FLAGS=-DKVPACK_WRITE_STAMPS, bench/NOTES.md v62): the small kernel's thread 0
// reads clock64() at its start, after each of its 6 barriers and at its end, and appends one record per CTA:
// blockIdx.x, blockIdx.y, the tile's tokens, %smid, %globaltimer at the end, then the 8 clocks (kWStampWords words;
// `kvpack bench` with KVPACK_WRITE_STAMPS_OUT=<file> appends them to <file> through write_stamps_dump, and
// bench/tools/write_stamps.py reads them). Without the macro the kernel is unchanged (the same SASS).
#ifdef KVPACK_WRITE_STAMPS
constexpr unsigned kWStampCap = 1u << 14;
constexpr int kWStampWords = 13;
__device__ unsigned long long g_wstamps[kWStampCap * kWStampWords];
__device__ unsigned int g_wstamp_n;
__device__ __forceinline__ void wstamp_record(const long long (&c)[8], int nt) {
  const unsigned i = atomicAdd(&g_wstamp_n, 1u);
  if (i >= kWStampCap) return;
  unsigned long long* r = g_wstamps + size_t(i) * kWStampWords;
  unsigned smid;
  unsigned long long t;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  r[0] = blockIdx.x, r[1] = blockIdx.y, r[2] = static_cast<unsigned long long>(nt), r[3] = smid, r[4] = t;
  for (int j = 0; j < 8; ++j) r[5 + j] = static_cast<unsigned long long>(c[j]);
}
#define KVPACK_WSTAMP_DECL long long wst_[8] = {}
#define KVPACK_WSTAMP(i) \
  do {                   \
    if (threadIdx.x == 0) wst_[i] = clock64(); \
  } while (0)
#define KVPACK_WSTAMP_RECORD(nt) \
  do {                           \
    if (threadIdx.x == 0) wstamp_record(wst_, nt); \
  } while (0)
#else
#define KVPACK_WSTAMP_DECL
#define KVPACK_WSTAMP(i) ((void)0)
#define KVPACK_WSTAMP_RECORD(nt) ((void)0)
#endif

// q formats, the launches q_write_kind gives it (decode steps; v60, v62, bench/NOTES.md): one CTA of 512
// threads per (tile of T tokens, kv head, K|V), built for latency. Every phase is either spread over all threads or
// one ordered chain per (token[, candidate]) run by separate lanes or warps at once:
//   1. every global load issued before any shared-memory store (F, the inputs and their means, the thread's
//      channel's constants);
//   2. the transform: thread (row c, token pair q), dot_tile<1, 2> on F's padded rows (16-byte loads, no bank
//      conflicts), only the pairs that hold tokens;
//   3. the RMS choice e0: warp t runs token t's ordered sum (all lanes the same chain, broadcast reads), then lane j
//      decodes candidate j's tau and 1/tau;
//   4. every (token, candidate, channel) difference (the core's scale_diff) on its own thread, into a padded row per
//      (token, candidate) (over F's space, dead by then);
//   5. thread (token, candidate) sums its row in order (scale_error_by, 16-byte loads, rows 4 banks apart);
//   6. thread (channel, token) picks the token's byte (scale_pick, the same on every thread) and computes its code;
//   7. store_pieces.
// The same sums in the same order as the CPU encoder (transform_row, scale_byte_rms, scale_error, scale_pick,
// code_of), so the same bytes.
template <int D, int T, int kCand>
struct QSmallGeo {
  static constexpr int kRow = D + 4;  // padded rows: 16-byte aligned, consecutive rows 4 banks apart
  static constexpr int kS = T * kCand;
  static constexpr int kFRows = D + T > kS ? D + T : kS;  // F and the inputs, later the differences
  // F [D][kRow] + t_s [T][kRow] (later d_s [kS][kRow]), then y_s and wy_s [T][kRow].
  static constexpr size_t kSmem = sizeof(float) * size_t(kRow) * (kFRows + 2 * T);
};
template <class P, int D, int T>
__global__ void __launch_bounds__(kQThreads)
    write_kv_q_small_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                            const int32_t* __restrict__ slots, int num_tokens, int num_kv_heads, int page_size,
                            int64_t head_block_bytes, int64_t num_pages, uint8_t* __restrict__ k_pool,
                            uint8_t* __restrict__ v_pool, FormatParams params, int32_t* status) {
  using Block = typename P::template Block<D>;
  constexpr int kCand = Block::kScaleCandidates, kCode = P::code_bytes(D);
  using G = QSmallGeo<D, T, kCand>;
  constexpr int kRow = G::kRow, kS = G::kS, kQ = kQThreads / D;  // kQ: threads per channel
  static_assert(T % 2 == 0 && T / 2 <= kQ && T * D / 2 <= kQThreads && kS <= kQThreads && T <= kQThreads / 32,
                "one pass of each phase covers the tile (phase 3: one warp per token)");
  extern __shared__ __align__(16) float qsm[];
  float* F = qsm;                              // [D][kRow]
  float* t_s = qsm + D * kRow;                 // [T][kRow] centred inputs
  float* d_s = qsm;                            // [kS][kRow] differences (after the transform)
  float* y_s = qsm + G::kFRows * kRow;         // [T][kRow] coefficients
  float* wy_s = y_s + T * kRow;                // [T][kRow] their rms_term
  __shared__ float inv_tau_s[kS], tau_s[kS], err_s[kS];
  __shared__ int16_t cand_s[kS];               // candidate j's scale byte, -1 outside 0..255
  __shared__ int32_t slot_s[T];
  __shared__ uint8_t e0_s[T], e_s[T], tin_s[T];
  __shared__ uint8_t* units_s[T];
  __shared__ uint8_t code_s[T][D];
  write_allow_dependents();
  KVPACK_WSTAMP_DECL;
  KVPACK_WSTAMP(0);
  const int head = static_cast<int>(blockIdx.y >> 1), kv = static_cast<int>(blockIdx.y & 1);
  const int64_t tok0 = int64_t{blockIdx.x} * T;
  const int nt = static_cast<int>(num_tokens - tok0 < T ? num_tokens - tok0 : T);
  const block::QParams p = (kv ? params.qv : params.qk).head(head, D);
  const int tid = threadIdx.x, c = tid % D, q = tid / D, lane = tid & 31, warp = tid >> 5;

  // 1. Global loads.
  constexpr int kFv = D * D / 4 / kQThreads;
  static_assert(kFv * kQThreads == D * D / 4, "F is whole float4s per thread");
  float4 fv[kFv];
#pragma unroll
  for (int i = 0; i < kFv; ++i) fv[i] = __ldg(reinterpret_cast<const float4*>(p.fwd) + tid + i * kQThreads);
  // Inputs by channel pairs (4-byte loads): thread tid < T D / 2 takes channels pc, pc + 1 of token pt.
  const int pt = 2 * tid / D, pc = 2 * tid % D;
  const bool has_in = tid < T * D / 2 && pt < nt;
  uint32_t xin = 0;
  float mu0 = 0.f, mu1 = 0.f;
  if (has_in) {
    xin = __ldg(reinterpret_cast<const uint32_t*>((kv ? v : k) + ((tok0 + pt) * num_kv_heads + head) * D + pc));
    mu0 = p.mean[pc], mu1 = p.mean[pc + 1];
  }
  const float step_c = p.step[c], inv_step_c = p.inv_step[c], w_c = p.rms_weight[c];
  const int b_c = p.group_bits[c / 8];
  const int32_t my_slot = tid < nt ? slots[tok0 + tid] : -1;
  // Stores: F's rows (coalesced 16-byte stores), the centred inputs (rows of tokens past the launch's: finite zeros).
#pragma unroll
  for (int i = 0; i < kFv; ++i) {
    const int f = 4 * (tid + i * kQThreads);
    *reinterpret_cast<float4*>(F + (f / D) * kRow + f % D) = fv[i];
  }
  if (tid < T * D / 2) {
    t_s[pt * kRow + pc] = has_in ? Block::centre_of(__uint_as_float(xin << 16), mu0) : 0.f;
    t_s[pt * kRow + pc + 1] = has_in ? Block::centre_of(__uint_as_float(xin & 0xffff0000u), mu1) : 0.f;
  }
  if (tid < nt) slot_s[tid] = my_slot;
  __syncthreads();
  KVPACK_WSTAMP(1);

  // 2. The transform: thread (row c, pair q), tokens 2q and 2q + 1 (q is warp-uniform: D >= 64).
  if (2 * q < nt) {
    float yt[1][2];
    Block::template dot_tile<1, 2>(F + c * kRow, 0, t_s + 2 * q * kRow, kRow, yt);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      y_s[(2 * q + j) * kRow + c] = yt[0][j];
      wy_s[(2 * q + j) * kRow + c] = Block::rms_term(w_c, yt[0][j]);
    }
  }
  __syncthreads();
  KVPACK_WSTAMP(2);

  // 3. e0: warp t < nt, every lane token t's ordered sum; lane j < kCand decodes candidate j.
  if (warp < nt) {
    const float* yr = y_s + warp * kRow;
    const float* wr = wy_s + warp * kRow;
    const uint8_t e0 = Block::template scale_byte_rms_by<8>([&](int cc, float(&wq)[4], float(&yq)[4]) {
      block::load4(wr + cc, wq);
      block::load4(yr + cc, yq);
    });
    if (lane < kCand) {
      const int e = Block::scale_candidate(e0, lane), i = warp * kCand + lane;
      cand_s[i] = static_cast<int16_t>(e);
      if (e >= 0) {
        inv_tau_s[i] = block::decode_scale_byte_inv(static_cast<uint8_t>(e));
        tau_s[i] = block::decode_scale_byte(static_cast<uint8_t>(e));
      }
    }
    if (lane == 0) e0_s[warp] = e0;
  }
  __syncthreads();
  KVPACK_WSTAMP(3);

  // 4. Differences: thread (channel c, q), pairs i = q, q + kQ, ... (i warp-uniform: broadcast reads of i's tables).
  for (int i = q; i < nt * kCand; i += kQ) {
    if (cand_s[i] < 0) continue;
    d_s[i * kRow + c] =
        Block::scale_diff(y_s[(i / kCand) * kRow + c], inv_tau_s[i], tau_s[i], step_c, inv_step_c, b_c);
  }
  __syncthreads();
  KVPACK_WSTAMP(4);

  // 5. Each valid candidate's error, its row summed in order.
  if (tid < nt * kCand && cand_s[tid] >= 0) {
    const float* dr = d_s + tid * kRow;
    err_s[tid] = Block::template scale_error_by<8>([&](int cc, float(&dq)[4]) { block::load4(dr + cc, dq); });
  }
  __syncthreads();
  KVPACK_WSTAMP(5);

  // 6. The pick (every thread of the token the same), the codes; thread c = 0 resolves the token's slot. The picked
  // byte's 1/tau is its candidate's, decoded in phase 3.
  for (int tt = q; tt < nt; tt += kQ) {
    const float* errs = err_s + tt * kCand;
    const uint8_t e0 = e0_s[tt], e = Block::scale_pick(e0, [&](int j) { return errs[j]; });
    const int j = Block::scale_candidate_index(e0, e);
    const float inv_tau = inv_tau_s[tt * kCand + j];
    code_s[tt][c] =
        b_c >= 1 && b_c <= 8 ? static_cast<uint8_t>(Block::code_of_b(y_s[tt * kRow + c], inv_tau, inv_step_c, b_c))
                             : uint8_t{0};
    if (c == 0) {
      int off = 0;
      uint8_t* blk = slot_block(slot_s[tt], num_pages, page_size, num_kv_heads, head, head_block_bytes,
                                kv ? v_pool : k_pool, status, off);
      e_s[tt] = e;
      tin_s[tt] = static_cast<uint8_t>(off % 16);
      units_s[tt] = blk ? blk + int64_t{off / 16} * 16 * (kCode + 1) : nullptr;
    }
  }
  __syncthreads();
  KVPACK_WSTAMP(6);

  // 7. The stores.
  store_pieces<P, D>(nt, kv, units_s, tin_s, [&](int t) { return e_s[t]; },
                     [&](int t, int ch) { return static_cast<int>(code_s[t][ch]); });
  KVPACK_WSTAMP(7);
  KVPACK_WSTAMP_RECORD(nt);
}

// One q write kernel's launch: its dynamic shared memory allowed once, then one CTA of kQThreads per (tile of
// tok_per_cta tokens, kv head, K|V).
template <auto Kernel>
void launch_q_kernel(size_t smem, int tok_per_cta, const PagedLayout& l, const WriteArgs& a, cudaStream_t st) {
  static std::once_flag once;
  std::call_once(once, [smem] {
    cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    cudaGetLastError();
  });
  const dim3 grid(static_cast<unsigned>((a.num_tokens + tok_per_cta - 1) / tok_per_cta),
                  static_cast<unsigned>(l.num_kv_heads * 2));
  Kernel<<<grid, kQThreads, smem, st>>>(a.k, a.v, a.slot_mapping, a.num_tokens, l.num_kv_heads, l.page_size,
                                        l.head_block_bytes, a.num_pages, a.k_pool, a.v_pool, a.params, a.status);
}
template <class P, int D, int T>
void launch_write_q_small(const PagedLayout& l, const WriteArgs& a, cudaStream_t st) {
  launch_q_kernel<write_kv_q_small_kernel<P, D, T>>(QSmallGeo<D, T, P::template Block<D>::kScaleCandidates>::kSmem, T,
                                                   l, a, st);
}
template <class P, int D, QWriteKind K>
void launch_write_q_as(const PagedLayout& l, const WriteArgs& a, cudaStream_t st) {
  launch_q_kernel<write_kv_q_kernel<P, D, K>>(QWriteGeo<D, K>::kSmem, QWriteGeo<D, K>::kTok, l, a, st);
}
// The small kernel's resident CTAs per SM at tile T (its dynamic shared memory opted in; at least 1), once per
// instance.
template <class P, int D, int T>
int small_ctas_per_sm() {
  static const int n = std::max(kernel_opt_in(write_kv_q_small_kernel<P, D, T>, kQThreads,
                                              QSmallGeo<D, T, P::template Block<D>::kScaleCandidates>::kSmem),
                                1);
  return n;
}
// The small kernel's tile: write_small_tokens(), or with 0 (the default since v62) the smallest tile whose grid,
// ceil(n / T) x 2 H CTAs, fits one wave (v61: at 8 tokens a CTA of 2 tokens took 7.2 us, of 4 9.0 and of 8 13.7, so
// fewer tokens per CTA pay while the grid fits; at 64 tokens of 32q/8kv, tile 4 12.8 us, tile 2 16.1), else 8.
template <class P, int D>
int small_tile(int num_tokens, int num_kv_heads) {
  const int t = write_small_tokens();
  if (t != 0) return t;
  const int64_t slots = int64_t{device_sm_count()};
  auto fits = [&](int tile, int per_sm) {
    return int64_t{(num_tokens + tile - 1) / tile} * 2 * num_kv_heads <= slots * per_sm;
  };
  if (fits(2, small_ctas_per_sm<P, D, 2>())) return 2;
  if (fits(4, small_ctas_per_sm<P, D, 4>())) return 4;
  return 8;
}
// The kernel a q-format launch of n tokens over H kv heads takes (launch_write_q, and the name benchmark rows
// record). With write_small_max() 0 (the default since v62) launches under kQTilesFrom take the small kernel while its
// grid in tiles of 8 tokens, ceil(n / 8) x 2 H CTAs, fits 1.5 waves, else kRows. v62 (H100, 2 CTAs per SM, 264
// slots): 32q/8kv 128 tokens (256 CTAs) 21.4 us against kRows' 36.1, 256 tokens (512) 38.9 against 37.2; 9q/3kv 511
// tokens (384) 17.2 against 19.9; 8q/1kv 511 tokens (128) 12.9 against 35.7. A fixed write_small_max() (tests,
// KVPACK_WRITE_SMALL_MAX) sends every launch of up to that many tokens to the small kernel.
template <class P, int D>
QWriteKind q_write_kind(int n, int num_kv_heads) {
  if (const int m = write_small_max(); m > 0)
    return n <= m ? QWriteKind::kSmall : n < kQTilesFrom ? QWriteKind::kRows : QWriteKind::kTiles;
  if (n >= kQTilesFrom) return QWriteKind::kTiles;
  const int64_t ctas = int64_t{(n + 7) / 8} * 2 * num_kv_heads;
  return 2 * ctas <= 3 * int64_t{device_sm_count()} * small_ctas_per_sm<P, D, 8>() ? QWriteKind::kSmall
                                                                                   : QWriteKind::kRows;
}
template <class P, int D>
void launch_write_q(const PagedLayout& l, const WriteArgs& a, cudaStream_t st) {
  const QWriteKind kind = q_write_kind<P, D>(a.num_tokens, l.num_kv_heads);
  if (kind == QWriteKind::kSmall) {
    const int t = small_tile<P, D>(a.num_tokens, l.num_kv_heads);
    if (t == 2) launch_write_q_small<P, D, 2>(l, a, st);
    else if (t == 4) launch_write_q_small<P, D, 4>(l, a, st);
    else launch_write_q_small<P, D, 8>(l, a, st);
  } else if (kind == QWriteKind::kRows) launch_write_q_as<P, D, QWriteKind::kRows>(l, a, st);
  else launch_write_q_as<P, D, QWriteKind::kTiles>(l, a, st);
}

// Sink tokens: one thread per (token, kv head, K/V, 16-byte piece) copies the bf16 vector to its sink slot.
__global__ void write_sinks_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                                   const int32_t* __restrict__ sink_slots, int num_tokens, int num_kv_heads,
                                   int head_dim, int64_t num_sink_slots, uint16_t* __restrict__ k_sinks,
                                   uint16_t* __restrict__ v_sinks, int32_t* status) {
  write_allow_dependents();
  const int pieces = head_dim / 8;
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= int64_t{num_tokens} * num_kv_heads * 2 * pieces) return;
  const int piece = static_cast<int>(idx % pieces);
  int64_t r = idx / pieces;
  const int kv = static_cast<int>(r % 2);
  r /= 2;
  const int head = static_cast<int>(r % num_kv_heads);
  const int64_t tok = r / num_kv_heads;
  const int64_t slot = sink_slots[tok];
  if (slot < 0) return;
  if (slot >= num_sink_slots) {
    if (status) atomicOr(status, 4);
    return;
  }
  const uint4* src = reinterpret_cast<const uint4*>((kv ? v : k) + (tok * num_kv_heads + head) * head_dim) + piece;
  uint4* dst = reinterpret_cast<uint4*>((kv ? v_sinks : k_sinks) + (slot * num_kv_heads + head) * head_dim) + piece;
  *dst = *src;
}

// q formats: one thread per stored token vector through the block core's decoder (model basis).
template <class P, int D>
__global__ void dequant_pages_q_kernel(const uint8_t* __restrict__ pool, int64_t num_pages, int num_kv_heads,
                                       int page_size, int64_t head_block_bytes, bool is_v, FormatParams params,
                                       float* __restrict__ out) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= num_pages * num_kv_heads * page_size) return;
  const int off = static_cast<int>(idx % page_size);
  const int64_t r = idx / page_size;  // page * num_kv_heads + head
  const int head = static_cast<int>(r % num_kv_heads);
  const uint8_t* block = pool + r * head_block_bytes;
  const block::QParams qp = (is_v ? params.qv : params.qk).head(head, D);
  if constexpr (constexpr int kLaneB2 = lane_bits_x2(P::kFormat)) {
    // The lane layout: the token's pieces back into its logical block (block/q_lanes.h), then the block core.
    const uint8_t* unit = block + int64_t{off / 16} * 16 * (P::code_bytes(D) + 1);
    int k[D];
    uint8_t lb[P::code_bytes(D) + 1], e = 0;
    if (is_v) block::QLanes<kLaneB2, D, true>::load_token(unit, off % 16, k, e);
    else block::QLanes<kLaneB2, D, false>::load_token(unit, off % 16, k, e);
    P::template Block<D>::pack(qp, k, lb);
    lb[P::code_bytes(D)] = e;
    P::template Block<D>::decode(qp, lb, lb + P::code_bytes(D), out + idx * D);
  } else {
    P::template Block<D>::decode(qp, block + int64_t{off} * P::code_bytes(D),
                                 block + int64_t{page_size} * P::code_bytes(D) + int64_t{off} * P::meta_bytes(D),
                                 out + idx * D);
  }
}

template <class P, int D>
__global__ void dequant_pages_kernel(const uint8_t* __restrict__ pool, int64_t num_pages, int num_kv_heads,
                                     int page_size, int64_t head_block_bytes, bool is_v, FormatParams params,
                                     float* __restrict__ out) {
  constexpr int kOct = D / 8;
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t total = num_pages * num_kv_heads * page_size * kOct;
  if (idx >= total) return;
  const int octet = static_cast<int>(idx % kOct);
  int64_t r = idx / kOct;
  const int off = static_cast<int>(r % page_size);
  r /= page_size;  // r = page * num_kv_heads + head
  const int head = static_cast<int>(r % num_kv_heads);
  const uint8_t* block = pool + r * head_block_bytes;
  const uint8_t* row = block + int64_t{off} * P::code_bytes(D);
  const uint8_t* meta = block + int64_t{page_size} * P::code_bytes(D) + int64_t{off} * P::meta_bytes(D);
  float x[8];
  P::dequant8(row, octet, meta, x);
  // The stored value (in the stored basis: int4h stays rotated) = code value x octet scale x per-token scale x
  // per-head scale, through the kernel's own fused dequantiser; exact as long as at most one factor is not 1,
  // which holds for every format here (bf16: none, fp8: head scale, int4: octet scale).
  const float os = P::octet_scale(meta, octet);
  const float ts = is_v ? P::v_token_scale(meta) : P::k_token_scale(meta);
  const float hs = is_v ? P::out_scale(params, head) : P::q_scale(params, head);
  float* o = out + (r * page_size + off) * D + octet * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = x[i] * os * ts * hs;
}

}  // namespace cuda_detail

using namespace cuda_detail;

bool write_stamps_reset() {
#ifdef KVPACK_WRITE_STAMPS
  const unsigned zero = 0;
  KVPACK_CUDA_CHECK(cudaMemcpyToSymbol(g_wstamp_n, &zero, sizeof zero));
  return true;
#else
  return false;
#endif
}
bool write_stamps_dump(const char* path, const char* label) {
#ifdef KVPACK_WRITE_STAMPS
  append_stamp_records(path, label, &g_wstamp_n, g_wstamps, kWStampCap, kWStampWords);
  return true;
#else
  (void)path, (void)label;
  return false;
#endif
}

const char* write_kernel_name(Format f, int num_kv_heads, int head_dim, int num_tokens) {
  const char* name = "plain";
  KVPACK_DISPATCH_FORMAT(f, P, [&] {
    KVPACK_DISPATCH_HEAD_DIM(head_dim, D, [&] {
      if constexpr (P::kQ) {
        const QWriteKind kind = q_write_kind<P, D>(num_tokens, num_kv_heads);
        name = kind == QWriteKind::kSmall ? "q-small" : kind == QWriteKind::kRows ? "q-rows" : "q-tiles";
      }
    });
  });
  return name;
}

void write_kv(const PagedLayout& l, const WriteArgs& a, void* stream) {
  KVPACK_CU_CHECK(a.num_tokens >= 0, "write_kv: num_tokens {} < 0", a.num_tokens);
  if (a.num_tokens == 0) return;
  KVPACK_CU_CHECK(a.k && a.v, "write_kv: null K or V input");
  KVPACK_CU_CHECK(a.slot_mapping, "write_kv: null slot_mapping");
  KVPACK_CU_CHECK(a.k_pool && a.v_pool, "write_kv: null K or V page pool");
  KVPACK_CU_CHECK(a.num_pages > 0, "write_kv: num_pages {} must be > 0", a.num_pages);
  KVPACK_CU_CHECK(l.page_size > 0 && (l.page_size & (l.page_size - 1)) == 0,
                  "write_kv: layout page_size {} must be a power of two (16, 32, 64 or 128)", l.page_size);
  const int threads = 128;
  const int sink_tokens = format_info(l.format).sink_tokens;
  if (a.sink_slot_mapping) {
    KVPACK_CU_CHECK(sink_tokens > 0, "write_kv: format '{}' keeps no sink tokens, but sink_slot_mapping was given",
                    format_name(l.format));
    KVPACK_CU_CHECK(a.k_sinks && a.v_sinks && a.num_sink_rows > 0,
                    "write_kv: sink_slot_mapping needs k_sinks, v_sinks and num_sink_rows > 0");
  }
  KVPACK_DISPATCH_FORMAT(l.format, P, [&] {
    if constexpr (P::kQ)
      KVPACK_CU_CHECK(a.params.qk.valid() && a.params.qv.valid(),
                      "write_kv: format '{}' needs its calibrated parameters (params.qk and params.qv)",
                      format_name(l.format));
    constexpr bool kLanes = lane_bits_x2(P::kFormat) != 0;  // lane layout: codes and scale byte together
    KVPACK_CU_CHECK(l.lanes == kLanes &&
                        P::code_bytes(l.head_dim) + (kLanes ? P::meta_bytes(l.head_dim) : 0) == l.code_bytes_per_token &&
                        (kLanes ? 0 : P::meta_bytes(l.head_dim)) == l.meta_bytes_per_token,
                 "write_kv: layout token bytes ({} + {}) disagree with the kernel's format '{}'",
                 l.code_bytes_per_token, l.meta_bytes_per_token, format_name(l.format));
    KVPACK_DISPATCH_HEAD_DIM(l.head_dim, D, [&] {
      if constexpr (P::kQ) {
        launch_write_q<P, D>(l, a, static_cast<cudaStream_t>(stream));
      } else if constexpr (P::kVectorEncode && P::kEncodeElems > 0) {  // fp8, int4, int4h: encode_group on slices
        // Launches of at most `chunk` tokens keep the kernel's thread index below 2^31 (a chunk is ~33 M tokens at
        // 32q/8kv: one launch in practice).
        constexpr int E = P::kEncodeElems > 0 ? P::kEncodeElems : 8, U = kGroupTokens<P>;
        const int64_t per_token = int64_t{l.num_kv_heads} * 2 * (D / E);
        const int64_t chunk = std::max<int64_t>(U, (int64_t{INT32_MAX} - threads) / per_token * U);
        for (int64_t t0 = 0; t0 < a.num_tokens; t0 += chunk) {
          const int n = static_cast<int>(std::min<int64_t>(chunk, a.num_tokens - t0));
          const int64_t blocks = ((n + U - 1) / U * per_token + threads - 1) / threads;
          const int64_t in_off = t0 * l.num_kv_heads * D;
          write_kv_group_kernel<P, D><<<dim3(static_cast<unsigned>(blocks)), threads, 0,
                                        static_cast<cudaStream_t>(stream)>>>(
              a.k + in_off, a.v + in_off, a.slot_mapping + t0, n, l.num_kv_heads, l.page_size, l.head_block_bytes,
              a.num_pages, a.k_pool, a.v_pool, a.params, a.status);
        }
      } else {
        const int64_t total = int64_t{a.num_tokens} * l.num_kv_heads * 2 * (l.head_dim / 8);
        const int64_t blocks = (total + threads - 1) / threads;
        write_kv_kernel<P, D><<<dim3(static_cast<unsigned>(blocks)), threads, 0, static_cast<cudaStream_t>(stream)>>>(
            a.k, a.v, a.slot_mapping, a.num_tokens, l.num_kv_heads, l.page_size, l.head_block_bytes, a.num_pages,
            a.k_pool, a.v_pool, a.params, a.status);
      }
    });
  });
  if (a.sink_slot_mapping) {
    const int64_t total = int64_t{a.num_tokens} * l.num_kv_heads * 2 * (l.head_dim / 8);
    write_sinks_kernel<<<dim3(static_cast<unsigned>((total + 255) / 256)), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        a.k, a.v, a.sink_slot_mapping, a.num_tokens, l.num_kv_heads, l.head_dim, a.num_sink_rows * sink_tokens,
        a.k_sinks, a.v_sinks, a.status);
  }
  KVPACK_CUDA_CHECK(cudaGetLastError());
}

void dequantize_pages(const PagedLayout& l, const uint8_t* pool, int64_t num_pages, bool is_v,
                      const FormatParams& params, float* out, void* stream) {
  KVPACK_CU_CHECK(pool && out, "dequantize_pages: null pointer");
  const int64_t total = num_pages * l.num_kv_heads * l.page_size * (l.head_dim / 8);
  if (total == 0) return;
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  KVPACK_DISPATCH_FORMAT(l.format, P, [&] {
    KVPACK_DISPATCH_HEAD_DIM(l.head_dim, D, [&] {
      if constexpr (P::kQ) {
        KVPACK_CU_CHECK((is_v ? params.qv : params.qk).valid(), "dequantize_pages: format '{}' needs params.{}",
                        format_name(l.format), is_v ? "qv" : "qk");
        const int64_t n = num_pages * l.num_kv_heads * l.page_size;
        dequant_pages_q_kernel<P, D><<<dim3(static_cast<unsigned>((n + 127) / 128)), 128, 0,
                                       static_cast<cudaStream_t>(stream)>>>(
            pool, num_pages, l.num_kv_heads, l.page_size, l.head_block_bytes, is_v, params, out);
      } else {
        dequant_pages_kernel<P, D><<<dim3(static_cast<unsigned>(blocks)), threads, 0,
                                     static_cast<cudaStream_t>(stream)>>>(pool, num_pages, l.num_kv_heads,
                                                                          l.page_size, l.head_block_bytes, is_v,
                                                                          params, out);
      }
    });
  });
  KVPACK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvpack
