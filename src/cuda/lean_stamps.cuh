// Measurement only (bench/NOTES.md v47): %globaltimer stamps inside the lean path's kernels, compiled in only when
// KVPACK_LEAN_STAMPS is defined (a separate build: -DCMAKE_CUDA_FLAGS=-DKVPACK_LEAN_STAMPS), so the shipped kernels
// are untouched. Each record is 8 words: key (kernel << 56 | blockIdx.y << 32 | blockIdx.x << 8 | warp), the
// rotation's page-table address (which launch of a graph replay), %smid, and up to 5 stamps in ns. `kvpack bench`
// with KVPACK_STAMPS_OUT=<file> replays one graph after timing a cell and appends its records to <file>
// (bench/tools/stamps.py reads them). Included by decode_lean.cuh only (decode_lean.cu defines the records).
#pragma once
#include <cstdint>

namespace kvpack::cuda_detail {
enum class StampKernel : uint32_t { kPrep = 1, kLean = 2, kMerge = 3 };
constexpr uint32_t kStampCap = 1u << 17;  // records
}  // namespace kvpack::cuda_detail

#ifdef KVPACK_LEAN_STAMPS
namespace kvpack::cuda_detail {
// Defined here: decode_lean.cu is the one translation unit that includes this header.
__device__ unsigned long long g_stamps[kStampCap * 8];
__device__ unsigned int g_stamp_n;
__device__ __forceinline__ unsigned long long stamp_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned stamp_smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
// One record: the caller's stamps t[0..n).
__device__ __forceinline__ void stamp_record(StampKernel k, int warp, const void* rot, const unsigned long long* t,
                                             int n) {
  const unsigned i = atomicAdd(&g_stamp_n, 1u);
  if (i >= kStampCap) return;
  unsigned long long* r = g_stamps + size_t(i) * 8;
  r[0] = (static_cast<unsigned long long>(k) << 56) | (static_cast<unsigned long long>(blockIdx.y) << 32) |
         (static_cast<unsigned long long>(blockIdx.x) << 8) | static_cast<unsigned long long>(warp);
  r[1] = reinterpret_cast<uintptr_t>(rot);
  r[2] = stamp_smid();
  for (int j = 0; j < 5; ++j) r[3 + j] = j < n ? t[j] : 0ull;
}
}  // namespace kvpack::cuda_detail
#define KVPACK_STAMP(var) var = ::kvpack::cuda_detail::stamp_now()
#define KVPACK_STAMP_DECL(name, n) unsigned long long name[n] = {}
#define KVPACK_STAMP_RECORD(kind, warp, rot, name, n) \
  ::kvpack::cuda_detail::stamp_record(::kvpack::cuda_detail::StampKernel::kind, warp, rot, name, n)
#else
#define KVPACK_STAMP(var) ((void)0)
#define KVPACK_STAMP_DECL(name, n)
#define KVPACK_STAMP_RECORD(kind, warp, rot, name, n) ((void)0)
#endif
