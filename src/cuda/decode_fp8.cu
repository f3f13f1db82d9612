// Decode attention kernels for fp8 (one translation unit per format: parallel device builds), and the lean kernel.
#include "decode_kernel.cuh"
#include "decode_lean.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<Fp8Policy>(const DecodeKernelParams&, int, int, cudaStream_t);
template int ctas_per_sm_format<Fp8Policy>(int, int, int);

bool launch_lean_decode(Format f, const DecodeKernelParams& kp, int head_dim, int batch, cudaStream_t st) {
  if (f != Format::fp8 || !lean_fp8_applies(head_dim)) return false;
  launch_lean_fp8(kp, batch, st);
  return true;
}
}  // namespace kvpack::cuda_detail
