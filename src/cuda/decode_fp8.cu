// Decode attention kernels for fp8 (one translation unit per format: parallel device builds).
#include "decode_kernel.cuh"

namespace kvpack::cuda_detail {
template void launch_decode_format<Fp8Policy>(const DecodeKernelParams&, int, int, cudaStream_t);
template int ctas_per_sm_format<Fp8Policy>(int, int, int);
}  // namespace kvpack::cuda_detail
