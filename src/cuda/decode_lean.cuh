// The lean decode kernel (bench/NOTES.md v31-v34, v44): fp8 (head_dim 128, sm_90), q4, q3.5 and q3 (head_dim 64 and 128, sm_80+,
// the lane layout of include/kvpack/block/q_lanes.h). Included by decode_lean.cu only.
//
// One warp per (sequence, kv head, split): the warp computes the 512-token chunks split, split + S, split + 2S, ...
// of its (sequence, kv head) alone. Every lane stages exactly the 16-byte pieces it reads itself (fp8, q4), with
// cp.async into a lane-private ring of LeanGeo::kStages steps of 32 tokens, so the main loop has no barrier and no
// shared-memory exchange: its only synchronisation is cp.async.wait_group (q3 and q3.5, whose lane shares are not whole
// 16-byte pieces, copies units whole and adds a __syncwarp on each side of the wait). Scores and P.V run on the f16 tensor cores
// (m16n8k16, swap-AB: 16 tokens x 8 padded query heads per score tile, 16 channels x 8 heads per output tile).
//
// Which channels a lane holds is chosen so that its pieces are whole 16-byte runs of the page's token-major rows
// (K: lane (g, q) holds channels [16q, 16q + 16) and [64 + 16q, 80 + 16q) of tokens g and g + 8 of a 16-token unit;
// V: channels [16g, 16g + 16) of tokens 2q, 2q + 1, 8 + 2q, 9 + 2q); the query's fragments follow the K channels,
// and the output's channel of each accumulator follows the V ones. Each copy instruction of a warp covers whole
// 32-byte sectors (a 16-byte copy per lane at a 32-byte stride would move every sector twice: v31).
//
// Numerical definition (what makes every plan give the same bits): a chunk's partial is a left fold over its four
// 128-token leaves, acc = merge(acc, leaf), where a leaf is an online softmax over its four 32-token steps in order;
// merge() and the leaf arithmetic are fixed, so the partial depends only on the chunk's tokens. The partials go to
// the workspace slots of the regular kernel and lean_merge_kernel folds them with the same two-level tree (groups
// of kFoldChunks chunks in order, then the groups in order).
#pragma once
#include <cuda_fp16.h>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cuda_fp8.h>

#include "decode_internal.cuh"
#include "kvpack/block/q_lanes.h"
#include "lean_stamps.cuh"

namespace kvpack::cuda_detail {

// kLeanWarps (decode_internal.cuh, the planner counts with it): warps per CTA (independent; the CTA only shares the
// SM's shared memory and, for the q formats, its (sequence, kv head) and the scale table).
constexpr int kLeanStepTok = 32; // tokens per step: two 16-token units
constexpr int kChunkSteps = kChunkTokens / kLeanStepTok;  // 16
// A leaf (the unit of the fixed fold order) is 4 steps = 128 tokens, a chunk 4 leaves: leaf mode's 4 warps compute
// one leaf each (v42; before, 64-token leaves, 2 per warp).
constexpr int kLeafSteps = kChunkSteps / kLeanWarps;
static_assert(kLeafSteps * kLeanWarps == kChunkSteps && kLeafSteps == 4, "a chunk is kLeanWarps leaves of 4 steps");
// Per format (B2: 0 = fp8, else twice the bits: 8 = q4, 7 = q3.5, 6 = q3): the ring (kStages steps of 32 tokens per
// warp; q3 and q3.5 one more), its
// 16-byte copies per lane and step (fp8: 2 tokens x 32 channels or 16 channels x 4 tokens = 64 bytes per unit, K
// and V; q4 / q3.5 / q3: the step's 4 units of B2 D bytes), and the q formats' extra shared memory (the 256 scales
// tau(e); the query is prepared by lean_q_prep_kernel).
// Instances of the lean kernel (q formats; fp8 has the general one only):
// - kGeneral: leaf mode, warp mode and the mixed grid, the chunk accumulator in registers (168 registers at head_dim
//   128, 3 CTAs per SM).
// - kLeafOnly (bench/NOTES.md v50-v51): leaf mode's grids without the mixed part. The loop never folds or stores a
//   chunk, so the chunk accumulator is not live there. The ring takes the most stages, up to the format's own, with
//   which 4 CTAs fit an SM's 228 KB (1 KB of it reserved per CTA): q3.5 at head_dim 128 then has 3 (43 KB per CTA, was
//   57 KB: 3 CTAs). A leaf-mode warp computes 4 steps only, so its ring's depth matters less than the CTAs that hide
//   each other's latency.
// - kWarpOnly (v52): warp mode's grids without the mixed part. The chunk accumulator (O, m, l, L_tau per lane) lives
//   in shared memory, read and written once per 128-token leaf, so the loop carries only the leaf's registers and 4
//   CTAs fit an SM; the ring is cut to the stages that leave room for that (q4, q3.5, q3 at head_dim 128: 2).
// - kGroup (v74, q formats at head_dim 128): warp mode where each warp owns whole fold groups (kFoldChunks consecutive
//   chunks: groups split, split + splits, ...). At each chunk's end the warp folds the chunk's partial into a group
//   accumulator in shared memory with the merge's own first-level arithmetic (lean_fold_weights, the same fmaf / mul
//   in the same order) instead of storing it, and stores one partial per group, in the group's first chunk slot; the
//   merge (DecodeKernelParams::lean_group_fold) then skips that level. The partials' traffic and the merge's reads
//   drop 16x (6% of q4's bytes at 8q/1kv, written and read once). Registers as the general instance; the ring cut to
//   the stages that keep 3 CTAs per SM beside the group accumulators.
// The stage count changes when copies are issued, and the accumulator's home is a register or a shared-memory word:
// never the arithmetic, so every instance gives the same bits.
enum class LeanInst : int { kGeneral, kLeafOnly, kWarpOnly, kGroup };
// The general instance's CTAs per SM for the q formats (__launch_bounds__' minimum): 3 (168 registers at head_dim 128).
// A build with -DKVPACK_LEAN_GEN_MINB=4 (measurement, v55) caps it at 128 registers, part of the chunk accumulator
// spilled to local memory, and gives it the ring depth that fits 4 CTAs per SM (as the leaf-only instance: q3.5 3).
#ifndef KVPACK_LEAN_GEN_MINB
#define KVPACK_LEAN_GEN_MINB 3
#endif
constexpr bool kLeanGenFour = KVPACK_LEAN_GEN_MINB >= 4;
// v56 (bench/NOTES.md), q formats: the scores' HMMA chains per unit (1 or 2) and the V scale bytes gathered one per
// lane then shuffled (1) or two per lane (0). -D overrides them for A/B builds.
#ifndef KVPACK_LEAN_SCORE_CHAINS
#define KVPACK_LEAN_SCORE_CHAINS 2
#endif
#ifndef KVPACK_LEAN_VSCALE_COOP
#define KVPACK_LEAN_VSCALE_COOP 1
#endif
// v57: the q formats' lazy leaf max (KVPACK_LEAN_LAZY log2 units of slack, <= 6 for f16's range; 0: a rescale every
// step, as before).
#ifndef KVPACK_LEAN_LAZY
#define KVPACK_LEAN_LAZY 4
#endif
// v58: the scores' masks only on steps that hold masked tokens (same bits; 0: on every step, as before).
#ifndef KVPACK_LEAN_TAIL_MASK
#define KVPACK_LEAN_TAIL_MASK 1
#endif
// v57b: with the lazy max, the row reduction only on steps whose lanes vote that a rescale follows (same bits).
#ifndef KVPACK_LEAN_LAZY_VOTE
#define KVPACK_LEAN_LAZY_VOTE 1
#endif
static_assert(KVPACK_LEAN_LAZY >= 0 && KVPACK_LEAN_LAZY <= 6, "p tau_V <= 2^LAZY x 2^8 must fit f16");
// v65 (measurement): fp8's CTAs per SM (__launch_bounds__' minimum) and ring stages on the lean kernel. The default,
// 1 and 3, gives 2 CTAs per SM (96 KB of ring each, 190 registers); 3 and 2 would give 3 (64 KB each, <= 168
// registers). The stage count changes only when copies are issued: same bits.
#ifndef KVPACK_LEAN_FP8_MINB
#define KVPACK_LEAN_FP8_MINB 1
#endif
#ifndef KVPACK_LEAN_FP8_STAGES
#define KVPACK_LEAN_FP8_STAGES 3
#endif
// v71: how fp8's chunk partial is stored. Lane (g, q) holds channels 16 g .. 16 g + 15 of heads 2q and 2q + 1.
// 0 (before v71): 32 4-byte stores per lane (sm_90a SASS: STG.E), each warp store touching 32 sectors for 128 bytes
// (8x the sectors of its bytes; v70's ncu: lean fp8's L2 tag lookups were its busiest unit, at 1.3 sectors per
// request); 1: 4 16-byte stores per head (2x); 2: lane pairs (g, g ^ 1) swap a 16-byte quarter by shuffles first, so
// that each 16-byte store instruction fills whole sectors (1x; measured 1.01-1.07x over 0, bench/NOTES.md v71). The
// same values in the same places: the same bits.
#ifndef KVPACK_LEAN_FP8_ST
#define KVPACK_LEAN_FP8_ST 2
#endif
// v73 (measurement, not kept): who copies fp8's V pieces (the kernel argument `rows`, bit 1; bit 0 is
// KVPACK_LEAN_KROWS). Reader lane (g, q) needs bytes [16 g, +16) of tokens 2q, 2q + 1, 8 + 2q, 9 + 2q of each unit.
// 0: every lane copies its own pieces (a quad's 4 lanes read 16 bytes of 4 different rows); 1: copy k of lane l is
// row 4k + l / 8, 16-byte column l % 8 (whole 128-byte rows), landing in its reader's slot (two __syncwarp per step,
// as KROWS). Only where copies land and who issues them changes: the same bits (fp8's decode tests pass with 1).
// Measured on the H100 (bench/NOTES.md v73): 0.996-1.004x, and ncu's L1 / L2 sector counts unchanged: the V copies'
// pattern was not where lean fp8's extra read sectors come from.
#ifndef KVPACK_LEAN_VROWS
#define KVPACK_LEAN_VROWS 0
#endif
// v67 (measurement): fp8 on the lean kernel with the q formats' lazy leaf max and its vote (v57, v57b; a new
// numerical definition for lean fp8, math-equal to the old one: p = 2^(s - m) <= 2^LAZY, and p x |v| <= 2^LAZY x 448
// fits f16), the scores' masks only on steps that hold masked tokens (v58; same bits), and the scores' two HMMA chains
// (v56a). 0: as before.
#ifndef KVPACK_LEAN_FP8_LAZY
#define KVPACK_LEAN_FP8_LAZY 0
#endif
template <int D, int B2, LeanInst I = LeanInst::kGeneral>
struct LeanGeo {
  static constexpr bool kQ = B2 != 0;
  using Lanes = block::QLanes<kQ ? B2 : 8, D, false>;  // the q formats' layout (fp8: unused)
  static constexpr bool kWordMajor = kQ && Lanes::kWordMajor;  // q3, q3.5: units copied whole, read word-major
  static constexpr int kUnitBytes = kQ ? Lanes::kUnitBytes : 16 * D;  // one 16-token unit of K (or V)
  static constexpr int kStageBytes = 4 * kUnitBytes;        // per warp: a step's 2 units of K and of V
  static constexpr int kFormatStages = kWordMajor ? 4 : kQ ? 3 : KVPACK_LEAN_FP8_STAGES;
  static constexpr int kLeafVals = 4 * (D / 16) + (kQ ? 6 : 4);  // a leaf's per-lane state: O, m, l (q: + L_tau)
  // kWarpOnly: a warp's chunk accumulator, float4 per lane: [D / 16][lane] O, then [lane] (m0, m1, l0, l1) and
  // [lane] (L_tau0, L_tau1, -, -).
  static constexpr int kAccVec = D / 16 + 2;
  static constexpr size_t kAccBytes = I == LeanInst::kWarpOnly ? size_t(kAccVec) * 32 * 16 : 0;
  static constexpr size_t kTauBytes = kQ ? 256 * sizeof(float) : 0;
  // kGroup: a warp's group accumulator, [kGroupVals][lane] floats: O of heads 2q, 2q + 1 (4 (D / 16) values, the
  // merge's channel order per lane as store_chunk writes them), then (m0, m1, l0, l1).
  static constexpr int kGroupVals = 4 * (D / 16) + 4;
  static constexpr size_t kGroupBytes = I == LeanInst::kGroup ? size_t(kGroupVals) * 32 * sizeof(float) : 0;
  static constexpr int kThreeCtaStages =
      static_cast<int>((228 * 1024 / 3 - 1024 - kTauBytes - kLeanWarps * kGroupBytes) / (kStageBytes * kLeanWarps));
  static constexpr int kFourCtaStages =
      static_cast<int>((228 * 1024 / 4 - 1024 - kTauBytes - kLeanWarps * kAccBytes) / (kStageBytes * kLeanWarps));
  static constexpr int kStages = I == LeanInst::kGroup ? (kThreeCtaStages < kFormatStages ? kThreeCtaStages : kFormatStages)
                                 : (I != LeanInst::kGeneral || (kQ && kLeanGenFour)) && kFourCtaStages >= 2 &&
                                         kFourCtaStages < kFormatStages
                                     ? kFourCtaStages
                                     : kFormatStages;
  static constexpr size_t kRingBytes = size_t(kStages) * kStageBytes * kLeanWarps;
  static constexpr size_t kAccOffset = kRingBytes + kTauBytes;  // 16-byte aligned: stages are whole 16-byte copies
  static constexpr size_t kGroupOffset = kAccOffset + kLeanWarps * kAccBytes;  // 16-byte aligned
  static constexpr size_t kSmem = kGroupOffset + kLeanWarps * kGroupBytes;
  static_assert(kUnitBytes % 16 == 0, "a unit is whole 16-byte copies");
  static_assert(kWordMajor || kStageBytes % (32 * 16) == 0, "fp8, q4: a step is whole 16-byte copies of every lane");
  static_assert(size_t(kLeafVals) * 32 * 4 <= size_t(kStages) * kStageBytes, "a leaf fits a warp's ring");
};
static_assert(LeanGeo<128, 7, LeanInst::kLeafOnly>::kStages == 3 && LeanGeo<128, 7>::kStages == (kLeanGenFour ? 3 : 4) &&
                  LeanGeo<128, 8, LeanInst::kLeafOnly>::kStages == 3 && LeanGeo<128, 6, LeanInst::kLeafOnly>::kStages == 4,
              "leaf-only stages at head_dim 128: q3.5 3 (4 CTAs per SM), q4 3, q3 4 (their own)");
static_assert(LeanGeo<128, 8, LeanInst::kWarpOnly>::kStages == 2 && LeanGeo<128, 7, LeanInst::kWarpOnly>::kStages == 2 &&
                  LeanGeo<128, 6, LeanInst::kWarpOnly>::kStages == 2 &&
                  LeanGeo<128, 8, LeanInst::kWarpOnly>::kSmem + 1024 <= 228 * 1024 / 4,
              "warp-only at head_dim 128: a 2-stage ring and the accumulators, 4 CTAs per SM");
static_assert(LeanGeo<128, 8, LeanInst::kGroup>::kStages == 3 && LeanGeo<128, 7, LeanInst::kGroup>::kStages == 4 &&
                  LeanGeo<128, 6, LeanInst::kGroup>::kStages == 4 &&
                  3 * (LeanGeo<128, 7, LeanInst::kGroup>::kSmem + 1024) <= 228 * 1024 &&
                  3 * (LeanGeo<128, 8, LeanInst::kGroup>::kSmem + 1024) <= 228 * 1024,
              "group-folding at head_dim 128 (v74's measured configuration): q4 3 stages, q3.5 and q3 4, 3 CTAs per SM "
              "beside the group accumulators");

// One step of the fold acc = merge(acc, chunk j) (lean_merge_kernel's first and second level, kGroup's chunk fold): the weights of the accumulator (sa) and of the chunk (sc) at the
// new running max, which is returned.
__device__ __forceinline__ float lean_fold_weights(float m, float mj, float& sa, float& sc) {
  const float mn = fmaxf(m, mj);
  const float mr = mn == -INFINITY ? 0.f : mn;
  sa = exp2f(m - mr);
  sc = exp2f(mj - mr);
  return mn;
}
__device__ __forceinline__ void lean_merge_step(float& m, float& l, float mj, float lj, float& sa, float& sc) {
  m = lean_fold_weights(m, mj, sa, sc);
  l = fmaf(l, sa, __fmul_rn(lj, sc));
}
__device__ __forceinline__ uint32_t lean_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
// The warp-only instance's accumulator rows (volatile: kept in program order, so at most a row is in registers).
__device__ __forceinline__ void lean_lds4(uint32_t a, float (&v)[4]) {
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(a));
}
__device__ __forceinline__ void lean_sts4(uint32_t a, float x, float y, float z, float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"r"(a), "f"(x), "f"(y), "f"(z), "f"(w));
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

// q formats: the half2 of group i (members of a K token, or two tokens of a V member) from one row's slot words w
// and w >> 6: one AND; the codes read as f16 subnormals code * 2^(pos' - 24) (block/q_lanes.h). i is a constant
// after the callers' unrolling, so the word and the mask are too.
template <class L>
__device__ __forceinline__ uint32_t lean_q_pair(const uint32_t (&w)[L::kSlots], const uint32_t (&ws)[L::kSlots], int i) {
  const block::LaneGroup g = L::group(i);
  const int pos = L::shifted(i) ? g.pos - 6 : g.pos;
  const uint32_t m = ((1u << g.w) - 1u) << pos;
  return (L::shifted(i) ? ws[g.word] : w[g.word]) & (m | (m << 16));
}
// q formats, V: the scale byte of the token whose bits sit at lanes 4 g' + qq (g' = 0..7) of ballot mask `bal`.
__device__ __forceinline__ uint32_t lean_ballot_byte(uint32_t bal, int qq) {
  uint32_t x = (bal >> qq) & 0x11111111u;
  x = (x | (x >> 3)) & 0x03030303u;
  x = (x | (x >> 6)) & 0x000f000fu;
  return (x | (x >> 12)) & 0xffu;
}
// One lane's slot words of a unit (q4: from its own 16-byte pieces; q3, q3.5: from the word-major unit), as two rows
// (K: tokens g, g + 8; V: token pairs (2q, 2q + 1), (8 + 2q, 9 + 2q)) read at the slots' bit positions, and the
// same >> 6. `un` is the unit's shared-memory address.
template <class L>
__device__ __forceinline__ void lean_q_rows(uint32_t un, int lane, uint32_t (&r0)[L::kSlots], uint32_t (&r1)[L::kSlots],
                                            uint32_t (&s0)[L::kSlots], uint32_t (&s1)[L::kSlots]) {
  uint32_t sw[L::kShareWords];
  if constexpr (!L::kWordMajor) {  // q4: 16-byte pieces, lane-major inside each 512-byte piece
#pragma unroll
    for (int k = 0; k < L::kShareWords / 4; ++k)
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(sw[4 * k]), "=r"(sw[4 * k + 1]), "=r"(sw[4 * k + 2]), "=r"(sw[4 * k + 3])
                   : "r"(un + (k * 32 + lane) * 16));
  } else {  // q3, q3.5: word-major
#pragma unroll
    for (int k = 0; k < L::kShareWords; ++k)
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sw[k]) : "r"(un + (k * 32 + lane) * 4));
  }
#pragma unroll
  for (int slot = 0; slot < L::kReg; ++slot) {
    r0[slot] = sw[L::share_word(slot, 0)] >> L::row_shift(slot, 0);
    r1[slot] = sw[L::share_word(slot, 1)] >> L::row_shift(slot, 1);
    s0[slot] = r0[slot] >> 6;
    s1[slot] = r1[slot] >> 6;
  }
  // q3.5's nibbles: one aligned word per lane and nibble slot (K: two lanes' byte pairs, V: a member pair's bytes
  // of the lane's four tokens), shifted to this lane's nibbles and spread into the rows' halves (block/q_lanes.h).
  // No code in a nibble needs the shift by 6 (s = r, unused).
#pragma unroll
  for (int n = 0; n < L::kNib; ++n) {
    uint32_t w;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w) : "r"(un + L::nib_word_offset(n, lane)));
    w >>= L::nib_shift(lane);
    r0[L::kReg + n] = s0[L::kReg + n] = L::nib_row(w, 0);
    r1[L::kReg + n] = s1[L::kReg + n] = L::nib_row(w, 1);
  }
}

// splits >= 1: warp mode, grid (ceil(H * splits / kLeanWarps), batch): warp -> (kv head, split), chunks split,
// split + splits, ... of its sequence. splits == 0: leaf mode (small problems), grid (H * max_chunks, batch): CTA ->
// (kv head, chunk); warp w computes leaf w of the chunk (its steps 4w .. 4w + 3), and warp 0 folds the 4 leaves in
// order with the same per-lane arithmetic as warp mode, so both modes give the same bits.
//
// q4 / q3.5 / q3 (B2 = 8, 7, 6): the codes are f16 subnormals after one AND (block/q_lanes.h), so the query fragment of channel c
// carries q'_c 2^(24 - pos'_c) 2^E (q' = s * (G^T q), pos' the code's bit position as read, E a power of two per
// head) and a score is tau_K (acc 2^-E - q'.o) + q.mu, tau_K from the token's scale byte (its bits gathered from the
// quad); P.V multiplies each probability by tau_V (scale bits gathered by ballots) and accumulates L_tau = sum of those
// f16 weights, and at a chunk's end the accumulators become sum_t p_t tau_t (k_t - o) (x 2^(24 - pos'), minus o
// L_tau), which lean_merge_kernel turns into mu + G (s * .) and folds with the sink tokens. Positions below the
// sequence's sink count are masked (the merge adds them exactly). The query is prepared once per (sequence, kv head)
// by lean_q_prep_kernel, before this kernel (PDL: this kernel's first copies overlap it); a CTA's 4 warps share one
// (sequence, kv head), so warp mode keeps the splits a multiple of 4.
// I (q formats; LeanInst, bench/NOTES.md v50-v52): kLeafOnly for leaf mode's grids without the mixed part (the loop
// never folds or stores a chunk, so the chunk accumulator is not live in it), kWarpOnly for warp mode's (the chunk
// accumulator in shared memory): 108-128 registers instead of 133-168 (sm_90a), so 4 CTAs per SM instead of 3 (the
// ring's stages cut where 4 would not fit: LeanGeo). Same arithmetic in the same order: same bits.
template <int D, int B2, LeanInst I = LeanInst::kGeneral>
__global__ void __launch_bounds__(kLeanWarps * 32, I == LeanInst::kLeafOnly || I == LeanInst::kWarpOnly ? 4
                                                   : B2 == 0                                            ? KVPACK_LEAN_FP8_MINB
                                                                                                        : KVPACK_LEAN_GEN_MINB)
    lean_kernel(const DecodeKernelParams p, int splits, int rows, int mix) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#if __CUDA_ARCH__ < 900
  if constexpr (B2 == 0) return;  // fp8 runs here on sm_90 only (lean_fp8_applies); the q formats on sm_80 too
#endif
  constexpr bool kLaneQ = B2 != 0;  // q4, q3.5 or q3 (the lane layout)
  constexpr bool LO = I == LeanInst::kLeafOnly, kWO = I == LeanInst::kWarpOnly, kGF = I == LeanInst::kGroup;
  static_assert(!kGF || B2 != 0, "kGroup: the q formats");
  using Geo = LeanGeo<D, B2, I>;
  using LK = block::QLanes<B2 ? B2 : 8, D, false>;
  using LV = block::QLanes<B2 ? B2 : 8, D, true>;
  constexpr int kKB = D / 16;  // k-blocks of the scores, m-tiles of P.V
  constexpr int kLeanStages = Geo::kStages;
  constexpr int kLeanStageBytes = Geo::kStageBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int H = p.num_kv_heads;
  KVPACK_STAMP_DECL(stamps, 4);
  KVPACK_STAMP(stamps[0]);
  // Grid (ceil(H * splits / kLeanWarps), batch), or the mixed grid's (below): it depends on the plan only, never on
  // the lengths.
  bool leaf_mode = LO || (!kWO && !kGF && splits == 0);
#if __CUDA_ARCH__ >= 900
  // The merge kernel (launched with PDL) may be scheduled once every CTA of this grid has started; it waits for this
  // grid's completion (griddepcontrol.wait) before reading a partial.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  int b = blockIdx.y, h, split, cstride;  // cstride: the warp's next chunk is split + cstride
  if (kLaneQ && I == LeanInst::kGeneral && mix > 0) {
    // Mixed grid (q formats, lean_mixed_chunks; grid (batch (H mix / 4 + H (max_chunks - mix)), 1)): every sequence's
    // warp-mode CTAs first (warp -> (kv head, chunk < mix), one chunk each), then every sequence's leaf-mode CTAs (CTA
    // -> (kv head, chunk >= mix)), so the short leaf CTAs run last. mix % 4 == 0: a CTA's warps share a kv head.
    const int wctas = H * mix / kLeanWarps, lctas = H * max(0, p.max_chunks - mix);
    const int nw = static_cast<int>(gridDim.x / (wctas + lctas)) * wctas;
    const int x = blockIdx.x;
    leaf_mode = x >= nw;
    if (!leaf_mode) {
      const int local = (x % wctas) * kLeanWarps + warp;
      b = x / wctas;
      h = local / mix;
      split = local % mix;
    } else {
      const int y = x - nw, r = y % lctas;
      b = y / lctas;
      h = r % H;
      split = mix + r / H;
    }
    cstride = 0;  // one chunk per warp (warp part) or per CTA (leaf part): n_chunks below
  } else {
    const int local = blockIdx.x * kLeanWarps + warp;
    if (!kLaneQ && !leaf_mode && local >= H * splits) return;  // q formats: no spare warps (splits % 4 == 0)
    h = leaf_mode ? static_cast<int>(blockIdx.x % H) : local / splits;
    split = leaf_mode ? static_cast<int>(blockIdx.x / H) : local % splits;  // leaf mode: the chunk
    cstride = leaf_mode ? 0 : splits;
  }
  // The warp's first chunk (kGroup: the first of its first fold group), and the chunk after c in its order.
  const int c_first = kGF ? split * kFoldChunks : split;

  int64_t row;
  bool over;
  const int64_t len = seq_len_of(p, b, row, over);
  if (over && split == 0 && h == 0 && lane == 0 && p.status) atomicOr(p.status, 2);
  const int n_chunks = static_cast<int>((len + kChunkTokens - 1) / kChunkTokens);
  if (cstride == 0) cstride = n_chunks > 0 ? n_chunks : 1;  // past the last chunk after one
  if (!kLaneQ && split >= n_chunks) return;  // leaf mode: the whole CTA (its chunk index), before any barrier

  // ---- the query: lane (g, q) holds head g's channels base(kb) .. base(kb) + 3 for the 8 k-blocks, base(kb) =
  // 16q + 4kb (kb < 4) or 64 + 16q + 4(kb - 4), as f16: the bf16 value times a power of two per head (largest |value|
  // in [2^13, 2^14)), which is exact; the softmax scale, log2 e, the format's K scale and the power of two are applied
  // to the fp32 score. Heads >= group are zero (the n8 tile's padding).
  uint32_t qb[kKB][2];
  float qe0 = 0.f, qe1 = 0.f;                  // fp8: the score factors of heads 2q, 2q + 1
  float un0 = 0.f, un1 = 0.f, qo0 = 0.f, qo1 = 0.f, cz0 = 0.f, cz1 = 0.f;  // q formats: 2^-E, q'.o, q.mu of heads 2q, 2q + 1
  int n_sink = 0;
  const float* tau_s = reinterpret_cast<const float*>(smem + Geo::kRingBytes);
  if constexpr (!kLaneQ) {
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
    const int E = f16_range_exponent(mx);
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
  qe0 = __shfl_sync(0xffffffffu, qe_lane, (2 * q) * 4), qe1 = __shfl_sync(0xffffffffu, qe_lane, (2 * q + 1) * 4);
  } else {
    // ---- q formats: the query was prepared once per (sequence, kv head) by lean_q_prep_kernel (workspace); here
    // only the scale table (compute) before the first copies, the fragments after them (PDL: the prep kernel may
    // still run until griddepcontrol.wait) ----
    float* tau_w = reinterpret_cast<float*>(smem + Geo::kRingBytes);
    for (int i = threadIdx.x; i < 256; i += kLeanWarps * 32) tau_w[i] = block::decode_scale_byte(static_cast<uint8_t>(i));
    __syncthreads();
    if (c_first >= n_chunks) return;  // after every barrier of the CTA but leaf mode's (whose CTAs return whole)
    int64_t sink_row;
    bool bad_sink;  // reported by the merge
    n_sink = sink_count(p, b, len, sink_row, bad_sink);
  }

  const uint32_t ring =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + warp * kLeanStages * kLeanStageBytes + lane * 16;
  const int64_t page_stride = int64_t{H} * p.head_block_bytes;
  const uint8_t* k_head = p.k_pool + int64_t{h} * p.head_block_bytes;
  // V's unit = K's unit + this (the pools share one layout: same page, same head, same token offset).
  const int64_t vk_delta =
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.v_pool) - reinterpret_cast<uintptr_t>(p.k_pool));
  constexpr int kTokBytes = kLaneQ ? LK::kTokenBytes : D;  // bytes per token of one head's K (or V) in a page
  bool bad_page = false;
  // The warp's steps (32 tokens each): chunks split, split + cstride, ... (leaf mode: chunk `split` only), steps
  // [s_begin, s_end) of each (warp mode: all 16; leaf mode: leaf `warp`, kLeafSteps steps). Positions are int:
  // plan_decode bounds max_context by 2^30 and seq_len_of clamps to it.
  const int s_begin = leaf_mode ? kLeafSteps * warp : 0;
  const int s_end = leaf_mode ? s_begin + kLeafSteps : kChunkSteps;
  const int len32 = static_cast<int>(len);
  // KVPACK_LEAN_KROWS: this lane's K copy k of a unit lands in reader lane (4 (k % 2) + lane / 8) * 4 + col % 4,
  // piece 2 (k / 2) + col / 4 (col = lane % 8): the lane-dependent part of that slot address, relative to `ring`.
  const bool krows = (rows & 1) != 0;
  const bool vrows = (rows & 2) != 0;
  const int krows_col = lane % 8;
  const uint32_t krows_dst =
      uint32_t(((krows_col / 4) * 32 + (lane / 8) * 4 + krows_col % 4) * 16) - uint32_t(lane * 16);
  // KVPACK_LEAN_VROWS: V copy k (0..3) of this lane is row vr[k] = 4k + lane / 8 of the unit, 16-byte column
  // vc = lane % 8; its reader is lane 4 vc + (vr % 8) / 2, piece 4 + (vr & 1) + 2 (vr / 8) of the unit (relative to
  // the stage's first byte: vdst[k]).
  const int vc = lane % 8;
  int vr[4];
  uint32_t vdst[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    vr[k] = 4 * k + lane / 8;
    const int reader = 4 * vc + (vr[k] % 8) / 2, piece = 4 + (vr[k] & 1) + 2 * (vr[k] / 8);
    vdst[k] = uint32_t((piece * 32 + reader) * 16);
  }
  // v42: lane j holds the K address of unit j (16 tokens) of the chunk being issued, page checked, computed once per
  // chunk (a chunk is 32 units); a step's two units come from two lanes by shuffle. (Before, every step redid the
  // page lookup, the page check and the 64-bit address arithmetic of both units: ~200 of a q3 step's ~800
  // instructions, bench/NOTES.md v42.)
  int unit_chunk = -1;
  const uint8_t* unit_k = k_head;
  auto next_chunk = [&](int c) {
    if constexpr (kGF) return (c + 1) % kFoldChunks != 0 ? c + 1 : c + 1 + kFoldChunks * (cstride - 1);
    return c + cstride;
  };
  int ic = c_first, is = s_begin;  // the next step to issue
  int slot_i = 0;                // its ring slot
  auto issue = [&] {
    const int t0 = ic * kChunkTokens + is * kLeanStepTok;
    if (ic < n_chunks && t0 < len32) {
      if (ic != unit_chunk) {
        unit_chunk = ic;
        const int tu = ic * kChunkTokens + 16 * lane;  // a 16-token unit never crosses a page (pages hold >= 16)
        int page = 0;
        if (tu < len32) {
          page = p.table.pages[row + (tu >> p.page_shift)];
          if (page < 0 || page >= p.num_pages) {
            bad_page = true;
            page = 0;
          }
        }
        unit_k = k_head + int64_t{page} * page_stride + (tu & (p.page_size - 1)) * kTokBytes;
      }
      const uint32_t st = ring + slot_i * kLeanStageBytes;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const unsigned long long kb_bits = reinterpret_cast<uintptr_t>(unit_k);
        const uint8_t* kb = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, kb_bits, 2 * is + u));
        if constexpr (kLaneQ) {
          // Lane layout: a unit's bytes land in the ring as they are in the page (K unit, then V unit), lane-strided
          // 16-byte copies (q4: each lane's own pieces; q3, q3.5: read word-major by every lane, hence their __syncwarp).
          // Tokens past the sequence's end are read as they are (codes are always finite; their scores are masked,
          // their weights 0), so no bounds.
          constexpr int kUC = Geo::kUnitBytes / 16;  // 16-byte chunks per unit
          const uint8_t* kl = kb + lane * 16;
          const uint8_t* vl = kl + vk_delta;
          const uint32_t su = st + u * 2 * Geo::kUnitBytes;
#pragma unroll
          for (int j = 0; j < (kUC + 31) / 32; ++j)
            if (kUC % 32 == 0 || lane + 32 * j < kUC) {
              lean_cp16_full(su + j * 32 * 16, kl + j * 32 * 16);
              lean_cp16_full(su + Geo::kUnitBytes + j * 32 * 16, vl + j * 32 * 16);
            }
          continue;
        }
        const int tu = t0 + 16 * u;
        const int rem = min(len32 - tu, 16);  // tokens of the unit inside the sequence (<= 0: page 0, all zero-filled)
        const uint8_t* vb = kb + vk_delta;
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
          if (vrows) {
#pragma unroll
            for (int k = 0; k < 4; ++k)
              lean_cp16_full(su - lane * 16 + vdst[k], vb + vr[k] * D + 16 * vc);
            continue;
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
        if (vrows) {
#pragma unroll
          for (int k = 0; k < 4; ++k)
            lean_cp16(st - lane * 16 + u * 8 * 32 * 16 + vdst[k], vb + vr[k] * D + 16 * vc, vr[k] < rem);
          continue;
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
    if (++is == s_end) {
      is = s_begin;
      ic = next_chunk(ic);
    }
    if (++slot_i == kLeanStages) slot_i = 0;
  };
  // Leaf (current 128 tokens) state and chunk accumulator; per lane: heads 2q, 2q + 1; rows / channels as above.
  float o[kKB][4], co[kKB][4];
  float m0, m1, l0, l1, cm0, cm1, cl0, cl1;
  float t0s = 0.f, t1s = 0.f, ct0 = 0.f, ct1 = 0.f;  // q formats: L_tau of the leaf and of the chunk, heads 2q, 2q + 1
  auto reset_leaf = [&] {
#pragma unroll
    for (int i = 0; i < kKB; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m0 = m1 = -INFINITY;
    l0 = l1 = 0.f;
    t0s = t1s = 0.f;
  };
  // kWarpOnly: the chunk accumulator's home is this warp's shared-memory rows (LeanGeo::kAccBytes; row i < kKB: O's
  // k-block i, then (m0, m1, l0, l1), (L_tau0, L_tau1, -, -)), read and written a row at a time by volatile shared
  // accesses, so that at most a row of it is in registers (a fold, a chunk's store); the general instance keeps it
  // in co, cm, cl, ct.
  const uint32_t acc_s =
      kWO ? static_cast<uint32_t>(__cvta_generic_to_shared(smem + Geo::kAccOffset)) + (warp * Geo::kAccVec * 32 + lane) * 16
          : 0u;
  constexpr uint32_t kAccRow = 32 * 16;
  auto acc_scalars_load = [&] {
    if constexpr (kWO) {
      float a[4], t[4];
      lean_lds4(acc_s + kKB * kAccRow, a);
      lean_lds4(acc_s + (kKB + 1) * kAccRow, t);
      cm0 = a[0], cm1 = a[1], cl0 = a[2], cl1 = a[3];
      ct0 = t[0], ct1 = t[1];
    }
  };
  auto acc_scalars_save = [&] {
    if constexpr (kWO) {
      lean_sts4(acc_s + kKB * kAccRow, cm0, cm1, cl0, cl1);
      lean_sts4(acc_s + (kKB + 1) * kAccRow, ct0, ct1, 0.f, 0.f);
    }
  };
  // Row i of O's accumulator into c (kWarpOnly: from shared memory).
  auto acc_row = [&](int i, float (&c)[4]) {
    if constexpr (kWO) lean_lds4(acc_s + i * kAccRow, c);
    else c[0] = co[i][0], c[1] = co[i][1], c[2] = co[i][2], c[3] = co[i][3];
  };
  auto acc_row_set = [&](int i, const float (&c)[4]) {
    if constexpr (kWO) lean_sts4(acc_s + i * kAccRow, c[0], c[1], c[2], c[3]);
    else co[i][0] = c[0], co[i][1] = c[1], co[i][2] = c[2], co[i][3] = c[3];
  };
  auto reset_chunk = [&] {
#pragma unroll
    for (int i = 0; i < kKB; ++i) acc_row_set(i, {0.f, 0.f, 0.f, 0.f});
    cm0 = cm1 = -INFINITY;
    cl0 = cl1 = 0.f;
    ct0 = ct1 = 0.f;
    acc_scalars_save();
  };
  // acc = merge(acc, leaf); fixed arithmetic (explicit fmaf / mul).
  auto fold_leaf = [&] {
    acc_scalars_load();
    const float n0 = fmaxf(cm0, m0), n1 = fmaxf(cm1, m1);
    const float r0 = n0 == -INFINITY ? 0.f : n0, r1 = n1 == -INFINITY ? 0.f : n1;
    const float a0 = lean_ex2(cm0 - r0), a1 = lean_ex2(cm1 - r1), e0 = lean_ex2(m0 - r0), e1 = lean_ex2(m1 - r1);
#pragma unroll
    for (int i = 0; i < kKB; ++i) {
      float c[4];
      acc_row(i, c);
      c[0] = fmaf(c[0], a0, __fmul_rn(o[i][0], e0));
      c[1] = fmaf(c[1], a1, __fmul_rn(o[i][1], e1));
      c[2] = fmaf(c[2], a0, __fmul_rn(o[i][2], e0));
      c[3] = fmaf(c[3], a1, __fmul_rn(o[i][3], e1));
      acc_row_set(i, c);
    }
    cl0 = fmaf(cl0, a0, __fmul_rn(l0, e0));
    cl1 = fmaf(cl1, a1, __fmul_rn(l1, e1));
    if constexpr (kLaneQ) {
      ct0 = fmaf(ct0, a0, __fmul_rn(t0s, e0));
      ct1 = fmaf(ct1, a1, __fmul_rn(t1s, e1));
    }
    cm0 = n0;
    cm1 = n1;
    acc_scalars_save();
  };
  const int64_t ws_base = (int64_t{b} * H + h) * p.max_chunks;
  // kGroup: this lane's column of the warp's group accumulator (LeanGeo::kGroupBytes): value i at gacc[32 i]; O's
  // values i = 4 mb + 2 e + (head 2q + 1), then kGO + (m0, m1, l0, l1).
  constexpr int kGO = 4 * kKB;
  float* const gacc =
      kGF ? reinterpret_cast<float*>(smem + Geo::kGroupOffset) + warp * Geo::kGroupVals * 32 + lane : nullptr;
  auto reset_group = [&] {
    if constexpr (kGF) {
#pragma unroll
      for (int i = 0; i < kGO; ++i) gacc[32 * i] = 0.f;
      gacc[32 * kGO] = gacc[32 * (kGO + 1)] = -INFINITY;
      gacc[32 * (kGO + 2)] = gacc[32 * (kGO + 3)] = 0.f;
    }
  };
  // The chunk's partial: l summed over the 8 row lanes (fixed xor order), then (m, l) and the accumulators (kGroup:
  // folded into the group's accumulator, which is stored at the group's last chunk).
  auto store_chunk = [&](int64_t c) {
    acc_scalars_load();
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
      cl0 += __shfl_xor_sync(0xffffffffu, cl0, x);
      cl1 += __shfl_xor_sync(0xffffffffu, cl1, x);
      if constexpr (kLaneQ) {
        ct0 += __shfl_xor_sync(0xffffffffu, ct0, x);
        ct1 += __shfl_xor_sync(0xffffffffu, ct1, x);
      }
    }
    const int h0 = 2 * q, h1 = 2 * q + 1;
    if constexpr (kGF) {
      // acc = merge(acc, chunk c), the merge's first level per value: weights at the new running max
      // (lean_fold_weights), l and O by fmaf(acc, sa, chunk x sc); the chunk's values are exactly store_chunk's.
      float sa0, sc0, sa1, sc1;
      const float n0 = lean_fold_weights(gacc[32 * kGO], cm0, sa0, sc0);
      const float n1 = lean_fold_weights(gacc[32 * (kGO + 1)], cm1, sa1, sc1);
      gacc[32 * (kGO + 2)] = fmaf(gacc[32 * (kGO + 2)], sa0, __fmul_rn(cl0, sc0));
      gacc[32 * (kGO + 3)] = fmaf(gacc[32 * (kGO + 3)], sa1, __fmul_rn(cl1, sc1));
      gacc[32 * kGO] = n0;
      gacc[32 * (kGO + 1)] = n1;
#pragma unroll
      for (int mb = 0; mb < kKB; ++mb) {
        float cr[4];
        acc_row(mb, cr);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int gi = 2 * mb + e, i0 = 4 * mb + 2 * e;
          const float up = ldexpf(1.f, 24 - LV::group(gi).pos + (LV::shifted(gi) ? 6 : 0));
          const float off = 0.5f * static_cast<float>((1 << LV::bits(gi)) - 1);
          gacc[32 * i0] = fmaf(gacc[32 * i0], sa0, __fmul_rn(fmaf(cr[2 * e], up, -off * ct0), sc0));
          gacc[32 * (i0 + 1)] = fmaf(gacc[32 * (i0 + 1)], sa1, __fmul_rn(fmaf(cr[2 * e + 1], up, -off * ct1), sc1));
        }
      }
      if (c % kFoldChunks != kFoldChunks - 1 && c != n_chunks - 1) return;
      const int64_t gslot = ws_base + (c - c % kFoldChunks);  // the group's first chunk slot
      float2* gml = p.ws_ml + gslot * p.group;
      float* gout = p.ws_acc + gslot * p.group * D;
      if (g == 0) {
        if (h0 < p.group) __stcg(gml + h0, make_float2(gacc[32 * kGO], gacc[32 * (kGO + 2)]));
        if (h1 < p.group) __stcg(gml + h1, make_float2(gacc[32 * (kGO + 1)], gacc[32 * (kGO + 3)]));
      }
#pragma unroll
      for (int gi = 0; gi < 2 * kKB; ++gi) {
        const int ch = 8 * gi + g;
        if (h0 < p.group) __stcg(gout + h0 * D + ch, gacc[32 * (2 * gi)]);
        if (h1 < p.group) __stcg(gout + h1 * D + ch, gacc[32 * (2 * gi + 1)]);
      }
      reset_group();
      return;
    }
    const int64_t slot = ws_base + c;
    float2* ml = p.ws_ml + slot * p.group;
    float* acc = p.ws_acc + slot * p.group * D;
    if (g == 0) {
      if (h0 < p.group) __stcg(ml + h0, make_float2(cm0, cl0));
      if (h1 < p.group) __stcg(ml + h1, make_float2(cm1, cl1));
    }
    if constexpr (kLaneQ) {
      // Accumulator (group i = 2 mb (+1), member g) -> sum_t p_t tau_t (k - o): x 2^(24 - pos'_i) - o_i L_tau.
#pragma unroll
      for (int mb = 0; mb < kKB; ++mb) {
        float cr[4];
        acc_row(mb, cr);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int gi = 2 * mb + e;
          const float up = ldexpf(1.f, 24 - LV::group(gi).pos + (LV::shifted(gi) ? 6 : 0));
          const float off = 0.5f * static_cast<float>((1 << LV::bits(gi)) - 1);
          const int ch = 8 * gi + g;
          if (h0 < p.group) __stcg(acc + h0 * D + ch, fmaf(cr[2 * e], up, -off * ct0));
          if (h1 < p.group) __stcg(acc + h1 * D + ch, fmaf(cr[2 * e + 1], up, -off * ct1));
        }
      }
    } else if constexpr (KVPACK_LEAN_FP8_ST == 0) {
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
    } else {
      // Head 2q + e's channels 16 g + i (i < 16) are v[i]: (co[mb][e], co[mb][2 + e]) for mb = 0..7 in order. Quad j
      // = v[4j .. 4j + 3] (16 bytes), sector s = quads 2s, 2s + 1 of the lane's 64-byte block.
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int hh = e ? h1 : h0;
        float v[16];
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) v[2 * mb] = co[mb][e], v[2 * mb + 1] = co[mb][2 + e];
        float4* blk = reinterpret_cast<float4*>(acc + hh * D + 16 * g);  // this lane's block (16-byte aligned)
        if constexpr (KVPACK_LEAN_FP8_ST == 1) {
          if (hh < p.group)
#pragma unroll
            for (int j = 0; j < 4; ++j) __stcg(blk + j, make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]));
        } else {
          // Pair (a = even g, b = a + 1, lane ^ 4): a sends its quad 2s + 1, b its quad 2s. Store 1 fills sector s of
          // a's block (a: its quad 2s, b: a's quad 2s + 1), store 2 sector s of b's block (a: b's quad 2s, b: its
          // quad 2s + 1).
          const bool odd = g & 1;
#pragma unroll
          for (int sct = 0; sct < 2; ++sct) {
            float r[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) r[i] = __shfl_xor_sync(0xffffffffu, odd ? v[8 * sct + i] : v[8 * sct + 4 + i], 4);
            const float4 rq = make_float4(r[0], r[1], r[2], r[3]);
            const float4 lo = make_float4(v[8 * sct], v[8 * sct + 1], v[8 * sct + 2], v[8 * sct + 3]);
            const float4 hi = make_float4(v[8 * sct + 4], v[8 * sct + 5], v[8 * sct + 6], v[8 * sct + 7]);
            if (hh < p.group) {  // the same for both lanes of a pair (same q)
              __stcg(odd ? blk - 4 + 2 * sct + 1 : blk + 2 * sct, odd ? rq : lo);
              __stcg(odd ? blk + 2 * sct + 1 : blk + 4 + 2 * sct, odd ? hi : rq);
            }
          }
        }
      }
    }
  };

#pragma unroll
  for (int i = 0; i < kLeanStages - 1; ++i) issue();
  if constexpr (kLaneQ) {
    // The prepared query (lean_q_prep_kernel's fragment order: lane (g, q)'s 2 kKB words contiguous, then the 8
    // heads' (2^-E, q'.o, q.mu)); with PDL this is the first read that depends on the prep kernel.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    const int64_t bh = int64_t{b} * H + h;
    const uint4* qw = reinterpret_cast<const uint4*>(p.ws_qh + (bh * 32 + lane) * (2 * kKB));
#pragma unroll
    for (int k = 0; k < kKB / 2; ++k) {
      const uint4 w = __ldcg(qw + k);
      qb[2 * k][0] = w.x, qb[2 * k][1] = w.y, qb[2 * k + 1][0] = w.z, qb[2 * k + 1][1] = w.w;
    }
    const float4 c0 = __ldcg(p.ws_qc + bh * 8 + 2 * q), c1 = __ldcg(p.ws_qc + bh * 8 + 2 * q + 1);
    un0 = c0.x, qo0 = c0.y, cz0 = c0.z;
    un1 = c1.x, qo1 = c1.y, cz1 = c1.z;
  }
  KVPACK_STAMP(stamps[1]);
  reset_leaf();
  reset_chunk();
  reset_group();
  int cc = c_first, cs = s_begin, slot_c = 0;  // the step to compute, its ring slot
  for (;;) {
    const int t0 = cc * kChunkTokens + cs * kLeanStepTok;
    if (cc >= n_chunks || t0 >= len32) break;
    // Lanes that read each other's copies (q3, q3.5; fp8 with KVPACK_LEAN_KROWS or KVPACK_LEAN_VROWS): every lane has
    // read the slot the next copies refill, and (after the wait) the other lanes' copies have landed.
    const bool shared_slots = Geo::kWordMajor || rows != 0;
    if (shared_slots) __syncwarp();
    issue();
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kLeanStages - 1));
    if (shared_slots) __syncwarp();
    const uint32_t st = ring + slot_c * kLeanStageBytes;
    const uint32_t st_base = st - lane * 16;  // the stage's first byte (q: units [u][K|V])
    float sc[2][4];
    // ---- scores of the step's two units ----
    if constexpr (kLaneQ) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        constexpr int W = LK::kSlots;
        uint32_t k0[W], k8[W], s0[W], s8[W];  // tokens g and g + 8 at their slots' positions, and >> 6
        lean_q_rows<LK>(st_base + u * 2 * Geo::kUnitBytes, lane, k0, k8, s0, s8);
        // The scale bytes of tokens g and g + 8: bits 2q, 2q + 1 in this lane's last words (bits 15, 31), OR-ed
        // over the quad.
        const uint32_t la = k0[LK::kScaleSlot], lb = k8[LK::kScaleSlot];
        uint32_t sv = ((((la >> 15) & 1u) | ((la >> 30) & 2u)) << (2 * q)) | ((((lb >> 15) & 1u) | ((lb >> 30) & 2u)) << (2 * q + 8));
        sv |= __shfl_xor_sync(0xffffffffu, sv, 1);
        sv |= __shfl_xor_sync(0xffffffffu, sv, 2);
        const float tk0 = tau_s[sv & 0xffu], tk8 = tau_s[(sv >> 8) & 0xffu];
        // KVPACK_LEAN_SCORE_CHAINS (v56): the k-blocks' products accumulate in that many independent chains (kb
        // modulo the count), summed in a fixed order at the end (2: the even and the odd k-blocks, then c += c'),
        // so that the unit's HMMAs are not one dependent chain of kKB. Part of the numerical definition (every plan
        // and instance runs the same sums).
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        float c2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kb = 0; kb < kKB; ++kb)  // groups 2 kb (a0: token g, a1: token g + 8) and 2 kb + 1 (a2, a3)
          mma_f16_full(KVPACK_LEAN_SCORE_CHAINS == 2 && kb % 2 ? c2 : c, lean_q_pair<LK>(k0, s0, 2 * kb),
                       lean_q_pair<LK>(k8, s8, 2 * kb), lean_q_pair<LK>(k0, s0, 2 * kb + 1),
                       lean_q_pair<LK>(k8, s8, 2 * kb + 1), qb[kb][0], qb[kb][1]);
        if constexpr (KVPACK_LEAN_SCORE_CHAINS == 2)
          c[0] = __fadd_rn(c[0], c2[0]), c[1] = __fadd_rn(c[1], c2[1]), c[2] = __fadd_rn(c[2], c2[2]),
          c[3] = __fadd_rn(c[3], c2[3]);
        sc[u][0] = fmaf(tk0, fmaf(c[0], un0, -qo0), cz0);
        sc[u][1] = fmaf(tk0, fmaf(c[1], un1, -qo1), cz1);
        sc[u][2] = fmaf(tk8, fmaf(c[2], un0, -qo0), cz0);
        sc[u][3] = fmaf(tk8, fmaf(c[3], un1, -qo1), cz1);
      }
      // Tokens outside [n_sink, len) (the sink pool's positions, the sequence's end) score -inf. v58: only a step
      // that holds such tokens runs the masks (a warp-uniform branch; the same scores either way).
      if (KVPACK_LEAN_TAIL_MASK == 0 || t0 < n_sink || t0 + kLeanStepTok > len32) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int ta = t0 + 16 * u + g;
          const bool v0 = ta < len32 && ta >= n_sink, v8 = ta + 8 < len32 && ta + 8 >= n_sink;
          sc[u][0] = v0 ? sc[u][0] : -INFINITY;
          sc[u][1] = v0 ? sc[u][1] : -INFINITY;
          sc[u][2] = v8 ? sc[u][2] : -INFINITY;
          sc[u][3] = v8 ? sc[u][3] : -INFINITY;
        }
      }
    } else
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint32_t kw[16];  // [token g: 8 words][token g + 8: 8 words]
#pragma unroll
      for (int k = 0; k < 4; ++k)
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(kw[4 * k]), "=r"(kw[4 * k + 1]), "=r"(kw[4 * k + 2]), "=r"(kw[4 * k + 3])
                     : "r"(st + ((u * 8 + k) * 32) * 16));
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      float c2[4] = {0.f, 0.f, 0.f, 0.f};
      // v67 (KVPACK_LEAN_FP8_LAZY): two HMMA chains (the even and the odd k-blocks, then c += c'), as the q formats'
      // KVPACK_LEAN_SCORE_CHAINS; part of that numerical definition.
#pragma unroll
      for (int kb = 0; kb < 8; ++kb)
        mma_f16_full(KVPACK_LEAN_FP8_LAZY && kb % 2 ? c2 : c, e4m3x2_to_f16x2_half<0>(kw[kb]),
                     e4m3x2_to_f16x2_half<0>(kw[8 + kb]), e4m3x2_to_f16x2_half<1>(kw[kb]),
                     e4m3x2_to_f16x2_half<1>(kw[8 + kb]), qb[kb][0], qb[kb][1]);
      if constexpr (KVPACK_LEAN_FP8_LAZY)
        c[0] = __fadd_rn(c[0], c2[0]), c[1] = __fadd_rn(c[1], c2[1]), c[2] = __fadd_rn(c[2], c2[2]),
        c[3] = __fadd_rn(c[3], c2[3]);
      sc[u][0] = c[0] * qe0;
      sc[u][1] = c[1] * qe1;
      sc[u][2] = c[2] * qe0;
      sc[u][3] = c[3] * qe1;
      // Tokens at or past the sequence's end score -inf (v67 with KVPACK_LEAN_FP8_LAZY: only on a step that holds
      // such tokens, a warp-uniform branch; the same scores either way).
      if (KVPACK_LEAN_FP8_LAZY == 0 || t0 + kLeanStepTok > len32) {
        const int ta = t0 + 16 * u + g;
        sc[u][0] = ta < len32 ? sc[u][0] : -INFINITY;
        sc[u][1] = ta < len32 ? sc[u][1] : -INFINITY;
        sc[u][2] = ta + 8 < len32 ? sc[u][2] : -INFINITY;
        sc[u][3] = ta + 8 < len32 ? sc[u][3] : -INFINITY;
      }
    }
    // ---- online softmax of the leaf over this step ----
    // The lane's own maxima of its rows (heads 2q, 2q + 1), then (row_max) over the row's 8 lanes.
    const float lm0 = fmaxf(fmaxf(sc[0][0], sc[0][2]), fmaxf(sc[1][0], sc[1][2]));
    const float lm1 = fmaxf(fmaxf(sc[0][1], sc[0][3]), fmaxf(sc[1][1], sc[1][3]));
    float mx0, mx1;
    auto row_max = [&] {
      mx0 = fmaxf(m0, lm0);
      mx1 = fmaxf(m1, lm1);
#pragma unroll
      for (int x = 4; x < 32; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
      }
    };
    // Rescale the leaf's sums by al0, al1 (the old reference max over the new one).
    auto rescale = [&](float al0, float al1) {
      l0 *= al0;
      l1 *= al1;
      if constexpr (kLaneQ) {
        t0s *= al0;
        t1s *= al1;
      }
#pragma unroll
      for (int mb = 0; mb < kKB; ++mb) {
        o[mb][0] *= al0;
        o[mb][1] *= al1;
        o[mb][2] *= al0;
        o[mb][3] *= al1;
      }
    };
    float r0, r1;
    if constexpr ((kLaneQ || KVPACK_LEAN_FP8_LAZY) && KVPACK_LEAN_LAZY > 0) {
      // v57 (q formats): the leaf's reference max m is set by its first step and moves only when a step's max passes
      // it by more than KVPACK_LEAN_LAZY (log2 units), so most steps skip the rescale. The weights p = 2^(s - m)
      // then stay <= 2^LAZY, and p tau_V < 2^LAZY x 2^8 fits f16. The rescale runs for the whole warp when any of its
      // heads moves (the others by exactly 1). Part of the numerical definition: a leaf's sums depend on its tokens
      // only, as before, so every plan and instance gives the same bits.
      constexpr float kLazy = static_cast<float>(KVPACK_LEAN_LAZY);
      if (cs % kLeafSteps == 0) {
        row_max();
        m0 = mx0;  // a leaf's first step: its sums are still zero
        m1 = mx1;
      } else {
        // v57b (KVPACK_LEAN_LAZY_VOTE): a row's max passes m + LAZY exactly when one of its lanes' own maxima does,
        // so the warp votes on the lanes' maxima and reduces over the row only when a rescale follows: the same
        // decision and the same values as reducing first (same bits), without the 6 shuffles on most steps.
        bool any_up = true;
        if constexpr (KVPACK_LEAN_LAZY_VOTE) any_up = __any_sync(0xffffffffu, lm0 > m0 + kLazy || lm1 > m1 + kLazy);
        if (any_up) {
          row_max();
          const bool up0 = mx0 > m0 + kLazy, up1 = mx1 > m1 + kLazy;  // m = -inf: any finite max moves it
          if (KVPACK_LEAN_LAZY_VOTE || __any_sync(0xffffffffu, up0 || up1)) {  // the vote already said so
            rescale(up0 ? lean_ex2(m0 - mx0) : 1.f, up1 ? lean_ex2(m1 - mx1) : 1.f);
            m0 = up0 ? mx0 : m0;
            m1 = up1 ? mx1 : m1;
          }
        }
      }
      r0 = m0 == -INFINITY ? 0.f : m0;
      r1 = m1 == -INFINITY ? 0.f : m1;
    } else {
      row_max();
      r0 = mx0 == -INFINITY ? 0.f : mx0;
      r1 = mx1 == -INFINITY ? 0.f : mx1;
      // A leaf's first step skips the rescale: its sums are still zero (x 0 = 0).
      if (cs % kLeafSteps != 0) rescale(lean_ex2(m0 - r0), lean_ex2(m1 - r1));
      m0 = mx0;
      m1 = mx1;
    }
    // ---- P.V ----
    if constexpr (kLaneQ) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        constexpr int W = LV::kSlots;
        uint32_t v0[W], v1[W], t0w[W], t1w[W];  // pairs (2q, 2q + 1) and (8 + 2q, 9 + 2q), and >> 6
        lean_q_rows<LV>(st_base + u * 2 * Geo::kUnitBytes + Geo::kUnitBytes, lane, v0, v1, t0w, t1w);
        // V scale bytes: bit g' of token 2q' (+1, +8, +9) is bit 15 / 31 of lane (g', q')'s last word of that pair.
        const uint32_t la = v0[LV::kScaleSlot], lb = v1[LV::kScaleSlot];
        const uint32_t bal0 = __ballot_sync(0xffffffffu, (la >> 15) & 1u), bal1 = __ballot_sync(0xffffffffu, la >> 31);
        const uint32_t bal2 = __ballot_sync(0xffffffffu, (lb >> 15) & 1u), bal3 = __ballot_sync(0xffffffffu, lb >> 31);
#if KVPACK_LEAN_VSCALE_COOP
        // v56: lane l gathers the byte of the unit's token l % 16 (tokens 0-7: ballots 0 / 1 by parity, 8-15: 2 / 3)
        // and looks up its scale; lanes g and 8 + g hand tokens g and g + 8 to the lanes that need them (the same
        // values as each lane gathering both itself: one byte gathered per lane instead of two).
        const int tj = lane & 15;
        const float tj_tau = tau_s[lean_ballot_byte(tj < 8 ? (tj & 1 ? bal1 : bal0) : (tj & 1 ? bal3 : bal2), (tj & 7) >> 1)];
        const float tv0 = __shfl_sync(0xffffffffu, tj_tau, g), tv8 = __shfl_sync(0xffffffffu, tj_tau, g + 8);
#else
        const float tv0 = tau_s[lean_ballot_byte(g & 1 ? bal1 : bal0, g >> 1)];
        const float tv8 = tau_s[lean_ballot_byte(g & 1 ? bal3 : bal2, g >> 1)];
#endif
        const float p0 = lean_ex2(sc[u][0] - r0), p1 = lean_ex2(sc[u][1] - r1);
        const float p2 = lean_ex2(sc[u][2] - r0), p3 = lean_ex2(sc[u][3] - r1);
        l0 += p0 + p2;
        l1 += p1 + p3;
        const __half2 h01 = __floats2half2_rn(p0 * tv0, p1 * tv0), h23 = __floats2half2_rn(p2 * tv8, p3 * tv8);
        t0s += __low2float(h01) + __low2float(h23);  // L_tau: the weights exactly as the mma uses them
        t1s += __high2float(h01) + __high2float(h23);
        const uint32_t b0 = lean_trans(*reinterpret_cast<const uint32_t*>(&h01));
        const uint32_t b1 = lean_trans(*reinterpret_cast<const uint32_t*>(&h23));
#pragma unroll
        for (int mb = 0; mb < kKB; ++mb)  // rows g (group 2 mb), g + 8 (group 2 mb + 1); pair 0 (a0, a1), pair 1 (a2, a3)
          mma_f16_full(o[mb], lean_q_pair<LV>(v0, t0w, 2 * mb), lean_q_pair<LV>(v0, t0w, 2 * mb + 1),
                       lean_q_pair<LV>(v1, t1w, 2 * mb), lean_q_pair<LV>(v1, t1w, 2 * mb + 1), b0, b1);
      }
    } else
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
        mma_f16_full(o[2 * j], e4m3x2_to_f16x2_half<0>(a_lo), e4m3x2_to_f16x2_half<1>(a_lo),
                     e4m3x2_to_f16x2_half<0>(b_lo), e4m3x2_to_f16x2_half<1>(b_lo), b0, b1);
        mma_f16_full(o[2 * j + 1], e4m3x2_to_f16x2_half<0>(a_hi), e4m3x2_to_f16x2_half<1>(a_hi),
                     e4m3x2_to_f16x2_half<0>(b_hi), e4m3x2_to_f16x2_half<1>(b_hi), b0, b1);
      }
    }
    // ---- leaf / chunk boundaries (a leaf is kLeafSteps steps; the sequence's last chunk may end early) ----
    const bool last = t0 + kLeanStepTok >= len32;
    if (!leaf_mode) {  // leaf mode: the warp's one leaf stays in o, m, l (folded after the loop)
      const bool chunk_end = cs == kChunkSteps - 1 || last;
      if (cs % kLeafSteps == kLeafSteps - 1 || chunk_end) {
        fold_leaf();
        reset_leaf();
      }
      if (chunk_end) {
        store_chunk(cc);
        reset_chunk();
        if (last) break;  // that was the sequence's last chunk
      }
    }
    if (++cs == s_end) {
      cs = s_begin;
      cc = next_chunk(cc);
    }
    if (++slot_c == kLeanStages) slot_c = 0;
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  KVPACK_STAMP(stamps[2]);
  if (bad_page && p.status) atomicOr(p.status, 1);
  if (leaf_mode) {
    // Each warp's leaf into its own (drained) ring, [kLeafVals values][lane]; then warp 0 folds leaves 0..3 in order
    // with warp mode's arithmetic.
    constexpr int NO = 4 * kKB;  // LeanGeo checks that kLeafVals values of 32 lanes fit a warp's ring
    __syncwarp();  // every lane's copies have landed before any lane overwrites the ring
    float* lw = reinterpret_cast<float*>(smem + size_t(warp) * kLeanStages * kLeanStageBytes);
#pragma unroll
    for (int mb = 0; mb < kKB; ++mb)
#pragma unroll
      for (int e = 0; e < 4; ++e) lw[(4 * mb + e) * 32 + lane] = o[mb][e];
    lw[NO * 32 + lane] = m0;
    lw[(NO + 1) * 32 + lane] = m1;
    lw[(NO + 2) * 32 + lane] = l0;
    lw[(NO + 3) * 32 + lane] = l1;
    if constexpr (kLaneQ) {
      lw[(NO + 4) * 32 + lane] = t0s;
      lw[(NO + 5) * 32 + lane] = t1s;
    }
    __syncthreads();
    if (warp != 0) {
      KVPACK_STAMP(stamps[3]);
      if (lane == 0) KVPACK_STAMP_RECORD(kLean, warp, p.table.pages, stamps, 4);
      return;
    }
    reset_chunk();
#pragma unroll 1
    for (int leaf = 0; leaf < kLeanWarps; ++leaf) {
      const float* src = reinterpret_cast<const float*>(smem + size_t(leaf) * kLeanStages * kLeanStageBytes);
#pragma unroll
      for (int mb = 0; mb < kKB; ++mb)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mb][e] = src[(4 * mb + e) * 32 + lane];
      m0 = src[NO * 32 + lane];
      m1 = src[(NO + 1) * 32 + lane];
      l0 = src[(NO + 2) * 32 + lane];
      l1 = src[(NO + 3) * 32 + lane];
      if constexpr (kLaneQ) {
        t0s = src[(NO + 4) * 32 + lane];
        t1s = src[(NO + 5) * 32 + lane];
      }
      // Leaves past the sequence's end (all heads -inf) are skipped, as warp mode never reaches them (folding one
      // would change nothing: its weight ex2(-inf) is 0 and the accumulator's ex2(0) is 1).
      if (m0 == -INFINITY && m1 == -INFINITY) continue;
      fold_leaf();
    }
    store_chunk(split);
  }
  KVPACK_STAMP(stamps[3]);
  if (lane == 0) KVPACK_STAMP_RECORD(kLean, warp, p.table.pages, stamps, 4);
#endif
}

// q formats: the query preparation, once per (sequence, kv head) (grid (H P, batch), kLeanWarps x 32 threads), into
// the workspace for every lean CTA of that pair: q' = s * (G^T q) (x qk_scale log2 e) as f16 fragments with a power of
// two 2^E per head and each K group's 2^(24 - pos') folded in, and per head (2^-E, q'.o, q.mu). It was the lean
// kernel's prologue (v36), run by every CTA: ~10 dependent L2 round trips and D x D x 4 bytes of L2 reads per CTA,
// as many bytes as the cache itself at batch 1 (bench/NOTES.md v40). Same arithmetic, same order: same bits.
// P CTAs share a (sequence, kv head), each 8 / P of the 8 (padded) query heads: P = 1, or P = 4 where the grid is
// small (v48: one CTA's G^T q over 8 heads took ~3.5 us of a batch-1 launch's critical path; with P = 4 each CTA
// reads G whole but sums 2 heads). Every head's arithmetic is the same for both, so are the bits.
// Output order: ws_qh[(b H + h) 32 + lane][2 kKB] = lane (g, q)'s fragments qb[kb][0..1] (head g, channels
// 8 (2 kb) + 2q, + 1 and 8 (2 kb + 1) + 2q, + 1), so the lean kernel reads its lane's words as kKB / 2 uint4.
template <int D, int B2, int P>
__global__ void __launch_bounds__(kLeanWarps * 32) lean_q_prep_kernel(const DecodeKernelParams p) {
  using LK = block::QLanes<B2, D, false>;
  constexpr int kKB = D / 16, kThreads = kLeanWarps * 32, kH = 8 / P;  // heads of this CTA
  static_assert(P == 1 || P == 4, "1 or 4 CTAs per (sequence, kv head)");
  KVPACK_STAMP_DECL(stamps, 2);
  KVPACK_STAMP(stamps[0]);
  const int h = blockIdx.x / P, h0 = kH * (blockIdx.x % P), b = blockIdx.y, tid = threadIdx.x, warp = tid / 32,
            lane = tid % 32;
  __shared__ __align__(16) float q_s[kH * D];  // q * qk_scale_log2 of heads h0 .. h0 + kH - 1 (heads >= group: 0)
  __shared__ float t_s[kH * D];   // q'_c 2^(24 - pos'_c)
  __shared__ __half hq_s[kH * D];  // the f16 fragments' values
  __shared__ int kexp_s[D / 8];   // per K group: the power of two 24 - pos' of its codes as read
  __shared__ float koff_s[D / 8];  // and its zero point o = (2^w - 1) / 2
  // G (D x D floats, the head's inverse transform) staged whole with cp.async, issued first: with the query's, the
  // scales' and mu's loads, the preparation's one memory round trip (v47; before, G's columns came 32 rows at a
  // time: ~5 dependent round trips, 6-11 us on the critical path of every lean CTA).
  extern __shared__ __align__(16) float g_sm[];  // [D][D] row-major
  const block::QParams kq = p.fp.qk.head(h, D);
  {
    const uint32_t gs = static_cast<uint32_t>(__cvta_generic_to_shared(g_sm));
#pragma unroll
    for (int i = tid; i < D * D / 4; i += kThreads)
      lean_cp16_full(gs + 16 * i, kq.inv + 4 * i);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  // G^T q. P = 1: a register tile, thread tid owns columns 4 cq .. 4 cq + 3 of heads kHpt hq .. kHpt hq + kHpt - 1;
  // P = 4: thread tid owns column tid % D of kHpt heads (D = 128: both, D = 64: head tid / 64).
  constexpr int kCQ = P == 1 ? D / 4 : D, kHpt = kH * kCQ / kThreads;
  static_assert(kHpt * kThreads == kH * kCQ && (kHpt == 1 || kHpt == 2), "the tile covers D columns x kH heads");
  const int cq = tid % kCQ, hq = tid / kCQ;
  float4 step4{};
  if constexpr (P == 1)
    step4 = __ldg(reinterpret_cast<const float4*>(kq.step) + cq);
  else
    step4.x = __ldg(kq.step + cq);
  float mu[D / 32];
#pragma unroll
  for (int k = 0; k < D / 32; ++k) mu[k] = __ldg(kq.mean + lane + 32 * k);
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      kexp_s[i] = 24 - LK::group(i).pos + (LK::shifted(i) ? 6 : 0);
      koff_s[i] = 0.5f * static_cast<float>((1 << LK::bits(i)) - 1);
    }
  }
#pragma unroll
  for (int i = tid; i < kH * D; i += kThreads) {
    const int hg = h0 + i / D, r = i % D;
    q_s[i] = hg < p.group ? bf16_to_f32(p.q[(int64_t{b} * p.num_qo_heads + h * p.group + hg) * D + r]) * p.qk_scale_log2
                          : 0.f;
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The lean kernel (launched with PDL) may start its copies once every preparation CTA has its inputs: launched
  // earlier, its copies (up to ~20 MB at once) queued in front of these loads and made this kernel's one memory
  // round trip 6-9 us (bench/NOTES.md v47). It waits for this grid's completion before reading the output.
  // decode_step: not before the step's write has finished (below).
  if (!p.prep_after_write) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int64_t bh = int64_t{b} * p.num_kv_heads + h;
  float4* hc = p.ws_qc + bh * 8;
  // Each (column, head) summed over r in order (the sums of v36). P = 1 as a register tile of 4 columns x kHpt heads
  // per thread: per 4 rows, 4 + kHpt 16-byte shared loads for 16 kHpt FMAs (v47a's one column x 8 heads per thread
  // took 9 shared loads per 8 FMAs and left the kernel bound by shared-load issue: ~7 us at batch 1).
  if constexpr (P == 1) {
    float a[kHpt][4];
#pragma unroll
    for (int i = 0; i < kHpt; ++i) a[i][0] = a[i][1] = a[i][2] = a[i][3] = 0.f;
#pragma unroll 2
    for (int r0 = 0; r0 < D; r0 += 4) {
      float4 qv[kHpt];
#pragma unroll
      for (int i = 0; i < kHpt; ++i) qv[i] = *reinterpret_cast<const float4*>(q_s + (kHpt * hq + i) * D + r0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 g4 = *reinterpret_cast<const float4*>(g_sm + (r0 + j) * D + 4 * cq);
#pragma unroll
        for (int i = 0; i < kHpt; ++i) {
          const float qq = j == 0 ? qv[i].x : j == 1 ? qv[i].y : j == 2 ? qv[i].z : qv[i].w;
          a[i][0] = fmaf(g4.x, qq, a[i][0]);
          a[i][1] = fmaf(g4.y, qq, a[i][1]);
          a[i][2] = fmaf(g4.z, qq, a[i][2]);
          a[i][3] = fmaf(g4.w, qq, a[i][3]);
        }
      }
    }
    const float st[4] = {step4.x, step4.y, step4.z, step4.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c = 4 * cq + k;
      const float up = ldexpf(st[k], kexp_s[c / 8]);
#pragma unroll
      for (int i = 0; i < kHpt; ++i) t_s[(kHpt * hq + i) * D + c] = a[i][k] * up;
    }
  } else {
    float a[kHpt] = {};
#pragma unroll 4
    for (int r0 = 0; r0 < D; r0 += 4) {
      float4 qv[kHpt];
#pragma unroll
      for (int i = 0; i < kHpt; ++i) qv[i] = *reinterpret_cast<const float4*>(q_s + (kHpt * hq + i) * D + r0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float g1 = g_sm[(r0 + j) * D + cq];
#pragma unroll
        for (int i = 0; i < kHpt; ++i)
          a[i] = fmaf(g1, j == 0 ? qv[i].x : j == 1 ? qv[i].y : j == 2 ? qv[i].z : qv[i].w, a[i]);
      }
    }
    const float up = ldexpf(step4.x, kexp_s[cq / 8]);
#pragma unroll
    for (int i = 0; i < kHpt; ++i) t_s[(kHpt * hq + i) * D + cq] = a[i] * up;
  }
  // q . mu and the epilogue: warp w takes local heads kH w / 4 .. (P = 1: 2 w, 2 w + 1; P = 4: warps 0, 1 one each).
  constexpr int kHpw = (kH + kLeanWarps - 1) / kLeanWarps;
  static_assert(kHpw * kLeanWarps == kH || (kHpw == 1 && kH < kLeanWarps), "heads per warp");
  float cz[kHpw];
  {  // q . mu: lane sums over r = lane + 32 k in order of k, then a fixed xor tree
#pragma unroll
    for (int hh = 0; hh < kHpw; ++hh) {
      const int hl = kHpw * warp + hh;
      float a = 0.f;
      if (hl < kH) {
#pragma unroll
        for (int k = 0; k < D / 32; ++k) a = fmaf(q_s[hl * D + lane + 32 * k], mu[k], a);
      }
#pragma unroll
      for (int x = 16; x >= 1; x /= 2) a += __shfl_xor_sync(0xffffffffu, a, x);
      cz[hh] = a;
    }
  }
  __syncthreads();
  // 2^E puts the head's largest |value| in [2^13, 2^14); q'.o from the rounded f16 values (what the mma uses), per
  // lane over its channels in order, then a fixed shuffle tree.
#pragma unroll
  for (int hh = 0; hh < kHpw; ++hh) {
    const int hl = kHpw * warp + hh;
    if (hl >= kH) break;  // warp-uniform
    float mx = 0.f;
    for (int c = lane; c < D; c += 32) mx = fmaxf(mx, fabsf(t_s[hl * D + c]));
#pragma unroll
    for (int x = 16; x >= 1; x /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    const int E = f16_range_exponent(mx);
    float qo = 0.f;
    for (int c = lane; c < D; c += 32) {
      const __half hv = __float2half_rn(ldexpf(t_s[hl * D + c], E));
      hq_s[hl * D + c] = hv;
      qo = fmaf(__half2float(hv) * ldexpf(1.f, -kexp_s[c / 8] - E), koff_s[c / 8], qo);
    }
#pragma unroll
    for (int x = 16; x >= 1; x /= 2) qo += __shfl_xor_sync(0xffffffffu, qo, x);
    if (lane == 0) __stcg(hc + h0 + hl, make_float4(ldexpf(1.f, -E), qo, cz[hh], 0.f));
  }
  __syncthreads();
  // The fragments of this CTA's heads: lanes 4 h0 .. 4 (h0 + kH) - 1.
  for (int i = tid; i < 4 * kH * 2 * kKB; i += kThreads) {
    const int ll = i / (2 * kKB), kb = (i % (2 * kKB)) / 2, j = i % 2, c = 8 * (2 * kb + j) + 2 * (ll % 4);
    const __half2 v = __halves2half2(hq_s[(ll / 4) * D + c], hq_s[(ll / 4) * D + c + 1]);
    __stcg(p.ws_qh + (bh * 32 + 4 * h0) * 2 * kKB + i, *reinterpret_cast<const uint32_t*>(&v));
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // decode_step: this grid was launched with PDL behind the write kernel and ran beside it (it reads only the query
  // and the calibration, both ready before the write). The lean kernel, launched once every CTA of this grid has
  // exited, copies the pages the write stores into: wait for the write's grid (and its memory) first.
  if (p.prep_after_write) asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  KVPACK_STAMP(stamps[1]);
  if (tid == 0) KVPACK_STAMP_RECORD(kPrep, 0, p.table.pages, stamps, 2);
}

// One CTA per (sequence, kv head, query head of the group): fold the chunk partials with the fixed two-level tree
// (chunks 16 g .. 16 g + 15 in order, then the groups in order; a sequence of <= 16 chunks is one group), then the
// output. S slices (a template parameter: 1, 2, 4, 8 or 16; lean_merge_slices picks it) of kMergeSliceThreads threads
// (D / 64 channels each) fold S groups per round: the round's partials are staged in shared memory with cp.async
// first (one memory round trip for up to S x 16 chunks: a 128k sequence is 16 groups), then each (group, channel)
// folds its 16 chunks from shared memory, and threads < D fold the round's group results in group order. Every S gives
// the bits of one slice folding every group (the same merges in the same order, explicit fmaf / __fmul_rn).
//
// What does not depend on the lean kernel (the length, the sink scores, the output rotation's first rows of G, the
// scales) is read before griddepcontrol.wait, while the lean kernel's last CTAs run (bench/NOTES.md v47: the merge
// was a chain of ~8 dependent memory round trips after the wait, 8-18 us at batch 1).
//
// q formats: the folded sum is sum_t p_t tau_t (k_t - o) per channel (the kernel's chunk ends convert it), so the output
// is (mu L + G (s * O)) / L with the sink tokens (exact bf16) folded in by log-sum-exp, as the regular kernel's
// epilogue does; fixed orders throughout.
constexpr int kMergeSliceThreads = 64;
inline std::atomic<int> g_force_merge_slices{0};  // lean_force_merge_slices (tests)
inline std::atomic<int> g_force_mix{0};            // lean_force_mix (tests)
inline std::atomic<bool> g_force_general{false};   // lean_force_general_instance (tests)
inline std::atomic<bool> g_force_warp_only{false}; // lean_force_warp_only_instance (tests)
inline std::atomic<int> g_force_group_fold{0};     // lean_force_group_fold (tests): 1 on, -1 off, 0 the rule
inline thread_local LeanLaunchInfo g_last_lean;    // lean_last_launch (kvpack bench)
// Dynamic shared memory of a merge CTA of S slices: the round's partials (S x 16 chunks x D floats) and their (m, l).
template <int D>
constexpr size_t lean_merge_smem(int slices) {
  return size_t(slices) * kFoldChunks * (D * sizeof(float) + sizeof(float2));
}
template <int D, int B2, int S>
__global__ void __launch_bounds__(S * kMergeSliceThreads) lean_merge_kernel(const DecodeKernelParams p) {
  constexpr int kThreads = S * kMergeSliceThreads, kWarps = kThreads / 32, C = D / kMergeSliceThreads;
  static_assert(C * kMergeSliceThreads == D, "a slice covers D channels");
  // The group fold and the epilogue: channels tid + e kThreads, e < kCh (kCh = 2 only for D = 128 at one slice).
  constexpr int kCh = (D + kThreads - 1) / kThreads;
  KVPACK_STAMP_DECL(stamps, 5);
  KVPACK_STAMP(stamps[0]);
  extern __shared__ __align__(16) uint8_t merge_smem[];
  float* acc_s = reinterpret_cast<float*>(merge_smem);                      // [S x 16 chunks][D]
  float2* ml_s = reinterpret_cast<float2*>(acc_s + S * kFoldChunks * D);    // [S x 16 chunks]
  __shared__ float fo_s[S][D];
  __shared__ float2 fml_s[S], w_s[S * kFoldChunks];
  const int b = blockIdx.y, h = blockIdx.x, hg = blockIdx.z, H = p.num_kv_heads;
  const int tid = threadIdx.x, slice = tid / kMergeSliceThreads, r = tid % kMergeSliceThreads;
  const int w = tid / 32, ln = tid % 32;
  // ---- independent of the lean kernel ----
  int64_t row;
  bool over;
  const int64_t len = seq_len_of(p, b, row, over);
  const int n_chunks = static_cast<int>((len + kChunkTokens - 1) / kChunkTokens);
  const int n_groups = (n_chunks + kFoldChunks - 1) / kFoldChunks;
  const int64_t base = (int64_t{b} * H + h) * p.max_chunks;
  const int qh = h * p.group + hg;
  // The lean kernel's kGroup instance folded each group itself (its partial in the group's first chunk slot).
  const bool gf = p.lean_group_fold != 0;
  // q formats: the output rotation's rows (j W + w, W = kWarps), the first kRB of each warp's kR rows loaded now.
  constexpr int kR = D / kWarps, kRB = kR <= 16 ? kR : 8;  // S >= 4: every row of the warp loaded before the wait
  static_assert(kR * kWarps == D, "every row of G is one warp's");
  float gv[kRB][D / 32];
  __shared__ float o_s[D], q_s[D], g_s[D], ssc_s[kSinkTokens];
  float step_c[kCh], mean_c[kCh], vs[kCh][kSinkTokens];
  int n_sink = 0;
  block::QParams vq{};
  if constexpr (B2 != 0) {
    vq = p.fp.qv.head(h, D);
    int64_t sink_row;
    bool bad_sink;
    n_sink = sink_count(p, b, len, sink_row, bad_sink);
    if (bad_sink && h == 0 && hg == 0 && tid == 0 && p.status) atomicOr(p.status, 4);
    const int64_t sink_base = sink_row * p.sink_tokens;
#pragma unroll
    for (int j = 0; j < kRB; ++j)
#pragma unroll
      for (int k = 0; k < D / 32; ++k) gv[j][k] = __ldg(vq.inv + (j * kWarps + w) * D + ln + 32 * k);
#pragma unroll
    for (int e = 0; e < kCh; ++e) {
      const int ch = tid + e * kThreads;
      if (ch >= D) break;
      step_c[e] = __ldg(vq.step + ch);
      mean_c[e] = __ldg(vq.mean + ch);
      q_s[ch] = bf16_to_f32(p.q[(int64_t{b} * p.num_qo_heads + qh) * D + ch]) * p.qk_scale_log2;
#pragma unroll
      for (int j = 0; j < kSinkTokens; ++j)
        vs[e][j] = j < n_sink ? bf16_to_f32(p.v_sinks[((sink_base + j) * H + h) * D + ch]) : 0.f;
    }
    __syncthreads();
    if (tid < kSinkTokens) {  // sink scores, in order over d
      float a = -INFINITY;
      if (tid < n_sink) {
        const uint16_t* ks = p.k_sinks + ((sink_base + tid) * H + h) * D;
        a = 0.f;
        for (int d = 0; d < D; ++d) a = fmaf(q_s[d], bf16_to_f32(ks[d]), a);
      }
      ssc_s[tid] = a;
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // launched with PDL: the lean grid's partials from here on
#endif
  KVPACK_STAMP(stamps[1]);
  const uint32_t acc_sa = static_cast<uint32_t>(__cvta_generic_to_shared(acc_s));
  float M = -INFINITY, L = 0.f, O[kCh];  // channels tid + e kThreads (M, L: the same for every channel)
#pragma unroll
  for (int e = 0; e < kCh; ++e) O[e] = 0.f;
  for (int g0 = 0; g0 < n_groups; g0 += S) {
    // Stage the round's partials: 16-byte pieces of each chunk's D floats (cp.async), and the chunks' (m, l).
    constexpr int kPieces = D / 4;
#pragma unroll
    for (int i = tid; i < S * kFoldChunks * kPieces; i += kThreads) {
      const int sc = i / kPieces, pc = i % kPieces;
      const int c = (g0 + sc / kFoldChunks) * kFoldChunks + sc % kFoldChunks;
      if (c < n_chunks && (!gf || sc % kFoldChunks == 0))
        lean_cp16_full(acc_sa + (sc * D + 4 * pc) * 4, p.ws_acc + ((base + c) * p.group + hg) * D + 4 * pc);
    }
    asm volatile("cp.async.commit_group;\n" ::);
    if (tid < S * kFoldChunks) {
      const int c = (g0 + tid / kFoldChunks) * kFoldChunks + tid % kFoldChunks;
      ml_s[tid] = c < n_chunks && (!gf || tid % kFoldChunks == 0) ? __ldcg(p.ws_ml + (base + c) * p.group + hg)
                                                                  : make_float2(-INFINITY, 0.f);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    // Each chunk's two weights (sa, sc) of the group's left fold, once per (slice, chunk) instead of once per channel:
    // chunk j's running max is the max of chunks 0..j in order, exactly the fold's.
    if (!gf && tid < S * kFoldChunks) {
      const int s0 = tid - tid % kFoldChunks, j = tid % kFoldChunks;
      float m = -INFINITY;
      for (int i = 0; i < j; ++i) m = fmaxf(m, ml_s[s0 + i].x);
      float sa, sc;
      lean_fold_weights(m, ml_s[tid].x, sa, sc);
      w_s[tid] = make_float2(sa, sc);
    }
    __syncthreads();
    // This slice's group: chunks in order, C channels (r + 64 k) per thread; (m, l) by the slice's thread 0.
    const int grp = g0 + slice;
    const int cnt = grp < n_groups ? min(kFoldChunks, n_chunks - grp * kFoldChunks) : 0;
    float o[C];
#pragma unroll
    for (int k = 0; k < C; ++k) o[k] = gf && cnt > 0 ? acc_s[slice * kFoldChunks * D + r + kMergeSliceThreads * k] : 0.f;
#pragma unroll
    for (int j = 0; j < kFoldChunks; ++j)
      if (!gf && j < cnt) {
        const float2 wj = w_s[slice * kFoldChunks + j];
#pragma unroll
        for (int k = 0; k < C; ++k)
          o[k] = fmaf(o[k], wj.x, __fmul_rn(acc_s[(slice * kFoldChunks + j) * D + r + kMergeSliceThreads * k], wj.y));
      }
#pragma unroll
    for (int k = 0; k < C; ++k) fo_s[slice][r + kMergeSliceThreads * k] = o[k];
    if (r == 0 && gf) fml_s[slice] = ml_s[slice * kFoldChunks];  // (-inf, 0) past the sequence's groups
    if (r == 0 && !gf) {
      float m = -INFINITY, l = 0.f;
      for (int j = 0; j < cnt; ++j) {
        const float2 mlj = ml_s[slice * kFoldChunks + j], wj = w_s[slice * kFoldChunks + j];
        m = fmaxf(m, mlj.x);
        l = fmaf(l, wj.x, __fmul_rn(mlj.y, wj.y));
      }
      fml_s[slice] = make_float2(m, l);
    }
    __syncthreads();
    if (tid < D) {
      for (int s2 = 0; s2 < S && g0 + s2 < n_groups; ++s2) {
        const float2 ml2 = fml_s[s2];
        float sa = 0.f, sc = 0.f;
        if (n_chunks <= kFoldChunks) M = ml2.x, L = ml2.y;
        else lean_merge_step(M, L, ml2.x, ml2.y, sa, sc);
#pragma unroll
        for (int e = 0; e < kCh; ++e) {
          const int ch = tid + e * kThreads;
          if (ch >= D) break;
          const float ob = fo_s[s2][ch];
          O[e] = n_chunks <= kFoldChunks ? ob : fmaf(O[e], sa, __fmul_rn(ob, sc));
        }
      }
    }
    __syncthreads();  // the next round's staging overwrites acc_s, ml_s and fo_s
  }
  KVPACK_STAMP(stamps[2]);
  if constexpr (B2 == 0) {
    const float os = p.fp.v_scale ? p.fp.v_scale[h] : 1.f;
#pragma unroll
    for (int e = 0; e < kCh; ++e) {
      const int ch = tid + e * kThreads;
      if (ch >= D) break;
      p.out[(int64_t{b} * p.num_qo_heads + qh) * D + ch] =
          f32_to_bf16(n_chunks > 0 ? __fmul_rn(__fdiv_rn(O[e], L), os) : 0.f);
    }
    if (p.lse && tid == 0)
      p.lse[int64_t{b} * p.num_qo_heads + qh] = n_chunks > 0 ? (M + log2f(L)) * 0.69314718055994530942f : -INFINITY;
    KVPACK_STAMP(stamps[3]);
    KVPACK_STAMP(stamps[4]);
    if (tid == 0) KVPACK_STAMP_RECORD(kMerge, 0, p.table.pages, stamps, 5);
  } else {
#pragma unroll
    for (int e = 0; e < kCh; ++e)
      if (tid + e * kThreads < D) o_s[tid + e * kThreads] = __fmul_rn(O[e], step_c[e]);
    __syncthreads();
    // Row rr of G: mu_rr L + sum_c G[rr][c] o_s[c]. Warp w takes rows j W + w (W = kWarps warps), kRB rows' loads in
    // flight at a time (the first batch loaded before the wait); a warp's lanes read a row coalesced (c = ln + 32 k),
    // sum over k in order, then a fixed xor tree (which warp computes a row does not change its bits).
#pragma unroll 1
    for (int j0 = 0; j0 < kR; j0 += kRB) {
      if (j0 > 0) {
#pragma unroll
        for (int j = 0; j < kRB; ++j)
#pragma unroll
          for (int k = 0; k < D / 32; ++k) gv[j][k] = __ldg(vq.inv + ((j0 + j) * kWarps + w) * D + ln + 32 * k);
      }
#pragma unroll
      for (int j = 0; j < kRB; ++j) {
        const int rr = (j0 + j) * kWarps + w;
        float a = 0.f;
#pragma unroll
        for (int k = 0; k < D / 32; ++k) a = fmaf(gv[j][k], o_s[ln + 32 * k], a);
#pragma unroll
        for (int x = 16; x >= 1; x /= 2) a += __shfl_xor_sync(0xffffffffu, a, x);
        if (ln == 0) g_s[rr] = a;
      }
    }
    __syncthreads();
    KVPACK_STAMP(stamps[3]);
    float mt = M;
    for (int j = 0; j < n_sink; ++j) mt = fmaxf(mt, ssc_s[j]);
    const float mr = mt == -INFINITY ? 0.f : mt;
    const float f = exp2f(M - mr);
    float lt = __fmul_rn(L, f);
#pragma unroll
    for (int j = 0; j < kSinkTokens; ++j)
      if (j < n_sink) lt = __fadd_rn(lt, exp2f(ssc_s[j] - mr));
#pragma unroll
    for (int e = 0; e < kCh; ++e) {
      const int ch = tid + e * kThreads;
      if (ch >= D) break;
      float ut = __fmul_rn(fmaf(mean_c[e], L, g_s[ch]), f);
#pragma unroll
      for (int j = 0; j < kSinkTokens; ++j)
        if (j < n_sink) ut = fmaf(exp2f(ssc_s[j] - mr), vs[e][j], ut);
      p.out[(int64_t{b} * p.num_qo_heads + qh) * D + ch] = f32_to_bf16(n_chunks > 0 ? ut / lt : 0.f);
    }
    if (p.lse && tid == 0)
      p.lse[int64_t{b} * p.num_qo_heads + qh] = n_chunks > 0 ? (mt + log2f(lt)) * 0.69314718055994530942f : -INFINITY;
    KVPACK_STAMP(stamps[4]);
    if (tid == 0) KVPACK_STAMP_RECORD(kMerge, 0, p.table.pages, stamps, 5);
  }
}

// Warps per (sequence, kv head) for a plan. q formats: the plan's num_splits (plan.cu's lean wave model or a "lean"
// tuning entry), rounded up to a multiple of kLeanWarps (a CTA's 4 warps share one (sequence, kv head)); fp8 (opt-in,
// planned for the regular kernel, whose CTAs had 8 warps): 8 x num_splits. At most one per chunk (q: rounded up).
template <int B2>
inline int lean_splits(const DecodeKernelParams& kp) {
  if constexpr (B2 != 0)
    return (std::min(kp.num_splits, kp.max_chunks) + kLeanWarps - 1) / kLeanWarps * kLeanWarps;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(int64_t{kp.num_splits} * 8, kp.max_chunks)));
}

// fp8 on the lean kernel (sm_90, head_dim 128): for the shapes of fp8_lean_default (one kv head; host code,
// split_model.cpp), else the regular kernel (the lean one was 0.86-0.96x of it at 32q/8kv batch >= 8, bench/NOTES.md
// v34, v41, v49). KVPACK_LEAN_FP8=0 / 1 forces either (measurement).
inline bool lean_fp8_applies(int head_dim, int num_qo_heads, int num_kv_heads) {
  static const int env = env_int("KVPACK_LEAN_FP8", -1);
  if (head_dim != 128 || device_cc_major() < 9) return false;
  return env >= 0 ? env != 0 : fp8_lean_default(num_qo_heads, num_kv_heads, head_dim);
}

// Programmatic dependent launch (sm_90+): the lean kernel starts its copies while the query preparation runs, and the
// merge kernel's launch overlaps the lean kernel's tail; both wait (griddepcontrol.wait) before reading what the
// previous kernel wrote. KVPACK_PDL=0 turns it off (measurement).
inline bool lean_pdl_applies() {
  static const bool on = env_int("KVPACK_PDL", 1) != 0;
  return on && device_cc_major() >= 9;
}
template <class... KArgs, class... Args>
inline void lean_launch(void (*kernel)(KArgs...), dim3 grid, unsigned threads, size_t smem, cudaStream_t stream,
                        bool pdl, const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  KVPACK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// q4, q3.5 and q3 always take the lean kernel (their lane layout has no other reader): every head dim, sm_80 and later.
inline bool lean_q_applies() { return device_cc_major() >= 8; }

// A lean kernel instance's opt-in, once per instance; its resident CTAs per SM (0 when it cannot run here). The
// leaf-only and warp-only instances (q formats) have 4 where they fit, the general one 3 (LeanGeo).
template <int D, int B2, LeanInst I = LeanInst::kGeneral>
inline int lean_prepare() {
  static const int ctas = kernel_opt_in(lean_kernel<D, B2, I>, kLeanWarps * 32, LeanGeo<D, B2, I>::kSmem);
  return ctas;
}

// The query preparation's dynamic shared memory (G, D x D floats), opted in once.
template <int D, int B2, int P>
inline size_t lean_q_prep_smem() {
  static const size_t bytes = [] {
    const size_t n = size_t(D) * D * sizeof(float);
    kernel_opt_in(lean_q_prep_kernel<D, B2, P>, kLeanWarps * 32, n);
    return n;
  }();
  return bytes;
}

// The merge kernel of S slices: its opt-in (once), then its resident CTAs per SM (at least 1).
template <int D, int B2, int S>
inline int lean_merge_prepare() {
  static const int ctas =
      std::max(kernel_opt_in(lean_merge_kernel<D, B2, S>, S * kMergeSliceThreads, lean_merge_smem<D>(S)), 1);
  return ctas;
}
template <int D, int B2>
inline void launch_lean_merge(int slices, dim3 grid, cudaStream_t stream, bool pdl, const DecodeKernelParams& kp) {
  auto go = [&]<int S>() {
    lean_merge_prepare<D, B2, S>();
    lean_launch(lean_merge_kernel<D, B2, S>, grid, S * kMergeSliceThreads, lean_merge_smem<D>(S), stream, pdl, kp);
  };
  switch (slices) {
    case 1: go.template operator()<1>(); break;
    case 2: go.template operator()<2>(); break;
    case 4: go.template operator()<4>(); break;
    case 8: go.template operator()<8>(); break;
    default: go.template operator()<16>(); break;
  }
}

template <int D, int B2>
inline void launch_lean(const DecodeKernelParams& kp, int batch, cudaStream_t stream) {
  lean_prepare<D, B2>();
  // Leaf mode: the plan's (DecodePlan::leaf: a tuned entry's, or the caller's), else the rule lean_default_leaf (host
  // code, split_model.cpp): leaf mode when one warp per chunk would not fill the GPU's warp slots once
  // (KVPACK_LEAN_RULE=0: v42's rule, fewer chunk-warps than two waves of 8 warps per SM). KVPACK_LEAN_LEAF=0 / 1
  // overrides all (measurement). The choice depends on the plan only, and both modes give the same bits.
  static const int leaf_env = env_int("KVPACK_LEAN_LEAF", -1);
  const int64_t chunk_warps = int64_t{batch} * kp.num_kv_heads * kp.max_chunks;
  const bool rule_leaf = lean_env_rule() == 0
                             ? chunk_warps < int64_t{2} * device_sm_count() * 8
                             : lean_default_leaf(int64_t{batch} * kp.num_kv_heads, kp.max_chunks,
                                                 int64_t{device_sm_count()} * lean_prepare<D, B2>() * kLeanWarps);
  const bool leaf = leaf_env >= 0 ? leaf_env != 0 : kp.leaf >= 0 ? kp.leaf != 0 : rule_leaf;
  // q formats: a CTA's 4 warps share one (sequence, kv head): splits a multiple of 4.
  const int splits = leaf ? 0 : lean_splits<B2>(kp);
  const int64_t warps = int64_t{kp.num_kv_heads} * splits;
  dim3 grid(leaf ? static_cast<unsigned>(int64_t{kp.num_kv_heads} * kp.max_chunks)
                 : static_cast<unsigned>((warps + kLeanWarps - 1) / kLeanWarps),
            batch);
  // The mixed grid (v48, lean_mixed_chunks, host code in split_model.cpp): chunks [0, mix) of every (sequence, kv
  // head) in warp mode, the rest in leaf mode, where the default plan (one warp per chunk, no tuned or forced mode)
  // fills the GPU 1.x times. KVPACK_LEAN_MIX=0 turns it off, = k > 0 forces mix = k rounded down to a multiple of 4
  // (measurement; also lean_force_mix, tests). Same bits either way.
  static const int mix_env = env_int("KVPACK_LEAN_MIX", -1);
  const int mix_forced = g_force_mix.load(std::memory_order_relaxed);
  int mix = 0;
  if constexpr (B2 != 0) {
    const int force = mix_forced ? mix_forced : mix_env;
    if (force > 0)
      mix = std::min(force / kLeanWarps * kLeanWarps, (kp.max_chunks + kLeanWarps - 1) / kLeanWarps * kLeanWarps);
    else if (force < 0 && lean_env_rule() != 0 && leaf_env < 0 && kp.leaf < 0 && splits >= kp.max_chunks)
      mix = lean_mixed_chunks(int64_t{batch} * kp.num_kv_heads, kp.max_chunks,
                              int64_t{device_sm_count()} * lean_prepare<D, B2>() * kLeanWarps);
    if (force > 0 && mix == 0) mix = kLeanWarps;
  }
  // The warp-only instance (v52; same bits as the general one), the default where it measured faster:
  // - q3 at head_dim 128 (1.03-1.08x at 32q/8kv batch 8-64, up to 1.08x at 8q/1kv; H200, v54: 1.07-1.10x; q4
  //   0.96-1.00x on its 2-stage ring, q3.5 0.98-1.02x), and there without the mixed grid, whose rule counts the
  //   general instance's 3 CTAs per SM (pure warp mode on 4 CTAs per SM measured 1.04-1.08x over it in those cells);
  // - every q format at head_dim 64, where the mixed rule does not mix (v54, H200, 9q/3kv/64, batch 8-64 x 32k-128k
  //   and 64 x 8k: 1.05-1.12x; same bits: DecodeGpu.LeanInstancesAtHeadDim64GiveTheSameBits).
  // KVPACK_LEAN_WARP_ONLY=0 keeps the general instance, = 1 takes the warp-only one for every q format where the mixed
  // rule does not mix (v52's "new"; with KVPACK_LEAN_MIX=0 also there: v52's "nomix") (measurement).
  // lean_force_warp_only_instance (tests) takes it wherever it has more CTAs per SM, the mixed rule unchanged.
  static const int warp_only_env = env_int("KVPACK_LEAN_WARP_ONLY", -1);
  const bool wo_forced = g_force_warp_only.load(std::memory_order_relaxed);
  bool warp_only = false;
  if constexpr (B2 != 0)
    warp_only = !leaf && (warp_only_env >= 0 ? warp_only_env != 0 : wo_forced || D == 64 || B2 == 6) &&
                !g_force_general.load(std::memory_order_relaxed) &&
                lean_prepare<D, B2, LeanInst::kWarpOnly>() > lean_prepare<D, B2>();
  if (warp_only && warp_only_env < 0 && !wo_forced && D == 128 && mix_forced <= 0 && mix_env < 0) mix = 0;
  if (mix > 0)
    grid = dim3(static_cast<unsigned>(int64_t{batch} * kp.num_kv_heads *
                                      (mix / kLeanWarps + std::max(0, kp.max_chunks - mix))),
                1);
  // The copy layout (fp8): bit 0 K by rows, bit 1 V by rows (KVPACK_LEAN_KROWS, KVPACK_LEAN_VROWS; measurement).
  static const int rows = (env_int("KVPACK_LEAN_KROWS", 0) != 0 ? 1 : 0) |
                          (env_int("KVPACK_LEAN_VROWS", KVPACK_LEAN_VROWS) != 0 ? 2 : 0);
  // KVPACK_LEAN_ONLY (measurement only: the output is then wrong): a mask of the kernels launched, 1 = the query
  // preparation, 2 = the lean kernel, 4 = the merge, to time each alone (bench/NOTES.md v44).
  static const int only = env_int("KVPACK_LEAN_ONLY", 7);
  const bool pdl = lean_pdl_applies();
  // The preparation's CTAs per (sequence, kv head): 4 (2 query heads each) while that grid is at most two CTAs per
  // SM, else 1 (8 heads each; at large batch its G reads would grow 4x for a phase the launch barely sees).
  // KVPACK_LEAN_PREP_SPLIT=1 / 4 forces it (measurement). Same bits either way.
  static const int prep_env = env_int("KVPACK_LEAN_PREP_SPLIT", 0);
  const bool four = B2 != 0 && (prep_env ? prep_env == 4
                                          : int64_t{batch} * kp.num_kv_heads * 4 <= int64_t{2} * device_sm_count());
  if constexpr (B2 != 0)
    if (only & 1) {
      // decode_step (kp.prep_after_write): with PDL behind the write, which it waits for before it exits.
      const bool prep_pdl = pdl && kp.prep_after_write;
      if (four)
        lean_launch(lean_q_prep_kernel<D, B2, 4>, dim3(kp.num_kv_heads * 4, batch), kLeanWarps * 32,
                    lean_q_prep_smem<D, B2, 4>(), stream, prep_pdl, kp);
      else
        lean_launch(lean_q_prep_kernel<D, B2, 1>, dim3(kp.num_kv_heads, batch), kLeanWarps * 32,
                    lean_q_prep_smem<D, B2, 1>(), stream, prep_pdl, kp);
    }
  // Leaf mode's grid without the mixed part (q formats) runs on the leaf-only instance, warp mode's on the warp-only
  // one where chosen above: same arithmetic, same bits, fewer registers, more CTAs per SM. KVPACK_LEAN_LEAF_ONLY=0
  // keeps the general instance for leaf mode (measurement).
  static const int leaf_only_env = env_int("KVPACK_LEAN_LEAF_ONLY", 1);
  LeanInst inst = LeanInst::kGeneral;
  if constexpr (B2 != 0)
    if (mix == 0 && !g_force_general.load(std::memory_order_relaxed)) {
      if (leaf && leaf_only_env != 0 && lean_prepare<D, B2, LeanInst::kLeafOnly>() > 0) inst = LeanInst::kLeafOnly;
      if (warp_only) inst = LeanInst::kWarpOnly;
    }
  // kGroup (v74; q formats at head_dim 128): warp mode without the mixed grid, each warp folding whole fold groups
  // (groups split, split + splits, ...: splits = the plan's warps per (sequence, kv head), at most the groups of the
  // longest sequence, a multiple of 4), one partial per group. KVPACK_LEAN_GROUP_FOLD=1 / 0 forces it on / off
  // (measurement), lean_force_group_fold (tests). Default: the rule lean_default_group_fold (host code,
  // split_model.cpp: from 2.5 waves of one-group warps) for q4 and q3.5, off where the plan or the environment forces
  // leaf mode or a mixed grid. q3 keeps its warp-only instance (4 CTAs per SM): group folding measured 0.97-0.98x
  // for it on the H200 (1.05x on the H100; bench/NOTES.md v75). Same bits either way.
  static const int gf_env = env_int("KVPACK_LEAN_GROUP_FOLD", -1);
  const int gf_forced = g_force_group_fold.load(std::memory_order_relaxed);
  bool group_fold = false;
  int lean_splits_run = splits;
  DecodeKernelParams kq = kp;
  if constexpr (B2 != 0 && D == 128)
    if (!leaf && mix == 0 && !g_force_general.load(std::memory_order_relaxed) &&
        (gf_forced     ? gf_forced > 0
         : gf_env >= 0 ? gf_env > 0
                       : B2 != 6 && lean_default_group_fold(int64_t{batch} * kp.num_kv_heads, std::max(kp.max_chunks, 1),
                                                 int64_t{device_sm_count()} *
                                                     lean_prepare<D, B2, LeanInst::kGroup>() * kLeanWarps))) {
      group_fold = true;
      inst = LeanInst::kGroup;
      lean_splits_run = (std::min(splits, std::max(kp.max_groups, 1)) + kLeanWarps - 1) / kLeanWarps * kLeanWarps;
      grid = dim3(static_cast<unsigned>(int64_t{kp.num_kv_heads} * lean_splits_run / kLeanWarps), batch);
      kq.lean_group_fold = 1;
    }
  int occ = 0;  // the instance's CTAs per SM (lean_last_launch)
  auto go = [&]<LeanInst J>() {
    occ = lean_prepare<D, B2, J>();
    if (only & 2)
      lean_launch(lean_kernel<D, B2, J>, grid, kLeanWarps * 32, LeanGeo<D, B2, J>::kSmem, stream, pdl && B2 != 0, kq,
                  lean_splits_run, rows, mix);
  };
  if constexpr (B2 != 0) {
    if (inst == LeanInst::kLeafOnly) go.template operator()<LeanInst::kLeafOnly>();
    if (inst == LeanInst::kWarpOnly) go.template operator()<LeanInst::kWarpOnly>();
    if constexpr (D == 128)
      if (inst == LeanInst::kGroup) go.template operator()<LeanInst::kGroup>();
  }
  if (inst == LeanInst::kGeneral) go.template operator()<LeanInst::kGeneral>();
  // Merge slices: as many fold groups per round as the sequence has (up to 16: one round at 128k) while the merge grid
  // still fits one wave at that CTA size's occupancy (v40: a second wave of large merge CTAs cost more than the
  // rounds it saved). Every S gives the same bits. KVPACK_LEAN_MERGE_SLICES=1 / 2 / 4 / 8 / 16 forces S
  // (measurement). The rule: lean_merge_slices (host code, split_model.cpp, CPU-tested).
  static const int slices_env = env_int("KVPACK_LEAN_MERGE_SLICES", 0);
  static const int merge_occ[kMergeSliceCounts] = {lean_merge_prepare<D, B2, 1>(), lean_merge_prepare<D, B2, 2>(),
                                                   lean_merge_prepare<D, B2, 4>(), lean_merge_prepare<D, B2, 8>(),
                                                   lean_merge_prepare<D, B2, 16>()};
  const int forced = g_force_merge_slices.load(std::memory_order_relaxed);
  const int slices = lean_merge_slices(int64_t{kp.num_kv_heads} * batch * kp.group, kp.max_groups, device_sm_count(),
                                       merge_occ, forced ? forced : slices_env);
  if (only & 4) launch_lean_merge<D, B2>(slices, dim3(kp.num_kv_heads, batch, kp.group), stream, pdl, kq);
  g_last_lean = LeanLaunchInfo{leaf ? 1 : 0, lean_splits_run, mix, B2 == 0 ? 0 : four ? 4 : 1, slices, occ,
                               static_cast<int>(inst), g_last_lean.launches + 1};
}

}  // namespace kvpack::cuda_detail
