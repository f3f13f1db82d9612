// Decode attention kernels for int4 (one translation unit per format: parallel device builds).
#include "decode_kernel.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<Int4Policy<false>>(const DecodeKernelParams&, int, int, cudaStream_t);
template int ctas_per_sm_format<Int4Policy<false>>(int, int, int);
}  // namespace kvpack::cuda_detail
