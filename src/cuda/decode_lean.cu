// The lean decode kernel's instances (decode_lean.cuh): fp8 at head_dim 128 on sm_90, q4 everywhere.
#include "decode_kernel.cuh"
#include "decode_lean.cuh"

namespace kvpack::cuda_detail {
bool launch_lean_decode(Format f, const DecodeKernelParams& kp, int head_dim, int batch, cudaStream_t st) {
  if (f == Format::q4) {
    // q4's lane layout has no other reader (the regular kernel reads token-major codes).
    KVPACK_CU_CHECK(lean_q4_applies(), "decode: format 'q4' needs a GPU of compute capability 8.0 or later");
    if (head_dim == 64) launch_lean<64, true>(kp, batch, st);
    else launch_lean<128, true>(kp, batch, st);
    return true;
  }
  if (f != Format::fp8 || !lean_fp8_applies(head_dim)) return false;
  launch_lean<128, false>(kp, batch, st);
  return true;
}
}  // namespace kvpack::cuda_detail
