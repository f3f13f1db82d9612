// The block core's scalar functions that have a device-only implementation (one hardware instruction specified as the
// same function) against the host implementation, the oracle, over every input that can reach them.
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.cuh"
#include "kvpack/block/common.h"

namespace kvpack::test {
namespace {

__global__ void e4m3_kernel(const float* x, uint8_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = block::f32_to_e4m3(x[i]);
}
// f32x2_to_e4m3x2 (v64: the fp8 write kernel converts pairs) on (x[i], x[n - 1 - i]): bytes 2i and 2i + 1.
__global__ void e4m3x2_kernel(const float* x, uint16_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = block::f32x2_to_e4m3x2(x[i], x[n - 1 - i]);
}

// f32_to_e4m3 on sm_89+ is cvt.rn.satfinite.e4m3x2.f32 (bench/NOTES.md v63). Every float whose top 20 bits (sign,
// exponent, the 11 mantissa bits that decide e4m3's rounding with room to spare) take all 2^20 values, with the low
// 12 bits 0, 1, 0x7ff, 0x800 and 0xfff (exact ties of the subnormal and normal grids, and their neighbours), NaNs
// left out (the write path sanitizes first): the same byte as the host.
TEST(BlockCoreGpu, E4m3EncodeMatchesTheHost) {
  KVPACK_REQUIRE_GPU();
  std::vector<float> x;
  x.reserve(size_t{5} << 20);
  for (uint32_t top = 0; top < (1u << 20); ++top)
    for (uint32_t low : {0u, 1u, 0x7ffu, 0x800u, 0xfffu}) {
      const uint32_t u = (top << 12) | low;
      if ((u & 0x7fffffffu) > 0x7f800000u) continue;  // NaN
      float f;
      std::memcpy(&f, &u, 4);
      x.push_back(f);
    }
  const int n = static_cast<int>(x.size());
  DevBuf<float> dx(x);
  DevBuf<uint8_t> dout(x.size());
  dout.fill_bytes(0xA5);
  e4m3_kernel<<<(n + 255) / 256, 256>>>(dx.p, dout.p, n);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = dout.download();
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const uint8_t want = block::f32_to_e4m3(x[i]);
    if (got[i] != want && ++bad <= 10) {
      uint32_t u;
      std::memcpy(&u, &x[i], 4);
      ADD_FAILURE() << "x = " << x[i] << " (0x" << std::hex << u << "): device 0x" << int(got[i]) << ", host 0x"
                    << int(want) << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << n << " inputs";
  // The pair conversion: the low byte is the first value's, the high byte the second's.
  DevBuf<uint16_t> dpair(x.size());
  dpair.fill_bytes(0xA5);
  e4m3x2_kernel<<<(n + 255) / 256, 256>>>(dx.p, dpair.p, n);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> pairs = dpair.download();
  int bad_pairs = 0;
  for (int i = 0; i < n; ++i) {
    const uint16_t want = static_cast<uint16_t>(block::f32_to_e4m3(x[i]) | (block::f32_to_e4m3(x[n - 1 - i]) << 8));
    if (pairs[i] != want && ++bad_pairs <= 10)
      ADD_FAILURE() << "pair " << i << " (" << x[i] << ", " << x[n - 1 - i] << "): device 0x" << std::hex << pairs[i]
                    << ", host 0x" << want << std::dec;
  }
  EXPECT_EQ(bad_pairs, 0) << "of " << n << " pairs";
}

}  // namespace
}  // namespace kvpack::test
