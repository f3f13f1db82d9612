// gather_probe: what the GPU's load paths deliver for the decode kernel's access pattern (experiment tool, not part
// of the library). A pool of "pages" read in a random page order, the way a paged KV cache is read, by
//   bulk  : warps with their own ring of `depth` slots, each slot filled by one cp.async.bulk (TMA, 1-D) of `unit`
//           bytes (plus, in the "meta" rows, a second 16-byte bulk copy from elsewhere, as the q formats' scale bytes are
//           on main), completing on the slot's mbarrier; the consumer waits, touches the slot and refills it
//           (`batch` slots at a time: lanes 0..batch-1 issue one copy each in the same instruction);
//   ldg   : warps loading `unit`-byte chunks with 16-byte loads, `depth` chunks in flight per warp;
//   stream: contiguous 16-byte loads over the whole pool (the harness's read probe).
// Prints one line per configuration: achieved TB/s and its ratio to `stream`.
// Build: nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -o gather_probe bench/tools/gather_probe.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../src/cuda/bulk_copy.cuh"
#include "probe_util.cuh"


// The decode kernel's own bulk-copy primitives, so the probe issues exactly its copies.
using kvpack::cuda_detail::bulk_copy;
using kvpack::cuda_detail::mbar_arrive_expect_tx;
using kvpack::cuda_detail::mbar_init;
using kvpack::cuda_detail::mbar_wait;

constexpr int kMaxDepth = 32;

struct Args {
  const uint8_t* pool;
  const int32_t* perm;   // unit i lives at pool + perm[i] * unit
  const uint8_t* meta;   // "meta" rows: 16 bytes per unit at meta + perm[i] * 16
  int64_t units;
  int unit, depth, batch, warps;
  uint32_t* sink;
};

__global__ void bulk_kernel(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ alignas(8) uint64_t bar[32][kMaxDepth];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t gw = int64_t{blockIdx.x} * a.warps + warp, nw = int64_t{gridDim.x} * a.warps;
  const int slot_bytes = a.unit + (a.meta ? 16 : 0);
  uint8_t* ring = smem + size_t(warp) * a.depth * slot_bytes;
  if (lane < a.depth) mbar_init(&bar[warp][lane], 1);
  __syncwarp();
  int64_t next = gw;  // next unit to issue
  auto issue = [&](int s) {  // lane-parallel: the calling lane issues unit `next` into slot s
    const int64_t u = next;
    uint8_t* dst = ring + size_t(s) * slot_bytes;
    const uint32_t bytes = a.unit + (a.meta ? 16 : 0);
    mbar_arrive_expect_tx(&bar[warp][s], bytes);
    bulk_copy(dst, a.pool + int64_t{a.perm[u]} * a.unit, a.unit, &bar[warp][s]);
    if (a.meta) bulk_copy(dst + a.unit, a.meta + int64_t{a.perm[u]} * 16, 16, &bar[warp][s]);
  };
  // Prime the ring: lane s issues slot s.
  {
    const int64_t mine = gw + int64_t{lane} * nw;
    if (lane < a.depth && mine < a.units) {
      next = mine;
      issue(lane);
    }
  }
  int64_t issued = gw + int64_t{a.depth} * nw;  // warp-uniform: the next unit to issue
  uint32_t acc = 0, phase = 0;
  int s = 0, pending = 0;  // slots consumed since the last refill
  for (int64_t u = gw; u < a.units; u += nw) {
    mbar_wait(&bar[warp][s], (phase >> s) & 1u);
    phase ^= 1u << s;
    acc += reinterpret_cast<const uint32_t*>(ring + size_t(s) * slot_bytes)[lane];
    ++pending;
    s = s + 1 == a.depth ? 0 : s + 1;
    if (pending == a.batch) {
      __syncwarp();
      // Refill the `batch` slots just consumed: lane i takes slot (s - batch + i) and unit issued + i * nw.
      if (lane < a.batch) {
        const int64_t mine = issued + int64_t{lane} * nw;
        int ss = s - a.batch + lane;
        if (ss < 0) ss += a.depth;
        if (mine < a.units) {
          next = mine;
          issue(ss);
        }
      }
      issued += int64_t{a.batch} * nw;
      pending = 0;
    }
  }
  if (acc == 0x12345678u) a.sink[0] = acc;
}

template <int DEPTH, int PER>
__global__ void ldg_kernel(Args a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t gw = int64_t{blockIdx.x} * a.warps + warp, nw = int64_t{gridDim.x} * a.warps;
  uint32_t acc = 0;
  for (int64_t u0 = gw; u0 < a.units; u0 += nw * DEPTH) {
    uint4 v[DEPTH][PER];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int64_t u = u0 + int64_t{d} * nw;
      const uint4* src = reinterpret_cast<const uint4*>(a.pool + int64_t{a.perm[u < a.units ? u : 0]} * a.unit);
#pragma unroll
      for (int j = 0; j < PER; ++j) v[d][j] = u < a.units ? __ldcs(src + j * 32 + lane) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
#pragma unroll
      for (int j = 0; j < PER; ++j) acc += v[d][j].x ^ v[d][j].w;
  }
  if (acc == 0x12345678u) a.sink[0] = acc;
}

template <class F>
float time_ms(F f, int reps = 7) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0));
    f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const size_t pool_bytes = size_t{4} << 30;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  uint8_t* pool;
  // "meta" rows: 16 bytes per 1 KB unit (the only unit size run with them).
  const size_t meta_bytes = pool_bytes / 1024 * 16;
  uint8_t* meta;
  uint32_t* sink;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  CK(cudaMalloc(&meta, meta_bytes));
  CK(cudaMemset(meta, 2, meta_bytes));
  CK(cudaMalloc(&sink, 4));
  std::printf("%s, %d SMs\n", prop.name, sms);
  const float sms_ms = time_ms([&] { stream_kernel<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(pool), pool_bytes / 16, sink); });
  const double stream_tbs = pool_bytes / (sms_ms * 1e-3) / 1e12;
  std::printf("stream: %.3f ms, %.3f TB/s\n", sms_ms, stream_tbs);
  std::mt19937 rng(1);
  int32_t* perm_d = nullptr;
  int cur_unit = -1;
  int64_t units = 0;
  auto set_unit = [&](int unit) {
    if (unit == cur_unit) return;
    units = int64_t(pool_bytes / unit);
    std::vector<int32_t> perm(units);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    if (perm_d) CK(cudaFree(perm_d));
    CK(cudaMalloc(&perm_d, units * sizeof(int32_t)));
    CK(cudaMemcpy(perm_d, perm.data(), units * sizeof(int32_t), cudaMemcpyHostToDevice));
    cur_unit = unit;
  };
  CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  std::printf("%-6s %6s %5s %5s %5s %5s %4s %8s %8s %7s %9s\n", "mode", "unit", "meta", "depth", "batch", "warps", "cta",
              "KB/SM", "ms", "TB/s", "of stream");
  auto run = [&](const char* mode, int unit, bool with_meta, int depth, int batch, int warps, int ctas) {
    set_unit(unit);
    Args a{pool, perm_d, with_meta ? meta : nullptr, units, unit, depth, batch, warps, sink};
    const size_t smem = size_t(warps) * depth * (unit + (with_meta ? 16 : 0));
    float ms;
    if (std::string(mode) == "bulk") {
      if (smem * ctas > size_t(prop.sharedMemPerMultiprocessor) || smem > 200 * 1024) return;
      int occ = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, bulk_kernel, warps * 32, smem));
      if (occ < ctas) return;
      ms = time_ms([&] { bulk_kernel<<<sms * ctas, warps * 32, smem>>>(a); });
    } else {
      auto k = ldg_kernel<1, 2>;
      const int per = unit / 512;
#define KV_LDG(D)                                 \
  if (depth == D) k = per == 2 ? ldg_kernel<D, 2> : ldg_kernel<D, 4>;
      KV_LDG(1) KV_LDG(2) KV_LDG(4) KV_LDG(8)
#undef KV_LDG
      ms = time_ms([&] { k<<<sms * ctas, warps * 32>>>(a); });
    }
    const double bytes = double(units) * (unit + (with_meta ? 16 : 0));
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    std::printf("%-6s %6d %5d %5d %5d %5d %4d %8.0f %8.3f %7.3f %8.1f%%\n", mode, unit, int(with_meta), depth, batch, warps,
                ctas, double(smem * ctas) / 1024, ms, tbs, 100 * tbs / stream_tbs);
    std::fflush(stdout);
  };
  // The decode kernel's configurations (8 warps, 2 CTAs per SM, 16-token units): q4 1 KB (+16 B meta on main), fp8
  // 2 KB; then deeper rings, batched refills, and larger units (bigger pages).
  for (int unit : {1024, 2048, 4096, 8192}) {
    for (int meta_on : {0, 1}) {
      if (meta_on && unit != 1024) continue;
      for (int depth : {2, 3, 4, 6, 8, 12, 16, 24}) {
        for (int batch : {1, 2, 4}) {
          if (batch > depth) continue;
          for (int ctas : {1, 2}) run("bulk", unit, meta_on, depth, batch, 8, ctas);
        }
      }
    }
  }
  for (int unit : {1024, 2048}) {
    for (int warps : {4, 8, 16})
      for (int depth : {1, 2, 4, 8})
        for (int ctas : {1, 2, 4}) {
          run("ldg", unit, false, depth, 1, warps, ctas);
        }
  }
  return 0;
}
