// The decode dispatch entry for q3: launch_decode_format hands it to the lean kernel (decode_lean.cu); the
// regular kernel has no q path.
#include "decode_kernel.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<QPolicy<6>>(const DecodeKernelParams&, int, int, cudaStream_t);
template int ctas_per_sm_format<QPolicy<6>>(int, int, int);
}  // namespace kvpack::cuda_detail
