// Internals shared by the decode kernels, plan() and the tuner (not public API).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>

#include "kvpack/decode.h"

namespace kvpack {
// The kernels' measurement switches: environment variable `name` as an integer, `fallback` when unset.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}
// A kernel's dynamic shared-memory opt-in to `smem` bytes, then its resident CTAs per SM at `threads` threads (0 when
// either call fails: it cannot run here). Callers cache it once per instance (the lean path's kernels, the q write's
// small kernel).
template <class Kernel>
inline int kernel_opt_in(Kernel kernel, int threads, size_t smem) {
  int n = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess)
    n = 0;
  cudaGetLastError();
  return n;
}
size_t decode_stage_bytes(Format f, int head_dim);
size_t decode_smem_bytes(Format f, int head_dim, int group, int stages);
size_t decode_workspace_bytes(const DecodeShape& s, int batch, int max_chunks);
int device_sm_count();        // cached after the first call
int decode_ctas_per_sm(Format f, int head_dim, int group, int stages);  // occupancy of the decode kernel
size_t device_smem_optin();   // cached after the first call
int device_cc_major();        // compute capability major, 0 without a device (cached)
inline constexpr int kLeanWarps = kLeanCtaWarps;  // warps per CTA of the lean kernel (q4 / q3.5 / q3; fp8 opt-in)
int lean_ctas_per_sm(Format f, int head_dim);  // occupancy of the lean kernel (q4 / q3.5 / q3), cached; 3 without a device
// KVPACK_LEAN_RULE (measurement): 1 (default) the lean kernel's default plans by lean_default_leaf / _splits, 0 the
// rules before v43 (leaf mode below 2 x SMs x 8 chunk-warps, the wave model's split count). Cached.
int lean_env_rule();
// Tests: force the lean merge kernel's slice count (1, 2, 4, 8, 16; 0 = lean_merge_slices' rule) for later launches.
void lean_force_merge_slices(int slices);
// Tests: force the lean kernel's mixed grid (lean_mixed_chunks) with `mix` warp-mode chunks per (sequence, kv head)
// (rounded down to a multiple of 4, at least 4; 0 = the launcher's rule) for later q-format launches.
void lean_force_mix(int mix);
// Tests: run leaf-mode and warp-mode grids on the general lean kernel instance (true) instead of the leaf-only and
// warp-only ones (false: the launcher's rule) for later q-format launches.
void lean_force_general_instance(bool on);
// Tests: run warp-mode grids (without the mixed part) on the warp-only instance wherever it has more CTAs per SM than
// the general one (true), not only where the launcher's rule takes it (false), for later q-format launches.
void lean_force_warp_only_instance(bool on);
// Tests: the lean kernel's group-folding instance (LeanInst::kGroup, q formats at head_dim 128) for later warp-mode
// launches without the mixed grid: 1 on, -1 off, 0 the launcher's rule (KVPACK_LEAN_GROUP_FOLD).
void lean_force_group_fold(int mode);
// What the lean launcher chose at this thread's last lean-path launch (q4 / q3.5 / q3; fp8 at one kv head), for kvpack bench's
// rows: leaf mode (1) or warp mode (0); warps per (sequence, kv head) in warp mode; the mixed grid's warp-mode chunks
// per (sequence, kv head) (0 = not mixed); the query preparation's CTAs per (sequence, kv head) (0 = none: fp8); the
// merge's slices; the lean kernel instance's resident CTAs per SM (the leaf-only and warp-only instances: 4 where
// they fit) and which instance ran (0 general, 1 leaf-only, 2 warp-only, 3 group-folding: LeanInst); `launches` counts this thread's
// lean launches. All zero before any lean launch.
struct LeanLaunchInfo {
  int leaf = 0, splits = 0, mix = 0, prep_ctas = 0, merge_slices = 0, ctas_per_sm = 0, instance = 0;
  unsigned long long launches = 0;
};
LeanLaunchInfo lean_last_launch();
// Measurement builds (KVPACK_LEAN_STAMPS, src/cuda/lean_stamps.cuh): clear the lean path's phase stamps / append them
// to `path` under `label`. Both return false when the stamps are not compiled in.
bool lean_stamps_reset();
bool lean_stamps_dump(const char* path, const char* label);
// Both stamp dumps' writer: the first min(*count_symbol, cap) records of `words` 64-bit words from the device symbol
// records_symbol, one line each appended to `path` (label, then the words).
void append_stamp_records(const char* path, const char* label, const void* count_symbol, const void* records_symbol,
                          unsigned cap, int words);
// The q write path's small kernel (the launches write_kv.cu's q_write_kind gives it): tokens per CTA, 2, 4 or 8,
// or 0 (the default since v62): per launch, the smallest tile whose grid fits one wave (write_kv.cu, small_tile). The
// environment's KVPACK_WRITE_SMALL_TOK at the first call overrides it, for measurements; tests set it to cover every
// tile.
int& write_small_tokens();
// The largest launch (tokens) the small kernel takes, or 0 (the default since v62): per launch, while the small
// kernel's grid fits 1.5 waves (write_kv.cu, q_write_kind; bench/NOTES.md v62: a 64-token launch 35-45 us -> 7-14
// us on an H100). Larger launches take write_kv_q_kernel's rows or tiles. The environment's KVPACK_WRITE_SMALL_MAX at
// the first call overrides it, for measurements; tests set it to run every launch size through one kernel.
int& write_small_max();
// Measurement builds (KVPACK_WRITE_STAMPS, write_kv.cu): clear the small q write kernel's per-CTA phase clocks / append
// them to `path` under `label`. Both return false when the stamps are not compiled in.
bool write_stamps_reset();
bool write_stamps_dump(const char* path, const char* label);
// Which write kernel a launch of `num_tokens` tokens of format `f` over `num_kv_heads` heads of `head_dim` takes
// ("q-small", "q-rows", "q-tiles" for the q formats, "plain" for the others): benchmark rows record it.
const char* write_kernel_name(Format f, int num_kv_heads, int head_dim, int num_tokens);
// Whether decode_step runs the query preparation beside the write (q formats, sm_90, programmatic dependent launch
// on: KVPACK_PDL, KVPACK_STEP_PDL): what decode_step does, and what benchmark step rows record.
bool decode_step_overlaps(Format f);
// The lean path's programmatic dependent launch (sm_90 and KVPACK_PDL != 0).
bool lean_pdl_on();
}  // namespace kvpack
