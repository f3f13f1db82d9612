// Hopper bulk-copy primitives (TMA, 1-D copies completing on shared-memory mbarriers), shared by the decode kernel
// (src/cuda/decode_kernel.cuh) and the load-path probe (bench/tools/gather_probe.cu). Below sm_90 they compile to
// nothing (KVPACK_DECODE_BULK = 0) and the kernels use their cp.async paths.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kvpack {
namespace cuda_detail {

// Hopper bulk copies (TMA, 1-D): one instruction moves a page's run of a tile (>= 256 B for every format at page
// size 16) into shared memory and signals an mbarrier with the byte count; the per-16-byte cp.async pieces they
// replace cost address arithmetic on every thread (half of fp8's instructions in v10's profile). sm_80 keeps the
// cp.async ring.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KVPACK_DECODE_BULK 1
#else
#define KVPACK_DECODE_BULK 0
#endif
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if KVPACK_DECODE_BULK
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if KVPACK_DECODE_BULK
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
// A plain arrival (release at CTA scope: the thread's earlier shared-memory writes are visible to the waiter).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if KVPACK_DECODE_BULK
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if KVPACK_DECODE_BULK
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if KVPACK_DECODE_BULK
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#endif
}
// Generic-proxy writes (zero fills) to shared memory that bulk copies will later overwrite.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if KVPACK_DECODE_BULK
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace cuda_detail
}  // namespace kvpack
