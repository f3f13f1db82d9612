// Decode attention kernels for q4 (one translation unit per format: parallel device builds).
#include "decode_kernel.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<QPolicy<8>>(const DecodeKernelParams&, int, int, cudaStream_t);
template int ctas_per_sm_format<QPolicy<8>>(int, int, int);
}  // namespace kvpack::cuda_detail
