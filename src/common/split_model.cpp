// The wave model behind plan_decode's split count (include/kvpack/decode.h): host code, so CI tests it.
#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>

#include "kvpack/decode.h"
#include "kvpack/error.h"

namespace kvpack {

int wave_model_splits(int64_t units, int64_t chunks, int64_t slots, int step) {
  KVPACK_CHECK(units >= 1 && chunks >= 1 && slots >= 1 && step >= 1,
               "wave_model_splits: units {}, chunks {}, slots {}, step {} must be >= 1", units, chunks, slots, step);
  // Costs in half-chunk steps: 2 per chunk of a CTA plus 1 for the CTA itself.
  int64_t best = 1, best_cost = INT64_MAX;
  // Multiples of `step` up to the first one that covers every chunk (the lean kernel's CTAs are 4 warps of one
  // (sequence, kv head), so its split counts are multiples of 4; a split without a chunk only exits).
  const int64_t last = std::min<int64_t>((chunks + step - 1) / step * step, 4096);
  for (int64_t sp = step; sp <= last; sp += step) {
    const int64_t waves = (units * sp + slots - 1) / slots;
    const int64_t cost = waves * (2 * ((chunks + sp - 1) / sp) + 1);
    if (cost < best_cost) {
      best_cost = cost;
      best = sp;
    }
  }
  return static_cast<int>(best);
}

bool lean_default_leaf(int64_t units, int64_t chunks, int64_t warp_slots) {
  KVPACK_CHECK(units >= 1 && chunks >= 1 && warp_slots >= 1,
               "lean_default_leaf: units {}, chunks {}, warp_slots {} must be >= 1", units, chunks, warp_slots);
  return units * chunks < warp_slots;
}

int lean_default_splits(int64_t chunks) {
  KVPACK_CHECK(chunks >= 1 && chunks <= (int64_t{1} << 21), "lean_default_splits: chunks {} out of range", chunks);
  return static_cast<int>((chunks + kLeanCtaWarps - 1) / kLeanCtaWarps * kLeanCtaWarps);
}

int lean_mixed_chunks(int64_t units, int64_t chunks, int64_t warp_slots) {
  KVPACK_CHECK(units >= 1 && chunks >= 1 && chunks <= (int64_t{1} << 21) && warp_slots >= 1,
               "lean_mixed_chunks: units {}, chunks {} (<= 2^21), warp_slots {} must be >= 1", units, chunks, warp_slots);
  if (lean_default_leaf(units, chunks, warp_slots)) return 0;  // below one wave: leaf mode whole
  // Times in rounds of one warp-mode CTA (4 chunks, one per warp); a leaf-mode CTA (one chunk on 4 warps) costs
  // kLeafCost of one. Greedy in launch order: the warp-mode CTAs first, kb rounds; the slots its last round leaves
  // free take floor(1 / kLeafCost) leaf CTAs each meanwhile, the rest follow in rounds of kLeafCost.
  constexpr double kLeafCost = 0.3;
  constexpr int64_t kLeafPerRound = 3;
  const int64_t slots = std::max<int64_t>(1, warp_slots / kLeanCtaWarps);
  auto rounds = [](int64_t n, int64_t s) { return (n + s - 1) / s; };
  const double whole = static_cast<double>(rounds(units * lean_default_splits(chunks) / kLeanCtaWarps, slots));
  double best = whole;
  int best_cw = 0;
  for (int64_t cw = kLeanCtaWarps; cw < chunks; cw += kLeanCtaWarps) {
    const int64_t big = units * cw / kLeanCtaWarps, leaf = units * (chunks - cw);
    const int64_t kb = rounds(big, slots);
    const int64_t idle = slots - (big - (kb - 1) * slots);
    const int64_t rest = std::max<int64_t>(0, leaf - idle * kLeafPerRound);
    const double t = static_cast<double>(kb) + static_cast<double>(rounds(rest, slots)) * kLeafCost;
    if (t <= best) {  // ties: the larger warp-mode share (fewer leaf folds)
      best = t;
      best_cw = static_cast<int>(cw);
    }
  }
  return best <= 0.95 * whole ? best_cw : 0;
}

bool lean_default_group_fold(int64_t units, int64_t chunks, int64_t warp_slots) {
  KVPACK_CHECK(units >= 1 && chunks >= 1 && warp_slots >= 1,
               "lean_default_group_fold: units {}, chunks {}, warp_slots {} must be >= 1", units, chunks, warp_slots);
  const int64_t groups = (chunks + kFoldChunks - 1) / kFoldChunks;
  return 2 * units * groups >= 5 * warp_slots;  // at least 2.5 waves of one-group warps
}

const char* decode_kernel_name(Format f) { return lane_bits_x2(f) ? "lean" : "regular"; }

int lean_merge_slices(int64_t merge_ctas, int fold_groups, int sms, const int (&ctas_per_sm)[kMergeSliceCounts],
                      int forced) {
  const int most = 1 << (kMergeSliceCounts - 1);
  const bool force = forced >= 1 && forced <= most && (forced & (forced - 1)) == 0;
  int need = 1;  // one round: the smallest power of two >= fold_groups
  while (need < fold_groups && need < most) need *= 2;
  int s = force ? std::min(forced, need) : need;
  auto log2 = [](int v) { return std::countr_zero(static_cast<unsigned>(v)); };
  while (!force && s > 1 && merge_ctas > int64_t{sms} * std::max(1, ctas_per_sm[log2(s)])) s /= 2;
  return s;
}

bool fp8_lean_default(int num_qo_heads, int num_kv_heads, int head_dim) {
  return head_dim == 128 && num_kv_heads == 1 && num_qo_heads >= 1 && num_qo_heads <= 8;
}

}  // namespace kvpack
