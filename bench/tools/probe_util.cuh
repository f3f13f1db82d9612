// Shared by the standalone GPU probes in bench/tools (gather_probe.cu, lean_probe.cu): the CUDA error check and the
// streaming-read reference kernel (16-byte streaming loads over a whole buffer, the bandwidth the probes compare to).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

__global__ void stream_kernel(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc += v.x ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
