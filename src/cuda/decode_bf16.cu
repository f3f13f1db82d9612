// Decode attention kernels for bf16 (one translation unit per format: parallel device builds).
#include "decode_kernel.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<Bf16Policy>(const DecodeKernelParams&, int, int, cudaStream_t);
template int ctas_per_sm_format<Bf16Policy>(int, int, int);
}  // namespace kvpack::cuda_detail
