// The lean decode kernel (bench/NOTES.md v31-v32): fp8, head_dim 128, sm_90. Included by decode_fp8.cu only.
//
// One warp per (sequence, kv head, split): the warp computes the 512-token chunks split, split + S, split + 2S, ...
// of its (sequence, kv head) alone. Every lane stages exactly the 16-byte pieces it reads itself, with cp.async into
// a lane-private ring of kLeanStages steps of 32 tokens, so the main loop has no barrier and no shared-memory
// exchange: its only synchronisation is cp.async.wait_group. Scores and P.V run on the f16 tensor cores
// (m16n8k16, swap-AB: 16 tokens x 8 padded query heads per score tile, 16 channels x 8 heads per output tile).
//
// Which channels a lane holds is chosen so that its pieces are whole 16-byte runs of the page's token-major rows
// (K: lane (g, q) holds channels [16q, 16q + 16) and [64 + 16q, 80 + 16q) of tokens g and g + 8 of a 16-token unit;
// V: channels [16g, 16g + 16) of tokens 2q, 2q + 1, 8 + 2q, 9 + 2q); the query's fragments follow the K channels,
// and the output's channel of each accumulator follows the V ones. Each copy instruction of a warp covers whole
// 32-byte sectors (a 16-byte copy per lane at a 32-byte stride would move every sector twice: v31).
//
// Numerical definition (what makes every plan give the same bits): a chunk's partial is a left fold over its eight
// 64-token leaves, acc = merge(acc, leaf), where a leaf is an online softmax over its two 32-token steps in order;
// merge() and the leaf arithmetic are fixed, so the partial depends only on the chunk's tokens. The partials go to
// the workspace slots of the regular kernel and lean_merge_kernel folds them with the same two-level tree (groups
// of kFoldChunks chunks in order, then the groups in order).
#pragma once
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdlib>
#include <cuda_fp8.h>

namespace kvpack::cuda_detail {

constexpr int kLeanWarps = 4;    // warps per CTA (independent; the CTA only shares the SM's shared memory)
constexpr int kLeanStages = 3;   // ring depth in 32-token steps
constexpr int kLeanStepTok = 32; // tokens per step: two 16-token units
constexpr int kLeanPieces = 16;  // 16-byte pieces per lane and step: 2 units x (4 K + 4 V)
constexpr int kLeanStageBytes = kLeanPieces * 32 * 16;  // per warp
constexpr size_t kLeanSmem = size_t(kLeanStages) * kLeanStageBytes * kLeanWarps;

__device__ __forceinline__ uint32_t lean_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint32_t lean_e4m3x2(uint32_t two) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return uint32_t(hr.x) | (uint32_t(hr.y) << 16);
}
__device__ __forceinline__ float lean_ex2(float x) {  // ex2.approx: -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void lean_cp16(uint32_t dst, const void* src, bool valid) {
  // src_size 0 zero-fills the piece (tokens past the sequence: their V must be finite zeros for P.V).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void lean_cp16_full(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ uint32_t lean_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// splits >= 1: warp mode, grid (ceil(H * splits / kLeanWarps), batch): warp -> (kv head, split), chunks split,
// split + splits, ... of its sequence. splits == 0: leaf mode (small problems), grid (H * max_chunks, batch): CTA ->
// (kv head, chunk); warp w computes leaves 2w and 2w + 1 of the chunk, and warp 0 folds the 8 leaves in order with
// the same per-lane arithmetic as warp mode, so both modes give the same bits.
__global__ void __launch_bounds__(kLeanWarps * 32) lean_fp8_kernel(const DecodeKernelParams p, int splits, int krows) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int D = 128;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int H = p.num_kv_heads;
  // Grid (ceil(H * splits / kLeanWarps), batch): it depends on the plan only, never on the lengths.
  const bool leaf_mode = splits == 0;
  const int b = blockIdx.y, local = blockIdx.x * kLeanWarps + warp;
  if (!leaf_mode && local >= H * splits) return;
  const int h = leaf_mode ? static_cast<int>(blockIdx.x % H) : local / splits;
  const int split = leaf_mode ? static_cast<int>(blockIdx.x / H) : local % splits;  // leaf mode: the chunk

  int64_t len, row;
  if (p.table.row_start) {
    const int r0 = p.table.row_start[b], r1 = p.table.row_start[b + 1];
    row = r0;
    len = p.table.seq_lens ? p.table.seq_lens[b]
                           : (r1 - r0 <= 0 ? 0 : int64_t(r1 - r0 - 1) * p.page_size + p.table.last_page_len[b]);
  } else {
    row = int64_t{b} * p.table.row_stride;
    len = p.table.seq_lens[b];
  }
  if (len < 0) len = 0;
  if (len > p.max_context) {
    if (split == 0 && h == 0 && lane == 0 && p.status) atomicOr(p.status, 2);
    len = p.max_context;
  }
  const int n_chunks = static_cast<int>((len + kChunkTokens - 1) / kChunkTokens);
  if (split >= n_chunks) return;  // leaf mode: the whole CTA (its chunk index), before any barrier

  // ---- the query: lane (g, q) holds head g's channels base(kb) .. base(kb) + 3 for the 8 k-blocks, base(kb) =
  // 16q + 4kb (kb < 4) or 64 + 16q + 4(kb - 4), as f16: the bf16 value times a power of two per head (largest |value|
  // in [2^13, 2^14)), which is exact; the softmax scale, log2 e, the format's K scale and the power of two are applied
  // to the fp32 score. Heads >= group are zero (the n8 tile's padding).
  uint32_t qb[8][2];
  float qe_lane;  // the score factor of head g
  {
    float v[32];
    const bool has = g < p.group;
    const uint16_t* qrow = p.q + (int64_t{b} * p.num_qo_heads + h * p.group + (has ? g : 0)) * D;
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      const int base = kb < 4 ? 16 * q + 4 * kb : 64 + 16 * q + 4 * (kb - 4);
      const uint2 w = *reinterpret_cast<const uint2*>(qrow + base);
      v[4 * kb + 0] = has ? bf16_to_f32(uint16_t(w.x & 0xffffu)) : 0.f;
      v[4 * kb + 1] = has ? bf16_to_f32(uint16_t(w.x >> 16)) : 0.f;
      v[4 * kb + 2] = has ? bf16_to_f32(uint16_t(w.y & 0xffffu)) : 0.f;
      v[4 * kb + 3] = has ? bf16_to_f32(uint16_t(w.y >> 16)) : 0.f;
    }
    float mx = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) mx = fmaxf(mx, fabsf(v[i]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    int e = 0;
    if (mx > 0.f && mx <= 3.0e38f) frexpf(mx, &e);
    const int E = mx > 0.f && mx <= 3.0e38f ? min(max(14 - e, -120), 120) : 0;
    const float up = ldexpf(1.f, E);
    qe_lane = p.qk_scale_log2 * (p.fp.k_scale ? p.fp.k_scale[h] : 1.f) * ldexpf(1.f, -E);
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      const __half2 lo = __floats2half2_rn(v[4 * kb] * up, v[4 * kb + 1] * up);
      const __half2 hi = __floats2half2_rn(v[4 * kb + 2] * up, v[4 * kb + 3] * up);
      qb[kb][0] = *reinterpret_cast<const uint32_t*>(&lo);
      qb[kb][1] = *reinterpret_cast<const uint32_t*>(&hi);
    }
  }
  // This lane's score columns are heads 2q and 2q + 1: their unscale factors live in lanes g = 2q, 2q + 1.
  const float qe0 = __shfl_sync(0xffffffffu, qe_lane, (2 * q) * 4), qe1 = __shfl_sync(0xffffffffu, qe_lane, (2 * q + 1) * 4);

  const uint32_t ring =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + warp * kLeanStages * kLeanStageBytes + lane * 16;
  const int64_t page_stride = int64_t{H} * p.head_block_bytes;
  const uint8_t* k_head = p.k_pool + int64_t{h} * p.head_block_bytes;
  const uint8_t* v_head = p.v_pool + int64_t{h} * p.head_block_bytes;
  bool bad_page = false;
  // Step i of this warp: chunk split + (i / 16) * splits, 32-token step i % 16 of it.
  // Step i of this warp: warp mode: chunk split + (i / 16) * splits, its 32-token step i % 16; leaf mode: steps
  // 4 warp + i (i < 4) of chunk `split`.
  auto chunk_of = [&](int i) -> int64_t { return leaf_mode ? split : split + int64_t{i / 16} * splits; };
  auto step_in_chunk = [&](int i) -> int { return leaf_mode ? 4 * warp + i : i % 16; };
  auto step_start = [&](int i) -> int64_t {
    if (leaf_mode && i >= 4) return INT64_MAX;
    return chunk_of(i) * kChunkTokens + int64_t{step_in_chunk(i)} * kLeanStepTok;
  };
  // KVPACK_LEAN_KROWS: this lane's K copy k of a unit lands in reader lane (4 (k % 2) + lane / 8) * 4 + col % 4,
  // piece 2 (k / 2) + col / 4 (col = lane % 8): the lane-dependent part of that slot address, relative to `ring`.
  const int krows_col = lane % 8;
  const uint32_t krows_dst =
      uint32_t(((krows_col / 4) * 32 + (lane / 8) * 4 + krows_col % 4) * 16) - uint32_t(lane * 16);
  // The page ids of the chunk being issued, one per lane (a chunk spans 512 / page_size <= 32 pages), loaded once
  // per chunk: a dependent page-table load per unit stalled every step (v32).
  int64_t pg_chunk = -1;
  int my_pg = 0;
  auto issue = [&](int i) {
    const int64_t t0 = step_start(i);
    if (t0 < len) {
      if (chunk_of(i) != pg_chunk) {
        pg_chunk = chunk_of(i);
        const int64_t tp = (t0 & ~int64_t{kChunkTokens - 1}) + (int64_t{lane} << p.page_shift);
        my_pg = lane < (kChunkTokens >> p.page_shift) && tp < len ? p.table.pages[row + (tp >> p.page_shift)] : 0;
      }
      const uint32_t st = ring + (i % kLeanStages) * kLeanStageBytes;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int64_t tu = t0 + 16 * u;  // a 16-token unit never crosses a page (pages hold >= 16 tokens)
        const int rem = static_cast<int>(min(len - tu, int64_t{16}));  // tokens of the unit inside the sequence
        int page = __shfl_sync(0xffffffffu, my_pg, static_cast<int>((tu & (kChunkTokens - 1)) >> p.page_shift));
        if (rem <= 0) page = 0;
        if (page < 0 || page >= p.num_pages) {
          bad_page = true;
          page = 0;
        }
        const int64_t unit_off = int64_t{page} * page_stride + int64_t(tu & (p.page_size - 1)) * D;
        const uint8_t* kb = k_head + unit_off;
        const uint8_t* vb = v_head + unit_off;
        if (rem >= 16) {
          // A whole unit (every step but the sequence's last): no bounds, per-lane offsets fixed, piece offsets
          // immediate.
          const uint32_t su = st + u * 8 * 32 * 16;
          if (krows) {
            const uint8_t* kl = kb + lane * 16;
#pragma unroll
            for (int k = 0; k < 4; ++k)
              lean_cp16_full(krows_dst + su + ((2 * (k / 2)) * 32 + 4 * (k % 2) * 4) * 16, kl + 512 * k);
          } else {
            const uint8_t* kl = kb + g * D + 16 * q;
            lean_cp16_full(su, kl);
            lean_cp16_full(su + 32 * 16, kl + 64);
            lean_cp16_full(su + 2 * 32 * 16, kl + 8 * D);
            lean_cp16_full(su + 3 * 32 * 16, kl + 8 * D + 64);
          }
          const uint8_t* vl = vb + 2 * q * D + 16 * g;
          lean_cp16_full(su + 4 * 32 * 16, vl);
          lean_cp16_full(su + 5 * 32 * 16, vl + D);
          lean_cp16_full(su + 6 * 32 * 16, vl + 8 * D);
          lean_cp16_full(su + 7 * 32 * 16, vl + 9 * D);
          continue;
        }
        if (krows) {
          // K by whole rows: copy k of lane l is row 4k + l / 8, 16-byte column l % 8, written where its reader
          // (lane (row % 8) * 4 + column % 4, piece 2 (row / 8) + column / 4) finds it (a __syncwarp follows).
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int r = 4 * k + lane / 8, col = lane % 8;
            const int reader = (r % 8) * 4 + col % 4, piece = 2 * (r / 8) + col / 4;
            lean_cp16(st - lane * 16 + ((u * 8 + piece) * 32 + reader) * 16, kb + r * D + 16 * col, r < rem);
          }
        } else {
        // K: token g, then g + 8; bytes [16q, +16) and [64 + 16q, +16) of each row.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const bool ok = g + 8 * j < rem;
          lean_cp16(st + ((u * 8 + 2 * j) * 32) * 16, kb + (g + 8 * j) * D + 16 * q, ok);
          lean_cp16(st + ((u * 8 + 2 * j + 1) * 32) * 16, kb + (g + 8 * j) * D + 64 + 16 * q, ok);
        }
        }
        // V: tokens 2q, 2q + 1, 8 + 2q, 9 + 2q; bytes [16g, +16).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int tok = 2 * q + (j & 1) + 8 * (j >> 1);
          lean_cp16(st + ((u * 8 + 4 + j) * 32) * 16, vb + tok * D + 16 * g, tok < rem);
        }
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  // Leaf (current 64 tokens) state and chunk accumulator; per lane: heads 2q, 2q + 1; rows / channels as above.
  float o[8][4], co[8][4];
  float m0, m1, l0, l1, cm0, cm1, cl0, cl1;
  auto reset_leaf = [&] {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m0 = m1 = -INFINITY;
    l0 = l1 = 0.f;
  };
  auto reset_chunk = [&] {
#pragma unroll
    for (int i = 0; i < 8; ++i) co[i][0] = co[i][1] = co[i][2] = co[i][3] = 0.f;
    cm0 = cm1 = -INFINITY;
    cl0 = cl1 = 0.f;
  };
  // acc = merge(acc, leaf); fixed arithmetic (explicit fmaf / mul).
  auto fold_leaf = [&] {
    const float n0 = fmaxf(cm0, m0), n1 = fmaxf(cm1, m1);
    const float r0 = n0 == -INFINITY ? 0.f : n0, r1 = n1 == -INFINITY ? 0.f : n1;
    const float a0 = lean_ex2(cm0 - r0), a1 = lean_ex2(cm1 - r1), e0 = lean_ex2(m0 - r0), e1 = lean_ex2(m1 - r1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      co[i][0] = fmaf(co[i][0], a0, __fmul_rn(o[i][0], e0));
      co[i][1] = fmaf(co[i][1], a1, __fmul_rn(o[i][1], e1));
      co[i][2] = fmaf(co[i][2], a0, __fmul_rn(o[i][2], e0));
      co[i][3] = fmaf(co[i][3], a1, __fmul_rn(o[i][3], e1));
    }
    cl0 = fmaf(cl0, a0, __fmul_rn(l0, e0));
    cl1 = fmaf(cl1, a1, __fmul_rn(l1, e1));
    cm0 = n0;
    cm1 = n1;
  };
  const int64_t ws_base = (int64_t{b} * H + h) * p.max_chunks;
  // The chunk's partial: l summed over the 8 row lanes (fixed xor order), then (m, l) and the accumulators.
  auto store_chunk = [&](int64_t c) {
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
      cl0 += __shfl_xor_sync(0xffffffffu, cl0, x);
      cl1 += __shfl_xor_sync(0xffffffffu, cl1, x);
    }
    const int64_t slot = ws_base + c;
    float2* ml = p.ws_ml + slot * p.group;
    float* acc = p.ws_acc + slot * p.group * D;
    const int h0 = 2 * q, h1 = 2 * q + 1;
    if (g == 0) {
      if (h0 < p.group) __stcg(ml + h0, make_float2(cm0, cl0));
      if (h1 < p.group) __stcg(ml + h1, make_float2(cm1, cl1));
    }
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
      const int ch = 16 * g + 2 * mb;
      if (h0 < p.group) {
        __stcg(acc + h0 * D + ch, co[mb][0]);
        __stcg(acc + h0 * D + ch + 1, co[mb][2]);
      }
      if (h1 < p.group) {
        __stcg(acc + h1 * D + ch, co[mb][1]);
        __stcg(acc + h1 * D + ch + 1, co[mb][3]);
      }
    }
  };

#pragma unroll
  for (int i = 0; i < kLeanStages - 1; ++i) issue(i);
  reset_leaf();
  reset_chunk();
  for (int i = 0;; ++i) {
    const int64_t t0 = step_start(i);
    if (t0 >= len) break;
    if (krows) __syncwarp();  // every lane has read the slot the next copies refill
    issue(i + kLeanStages - 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kLeanStages - 1));
    if (krows) __syncwarp();  // the other lanes' copies into this lane's slots have landed
    const uint32_t st = ring + (i % kLeanStages) * kLeanStageBytes;
    float sc[2][4];
    // ---- scores of the step's two units ----
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint32_t kw[16];  // [token g: 8 words][token g + 8: 8 words]
#pragma unroll
      for (int k = 0; k < 4; ++k)
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(kw[4 * k]), "=r"(kw[4 * k + 1]), "=r"(kw[4 * k + 2]), "=r"(kw[4 * k + 3])
                     : "r"(st + ((u * 8 + k) * 32) * 16));
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kb = 0; kb < 8; ++kb)
        mma_f16_full(c, lean_e4m3x2(kw[kb]), lean_e4m3x2(kw[8 + kb]), lean_e4m3x2(kw[kb] >> 16),
                 lean_e4m3x2(kw[8 + kb] >> 16), qb[kb][0], qb[kb][1]);
      const int64_t ta = t0 + 16 * u + g;
      sc[u][0] = ta < len ? c[0] * qe0 : -INFINITY;
      sc[u][1] = ta < len ? c[1] * qe1 : -INFINITY;
      sc[u][2] = ta + 8 < len ? c[2] * qe0 : -INFINITY;
      sc[u][3] = ta + 8 < len ? c[3] * qe1 : -INFINITY;
    }
    // ---- online softmax of the leaf over this step ----
    float mx0 = fmaxf(m0, fmaxf(fmaxf(sc[0][0], sc[0][2]), fmaxf(sc[1][0], sc[1][2])));
    float mx1 = fmaxf(m1, fmaxf(fmaxf(sc[0][1], sc[0][3]), fmaxf(sc[1][1], sc[1][3])));
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float r0 = mx0 == -INFINITY ? 0.f : mx0, r1 = mx1 == -INFINITY ? 0.f : mx1;
    const float al0 = lean_ex2(m0 - r0), al1 = lean_ex2(m1 - r1);
    m0 = mx0;
    m1 = mx1;
    l0 *= al0;
    l1 *= al1;
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
      o[mb][0] *= al0;
      o[mb][1] *= al1;
      o[mb][2] *= al0;
      o[mb][3] *= al1;
    }
    // ---- P.V ----
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float p0 = lean_ex2(sc[u][0] - r0), p1 = lean_ex2(sc[u][1] - r1);
      const float p2 = lean_ex2(sc[u][2] - r0), p3 = lean_ex2(sc[u][3] - r1);
      l0 += p0 + p2;
      l1 += p1 + p3;
      const __half2 h01 = __floats2half2_rn(p0, p1), h23 = __floats2half2_rn(p2, p3);
      const uint32_t b0 = lean_trans(*reinterpret_cast<const uint32_t*>(&h01));
      const uint32_t b1 = lean_trans(*reinterpret_cast<const uint32_t*>(&h23));
      uint32_t vw[16];  // [token 2q][2q + 1][8 + 2q][9 + 2q] x 4 words (channels 16g + 4j .. + 3)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(vw[4 * k]), "=r"(vw[4 * k + 1]), "=r"(vw[4 * k + 2]), "=r"(vw[4 * k + 3])
                     : "r"(st + ((u * 8 + 4 + k) * 32) * 16));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // Channel 16g + 4j + 2e (+1): tokens 2q, 2q + 1 paired byte-wise (lo byte = token 2q).
        const uint32_t a_lo = lean_prmt(vw[j], vw[4 + j], 0x5140), a_hi = lean_prmt(vw[j], vw[4 + j], 0x7362);
        const uint32_t b_lo = lean_prmt(vw[8 + j], vw[12 + j], 0x5140), b_hi = lean_prmt(vw[8 + j], vw[12 + j], 0x7362);
        mma_f16_full(o[2 * j], lean_e4m3x2(a_lo), lean_e4m3x2(a_lo >> 16), lean_e4m3x2(b_lo), lean_e4m3x2(b_lo >> 16), b0,
                 b1);
        mma_f16_full(o[2 * j + 1], lean_e4m3x2(a_hi), lean_e4m3x2(a_hi >> 16), lean_e4m3x2(b_hi),
                 lean_e4m3x2(b_hi >> 16), b0, b1);
      }
    }
    // ---- leaf / chunk boundaries (a leaf is 2 steps; the sequence's last chunk may end early) ----
    const int k = step_in_chunk(i);
    const bool last = t0 + kLeanStepTok >= len;
    if (leaf_mode) {
      // Leaf 2w ends at i = 1 (or where the sequence ends): kept in the chunk registers; leaf 2w + 1 stays in o.
      if (i <= 1 && (i == 1 || last)) {
#pragma unroll
        for (int mb = 0; mb < 8; ++mb)
#pragma unroll
          for (int e = 0; e < 4; ++e) co[mb][e] = o[mb][e];
        cm0 = m0, cm1 = m1, cl0 = l0, cl1 = l1;
        reset_leaf();
      }
      continue;
    }
    const bool chunk_end = k == 15 || last;
    if (k % 2 == 1 || chunk_end) {
      fold_leaf();
      reset_leaf();
    }
    if (chunk_end) {
      store_chunk(chunk_of(i));
      reset_chunk();
      if (k != 15) break;  // that was the sequence's last chunk
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  if (bad_page && p.status) atomicOr(p.status, 1);
  if (leaf_mode) {
    // Each warp's two leaves into its own (drained) ring, [leaf][36 values][lane]; then warp 0 folds leaves 0..7.
    __syncwarp();  // every lane's copies have landed before any lane overwrites the ring
    float* lw = reinterpret_cast<float*>(smem + size_t(warp) * kLeanStages * kLeanStageBytes);
    auto put = [&](int j, const float (&oo)[8][4], float a0, float a1, float b0, float b1) {
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int e = 0; e < 4; ++e) lw[(j * 36 + 4 * mb + e) * 32 + lane] = oo[mb][e];
      lw[(j * 36 + 32) * 32 + lane] = a0;
      lw[(j * 36 + 33) * 32 + lane] = a1;
      lw[(j * 36 + 34) * 32 + lane] = b0;
      lw[(j * 36 + 35) * 32 + lane] = b1;
    };
    put(0, co, cm0, cm1, cl0, cl1);
    put(1, o, m0, m1, l0, l1);
    __syncthreads();
    if (warp != 0) return;
    reset_chunk();
#pragma unroll 1
    for (int leaf = 0; leaf < 8; ++leaf) {
      const float* src = reinterpret_cast<const float*>(smem + size_t(leaf / 2) * kLeanStages * kLeanStageBytes);
      const int j = leaf % 2;
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mb][e] = src[(j * 36 + 4 * mb + e) * 32 + lane];
      m0 = src[(j * 36 + 32) * 32 + lane];
      m1 = src[(j * 36 + 33) * 32 + lane];
      l0 = src[(j * 36 + 34) * 32 + lane];
      l1 = src[(j * 36 + 35) * 32 + lane];
      // Leaves past the sequence's end (all heads -inf) are skipped, as warp mode never reaches them.
      if (m0 == -INFINITY && m1 == -INFINITY) continue;
      fold_leaf();
    }
    store_chunk(split);
  }
#endif
}

// One CTA (one thread per channel) per (sequence, kv head, query head of the group): fold the chunk partials with the fixed two-level tree (chunks
// 16 g .. 16 g + 15 in order, then the groups in order; a sequence of <= 16 chunks is one group), then the output.
__global__ void __launch_bounds__(128) lean_merge_kernel(const DecodeKernelParams p) {
  constexpr int D = 128;
  const int b = blockIdx.y, h = blockIdx.x, H = p.num_kv_heads;
  int64_t len;
  if (p.table.row_start) {
    const int r0 = p.table.row_start[b], r1 = p.table.row_start[b + 1];
    len = p.table.seq_lens ? p.table.seq_lens[b]
                           : (r1 - r0 <= 0 ? 0 : int64_t(r1 - r0 - 1) * p.page_size + p.table.last_page_len[b]);
  } else {
    len = p.table.seq_lens[b];
  }
  if (len < 0) len = 0;
  if (len > p.max_context) len = p.max_context;
  const int n_chunks = static_cast<int>((len + kChunkTokens - 1) / kChunkTokens);
  const int64_t base = (int64_t{b} * H + h) * p.max_chunks;
  const float os = p.fp.v_scale ? p.fp.v_scale[h] : 1.f;
  auto merge = [](float& m, float& l, float& o, float mj, float lj, float oj) {
    const float mn = fmaxf(m, mj);
    const float mr = mn == -INFINITY ? 0.f : mn;
    const float sa = exp2f(m - mr), sc = exp2f(mj - mr);
    l = l * sa + lj * sc;
    o = o * sa + oj * sc;
    m = mn;
  };
  {
    const int hg = blockIdx.z, i = hg * D + threadIdx.x;
    float M = -INFINITY, L = 0.f, O = 0.f;
    for (int g0 = 0; g0 < n_chunks; g0 += kFoldChunks) {
      const int cnt = min(kFoldChunks, n_chunks - g0);
      float m = -INFINITY, l = 0.f, o = 0.f;
      float2 ml[kFoldChunks];
      float a[kFoldChunks];
#pragma unroll
      for (int j = 0; j < kFoldChunks; ++j) {
        const int64_t slot = base + g0 + j;
        ml[j] = j < cnt ? __ldcg(p.ws_ml + slot * p.group + hg) : make_float2(-INFINITY, 0.f);
        a[j] = j < cnt ? __ldcg(p.ws_acc + slot * p.group * D + i) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kFoldChunks; ++j)
        if (j < cnt) merge(m, l, o, ml[j].x, ml[j].y, a[j]);
      if (n_chunks <= kFoldChunks) {
        M = m, L = l, O = o;
      } else {
        merge(M, L, O, m, l, o);
      }
    }
    const int qh = h * p.group + hg;
    p.out[(int64_t{b} * p.num_qo_heads + qh) * D + i % D] = f32_to_bf16(n_chunks > 0 ? O / L * os : 0.f);
    if (p.lse && i % D == 0)
      p.lse[int64_t{b} * p.num_qo_heads + qh] = n_chunks > 0 ? (M + log2f(L)) * 0.69314718055994530942f : -INFINITY;
  }
}

// Warps per (sequence, kv head) for a plan: the regular kernel's CTAs had 8 warps, so 8 x num_splits, at most one
// per chunk.
inline int lean_splits(const DecodeKernelParams& kp) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(int64_t{kp.num_splits} * 8, kp.max_chunks)));
}

inline bool lean_fp8_applies(int head_dim) {
  static const int cc = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return major;
  }();
  return head_dim == 128 && cc >= 9 && !std::getenv("KVPACK_NO_LEAN");
}

inline void launch_lean_fp8(const DecodeKernelParams& kp, int batch, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    cudaFuncSetAttribute(lean_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kLeanSmem));
    cudaGetLastError();
  });
  // Leaf mode when one warp per chunk would give fewer than two waves of 8 warps per SM (the choice depends on the
  // plan only and both modes give the same bits).
  const bool leaf = int64_t{batch} * kp.num_kv_heads * kp.max_chunks < int64_t{2} * device_sm_count() * 8;
  const int splits = leaf ? 0 : lean_splits(kp);
  const int64_t warps = int64_t{kp.num_kv_heads} * splits;
  dim3 grid(leaf ? static_cast<unsigned>(int64_t{kp.num_kv_heads} * kp.max_chunks)
                 : static_cast<unsigned>((warps + kLeanWarps - 1) / kLeanWarps),
            batch);
  static const int krows = std::getenv("KVPACK_LEAN_KROWS") ? std::atoi(std::getenv("KVPACK_LEAN_KROWS")) : 0;
  lean_fp8_kernel<<<grid, kLeanWarps * 32, kLeanSmem, stream>>>(kp, splits, krows);
  lean_merge_kernel<<<dim3(kp.num_kv_heads, batch, kp.group), 128, 0, stream>>>(kp);
}

}  // namespace kvpack::cuda_detail
