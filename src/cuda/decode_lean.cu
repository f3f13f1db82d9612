// The lean decode kernel's instances (decode_lean.cuh): fp8 at head_dim 128 on sm_90, q4 and q3 everywhere.
#include "decode_kernel.cuh"
#include "decode_lean.cuh"

namespace kvpack::cuda_detail {
bool launch_lean_decode(Format f, const DecodeKernelParams& kp, int head_dim, int batch, cudaStream_t st) {
  if (const int qb = lane_bits(f)) {
    // q4's and q3's lane layout has no other reader (the regular kernel reads token-major codes).
    KVPACK_CU_CHECK(lean_q_applies(), "decode: format '{}' needs a GPU of compute capability 8.0 or later",
                    format_name(f));
    if (qb == 4) {
      if (head_dim == 64) launch_lean<64, 4>(kp, batch, st);
      else launch_lean<128, 4>(kp, batch, st);
    } else {
      if (head_dim == 64) launch_lean<64, 3>(kp, batch, st);
      else launch_lean<128, 3>(kp, batch, st);
    }
    return true;
  }
  if (f != Format::fp8 || !lean_fp8_applies(head_dim)) return false;
  launch_lean<128, 0>(kp, batch, st);
  return true;
}
}  // namespace kvpack::cuda_detail

namespace kvpack {
int lean_env_rule() {
  static const int rule = cuda_detail::lean_env_int("KVPACK_LEAN_RULE", 1);
  return rule;
}
int lean_ctas_per_sm(Format f, int head_dim) {
  using namespace cuda_detail;
  int n = 0;
  if (lane_bits(f) == 4) n = head_dim == 64 ? lean_prepare<64, 4>() : lean_prepare<128, 4>();
  else if (lane_bits(f) == 3) n = head_dim == 64 ? lean_prepare<64, 3>() : lean_prepare<128, 3>();
  else if (f == Format::fp8 && head_dim == 128) n = lean_prepare<128, 0>();
  return n > 0 ? n : 3;  // no device (host-only planning) or no q kernel here: the sm_90a occupancy of q4 at D = 128
}
}  // namespace kvpack
