// Decode attention kernels for q3 (one translation unit per format: parallel device builds).
#include "decode_kernel.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<QPolicy<6>>(const DecodeKernelParams&, int, int, cudaStream_t);
template int ctas_per_sm_format<QPolicy<6>>(int, int, int);
}  // namespace kvpack::cuda_detail
