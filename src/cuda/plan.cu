// plan(): host-side choice of (num_splits, stages) per (format, shape, batch, context bucket), from a tuning table
// measured by `kvpack tune` when one matches this GPU and library version, else from a fallback that is always
// valid. The tuning table's JSON form is host code: src/common/tuning_table.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>

#include "decode_internal.cuh"
#include "format_policy.cuh"
#include "kvpack/cuda_runtime_info.h"
#include "kvpack/decode.h"
#include "kvpack/error.h"

namespace kvpack {

std::string library_version() { return KVPACK_VERSION; }

namespace {
struct DeviceInfo {
  int sms = 132;
  size_t smem_optin = 227 * 1024;
  int cc_major = 0;  // compute capability major (0: no device)
  std::string name;
};
const DeviceInfo& device_info() {
  static DeviceInfo info;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
      info.sms = prop.multiProcessorCount;
      info.smem_optin = prop.sharedMemPerBlockOptin;
      info.cc_major = prop.major;
      info.name = prop.name;
    } else {
      cudaGetLastError();  // no device: plan with H200-like defaults so host-only code paths still work
    }
  });
  return info;
}
}  // namespace

int device_sm_count() { return device_info().sms; }
size_t device_smem_optin() { return device_info().smem_optin; }
int device_cc_major() { return device_info().cc_major; }

namespace {
void check_shape(const DecodeShape& s, int batch, int64_t max_context) {
  KVPACK_CU_CHECK(s.num_kv_heads >= 1, "plan_decode: num_kv_heads {} must be >= 1", s.num_kv_heads);
  KVPACK_CU_CHECK(s.num_qo_heads >= s.num_kv_heads && s.num_qo_heads % s.num_kv_heads == 0,
               "plan_decode: num_qo_heads {} is not a multiple of num_kv_heads {}", s.num_qo_heads, s.num_kv_heads);
  const int group = s.num_qo_heads / s.num_kv_heads;
  KVPACK_CU_CHECK(group <= 8, "plan_decode: group size {} (= {} / {}) is above 8", group, s.num_qo_heads,
               s.num_kv_heads);
  KVPACK_CU_CHECK(batch >= 0 && batch <= 65535, "plan_decode: batch {} out of range [0, 65535]", batch);
  KVPACK_CU_CHECK(max_context >= 1 && max_context <= (int64_t{1} << 30), "plan_decode: max_context {} out of range",
               max_context);
  (void)make_paged_layout(s.format, s.page_size, s.num_kv_heads, s.head_dim);  // validates format/page/head_dim
}

int model_splits(const DecodeShape& s, int batch, int64_t max_context, int stages) {
  const int group = s.num_qo_heads / s.num_kv_heads;
  const int64_t units = std::max<int64_t>(1, int64_t{batch} * s.num_kv_heads);
  const int64_t chunks = (max_context + kChunkTokens - 1) / kChunkTokens;
  if (lane_bits_x2(s.format)) {  // the lean kernel: warps per (sequence, kv head), in CTAs of kLeanWarps
    // KVPACK_LEAN_RULE=0: v42's wave model (measurement only).
    if (lean_env_rule() == 0) {
      const int64_t warp_slots = int64_t{device_sm_count()} * lean_ctas_per_sm(s.format, s.head_dim) * kLeanWarps;
      return wave_model_splits(units, chunks, warp_slots, kLeanWarps);
    }
    return lean_default_splits(chunks);
  }
  const int64_t slots = int64_t{device_sm_count()} * decode_ctas_per_sm(s.format, s.head_dim, group, stages);
  return wave_model_splits(units, chunks, slots);
}

DecodePlan make_plan(const DecodeShape& s, int batch, int64_t max_context, int splits, int stages) {
  DecodePlan p;
  p.shape = s;
  p.batch = batch;
  p.max_context = max_context;
  p.max_chunks = static_cast<int>((max_context + kChunkTokens - 1) / kChunkTokens);
  p.num_splits = std::clamp(splits, 1, p.max_chunks);
  p.stages = stages;
  p.workspace_bytes = decode_workspace_bytes(s, batch, p.max_chunks);
  return p;
}

// The fallback configuration (shape already checked): 3 stages (48 KB of tiles in flight per CTA, two CTAs per SM
// for <= 4 heads), fewer if shared memory is short; splits from the wave model.
DecodePlan fallback_plan(const DecodeShape& s, int batch, int64_t max_context) {
  const int group = s.num_qo_heads / s.num_kv_heads;
  int stages = 3;
  while (stages > 2 && decode_smem_bytes(s.format, s.head_dim, group, stages) > device_smem_optin()) --stages;
  const int splits = model_splits(s, batch, max_context, stages);
  DecodePlan p = make_plan(s, batch, max_context, splits, stages);
  p.source = "fallback";
  return p;
}
}  // namespace

DecodePlan plan_decode_with(const DecodeShape& s, int batch, int64_t max_context, int num_splits, int stages,
                            int leaf) {
  check_shape(s, batch, max_context);
  KVPACK_CU_CHECK(leaf >= -1 && leaf <= 1, "plan_decode: leaf {} is not -1 (the launcher's rule), 0 or 1", leaf);
  KVPACK_CU_CHECK(leaf < 0 || std::string(decode_kernel_name(s.format)) == "lean",
                  "plan_decode: leaf {} given for format '{}', which runs on the regular kernel (leaf mode is the lean "
                  "kernel's: q4, q3.5, q3)", leaf, format_name(s.format));
  KVPACK_CU_CHECK(num_splits >= 1, "plan_decode: num_splits {} must be >= 1", num_splits);
  KVPACK_CU_CHECK(stages >= 2 && stages <= 8, "plan_decode: stages {} out of range [2, 8]", stages);
  const int group = s.num_qo_heads / s.num_kv_heads;
  const size_t smem = decode_smem_bytes(s.format, s.head_dim, group, stages);
  KVPACK_CU_CHECK(smem <= device_smem_optin(), "plan_decode: {} stages need {} B of shared memory, the GPU allows {}",
               stages, smem, device_smem_optin());
  DecodePlan p = make_plan(s, batch, max_context, num_splits, stages);
  p.leaf = leaf;
  p.source = "explicit";
  return p;
}

DecodePlan plan_decode(const DecodeShape& s, int batch, int64_t max_context, const TuningTable* table) {
  check_shape(s, batch, max_context);
  // The caller's table when it was measured on this GPU with this library and has an entry for the shape, else the
  // built-in one of this GPU (so a table tuned for some formats leaves the others on their built-in entries).
  const auto usable = [](const TuningTable* t) {
    return t && t->gpu == device_info().name && t->version == library_version();
  };
  const TuningTable* builtin = builtin_tuning_table(device_info().name);
  for (const TuningTable* t : {table, builtin}) {
    if (!usable(t)) continue;
    const TuneEntry* best = t->find(s, batch, max_context);
    if (!best) continue;
    const int group = s.num_qo_heads / s.num_kv_heads;
    if (decode_smem_bytes(s.format, s.head_dim, group, best->stages) > device_smem_optin()) continue;
    // The measured split count holds for its own (batch, context) bucket; elsewhere the wave model picks it (with
    // the tuned pipeline depth), so a 64k request on a table tuned at 8k is not cut into 8k-sized work.
    // The lean kernel's mode likewise (it is size-dependent too).
    const bool own_bucket = best->batch == batch && best->context == max_context;
    const int splits = own_bucket ? best->num_splits : model_splits(s, batch, max_context, best->stages);
    DecodePlan p = make_plan(s, batch, max_context, splits, best->stages);
    if (own_bucket) p.leaf = best->leaf;
    p.source = t == builtin ? "built-in table" : "table";
    return p;
  }
  return fallback_plan(s, batch, max_context);
}

DecodePlan plan_decode_fallback(const DecodeShape& s, int batch, int64_t max_context) {
  check_shape(s, batch, max_context);
  return fallback_plan(s, batch, max_context);
}

}  // namespace kvpack
