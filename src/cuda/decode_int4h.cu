// Decode attention kernels for int4h (one translation unit per format: parallel device builds).
#include "decode_kernel.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<Int4Policy<true>>(const DecodeKernelParams&, int, int, cudaStream_t);
}  // namespace kvpack::cuda_detail
