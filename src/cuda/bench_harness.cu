// Benchmark harness: read-bandwidth probe, a filled page pool per (format, shape), decode and write timings with
// CUDA events (median), rotating over distinct caches so that L2 cannot serve them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <numeric>
#include <random>
#include <vector>

#include "bench_harness.cuh"
#include "decode_internal.cuh"
#include "format_policy.cuh"
#include "kvpack/error.h"

namespace kvpack::bench {
namespace {

__global__ void read_probe_kernel(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  uint32_t x = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // 4 independent 16-byte loads in flight per thread per iteration.
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    uint4 a = __ldcs(p + i);
    x ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (x == 0x9e3779b9u) sink[0] = x;  // keeps the loads alive; practically never taken
}

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Random bf16 roughly N(0, 1) (sum of 4 uniforms), from a counter hash: any chunk is reproducible on its own.
__global__ void random_bf16_kernel(uint16_t* out, size_t n, uint64_t seed) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.f;
  for (int k = 0; k < 4; ++k) s += (hash32(seed * 0x100000001b3ull + i * 4 + k) >> 8) * (1.f / 16777216.f);
  out[i] = f32_to_bf16((s - 2.f) * 1.7320508f);
}

__global__ void slots_kernel(int32_t* slots, const int32_t* perm, int64_t tok0, int n, int page_size) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = tok0 + i;
  slots[i] = perm[t / page_size] * page_size + static_cast<int32_t>(t % page_size);
}

struct Events {
  cudaEvent_t a, b;
  Events() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class T>
T* dmalloc(size_t n) {
  void* p = nullptr;
  KVPACK_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

}  // namespace

DeviceSummary device_summary() {
  DeviceSummary s;
  int dev = 0;
  cudaDeviceProp prop{};
  KVPACK_CUDA_CHECK(cudaGetDevice(&dev));
  KVPACK_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  s.name = prop.name;
  s.sms = prop.multiProcessorCount;
  s.l2_bytes = prop.l2CacheSize;
  s.mem_bytes = prop.totalGlobalMem;
  return s;
}

double measure_read_bandwidth_tbs(size_t bytes, int iters) {
  const size_t n = bytes / 16;
  uint4* buf = dmalloc<uint4>(n);
  uint32_t* sink = dmalloc<uint32_t>(1);
  KVPACK_CUDA_CHECK(cudaMemset(buf, 1, n * 16));
  const int blocks = device_summary().sms * 4;
  Events ev;
  std::vector<double> ms;
  for (int it = 0; it < iters + 2; ++it) {
    cudaEventRecord(ev.a);
    read_probe_kernel<<<blocks, 512>>>(buf, n, sink);
    cudaEventRecord(ev.b);
    KVPACK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    float t = 0;
    cudaEventElapsedTime(&t, ev.a, ev.b);
    if (it >= 2) ms.push_back(t);
  }
  KVPACK_CUDA_CHECK(cudaGetLastError());
  cudaFree(buf);
  cudaFree(sink);
  return double(n * 16) / (median(ms) * 1e-3) / 1e12;
}

struct DecodeBench::Impl {
  DecodeShape shape;
  PagedLayout layout;
  int max_batch = 0;
  int64_t max_context = 0;
  int64_t num_pages = 0;
  uint8_t* k_pool = nullptr;
  uint8_t* v_pool = nullptr;
  int32_t* perm_d = nullptr;
  std::vector<int32_t> perm;
  uint64_t seed = 0;
  // q formats: synthetic calibrated parameters (device copies) and one sink row per sequence.
  FormatParams params;
  std::vector<void*> owned;
  uint16_t* k_sinks = nullptr;
  uint16_t* v_sinks = nullptr;
  int32_t* sink_rows = nullptr;
  ~Impl() {
    cudaFree(k_pool);
    cudaFree(v_pool);
    cudaFree(perm_d);
    for (void* p : owned) cudaFree(p);
  }
  // The write of n tokens (bf16 K and V, their slots) into this pool, with its format's parameters.
  WriteArgs write_args(const uint16_t* k, const uint16_t* v, const int32_t* slots, int n) const {
    return {.k = k, .v = v, .slot_mapping = slots, .num_tokens = n, .k_pool = k_pool, .v_pool = v_pool,
            .num_pages = num_pages, .params = params};
  }
  template <class T>
  const T* upload(const std::vector<T>& h) {
    T* d = dmalloc<T>(h.size());
    KVPACK_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    owned.push_back(d);
    return d;
  }
  block::QHeadTable upload_q(const QHostParams& q) {
    return q.table_via([this](const auto& v) { return upload(v); });
  }
};

DecodeBench::DecodeBench(const DecodeShape& shape, int max_batch, int64_t max_context, uint64_t seed,
                         bool shuffle_pages)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.shape = shape;
  m.layout = make_paged_layout(shape.format, shape.page_size, shape.num_kv_heads, shape.head_dim);
  m.max_batch = max_batch;
  m.max_context = (max_context + shape.page_size - 1) / shape.page_size * shape.page_size;
  m.num_pages = int64_t{max_batch} * m.max_context / shape.page_size;
  m.seed = seed;
  m.perm.resize(m.num_pages);
  std::iota(m.perm.begin(), m.perm.end(), 0);
  std::mt19937_64 rng(seed);
  if (shuffle_pages) std::shuffle(m.perm.begin(), m.perm.end(), rng);
  m.perm_d = dmalloc<int32_t>(m.perm.size());
  KVPACK_CUDA_CHECK(cudaMemcpy(m.perm_d, m.perm.data(), m.perm.size() * 4, cudaMemcpyHostToDevice));
  const size_t pool = size_t(m.num_pages) * m.layout.page_bytes();
  m.k_pool = dmalloc<uint8_t>(pool);
  m.v_pool = dmalloc<uint8_t>(pool);
  const int sink_tokens = format_info(shape.format).sink_tokens;
  if (sink_tokens > 0) {
    m.params.qk = m.upload_q(synthetic_q_params(shape.format, false, shape.num_kv_heads, shape.head_dim, seed));
    m.params.qv = m.upload_q(synthetic_q_params(shape.format, true, shape.num_kv_heads, shape.head_dim, seed + 1));
    const size_t se = size_t(max_batch) * sink_tokens * shape.num_kv_heads * shape.head_dim;
    m.k_sinks = dmalloc<uint16_t>(se);
    m.v_sinks = dmalloc<uint16_t>(se);
    m.owned.push_back(m.k_sinks);
    m.owned.push_back(m.v_sinks);
    random_bf16_kernel<<<(se + 255) / 256, 256>>>(m.k_sinks, se, seed + 5);
    random_bf16_kernel<<<(se + 255) / 256, 256>>>(m.v_sinks, se, seed + 6);
    std::vector<int32_t> rows(max_batch);
    std::iota(rows.begin(), rows.end(), 0);
    m.sink_rows = const_cast<int32_t*>(m.upload(rows));
  }

  // Fill every token slot through the write path, in chunks.
  const int chunk = 1 << 16;
  const size_t elems = size_t(chunk) * shape.num_kv_heads * shape.head_dim;
  uint16_t* k = dmalloc<uint16_t>(elems);
  uint16_t* v = dmalloc<uint16_t>(elems);
  int32_t* slots = dmalloc<int32_t>(chunk);
  Events ev;
  cudaEventRecord(ev.a);
  const int64_t total = m.num_pages * shape.page_size;
  for (int64_t t0 = 0; t0 < total; t0 += chunk) {
    const int n = static_cast<int>(std::min<int64_t>(chunk, total - t0));
    const size_t ne = size_t(n) * shape.num_kv_heads * shape.head_dim;
    random_bf16_kernel<<<(ne + 255) / 256, 256>>>(k, ne, seed * 1000003 + t0 * 2);
    random_bf16_kernel<<<(ne + 255) / 256, 256>>>(v, ne, seed * 1000003 + t0 * 2 + 1);
    slots_kernel<<<(n + 255) / 256, 256>>>(slots, m.perm_d, t0, n, shape.page_size);
    write_kv(m.layout, m.write_args(k, v, slots, n));
  }
  cudaEventRecord(ev.b);
  KVPACK_CUDA_CHECK(cudaEventSynchronize(ev.b));
  KVPACK_CUDA_CHECK(cudaGetLastError());
  float ms = 0;
  cudaEventElapsedTime(&ms, ev.a, ev.b);
  fill_ms_ = ms;
  cudaFree(k);
  cudaFree(v);
  cudaFree(slots);
}

DecodeBench::~DecodeBench() = default;

DecodeTiming DecodeBench::time_decode(int batch, int64_t context, int splits, int stages, const TuningTable* table,
                                      int iters, bool fallback, bool eager, int leaf, bool with_write) {
  Impl& m = *impl_;
  const DecodeShape& s = m.shape;
  KVPACK_CHECK(batch <= m.max_batch && context <= m.max_context, "bench: batch {} x context {} exceeds the pool",
                  batch, context);
  const int P = s.page_size;
  const int64_t ppseq = (context + P - 1) / P;
  const int64_t needed = int64_t{batch} * ppseq;
  const double bytes = 2.0 * batch * context * s.num_kv_heads * (m.layout.code_bytes_per_token + m.layout.meta_bytes_per_token);
  const DeviceSummary dev = device_summary();
  // Rotate over enough disjoint page sets that their total is >= 4x L2 (or as many as the pool holds).
  int rot = static_cast<int>(std::ceil(4.0 * dev.l2_bytes / bytes));
  rot = std::clamp<int>(rot, 1, static_cast<int>(std::min<int64_t>(64, m.num_pages / needed)));

  std::vector<int32_t> tables(size_t(rot) * needed);
  for (int r = 0; r < rot; ++r)
    for (int64_t i = 0; i < needed; ++i) tables[size_t(r) * needed + i] = m.perm[r * needed + i];
  std::vector<int32_t> lens(batch, static_cast<int32_t>(context));
  int32_t* tables_d = dmalloc<int32_t>(tables.size());
  int32_t* lens_d = dmalloc<int32_t>(lens.size());
  KVPACK_CUDA_CHECK(cudaMemcpy(tables_d, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  KVPACK_CUDA_CHECK(cudaMemcpy(lens_d, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  const size_t qn = size_t(batch) * s.num_qo_heads * s.head_dim;
  uint16_t* q = dmalloc<uint16_t>(qn);
  uint16_t* out = dmalloc<uint16_t>(qn);
  int32_t* status = dmalloc<int32_t>(1);
  random_bf16_kernel<<<(qn + 255) / 256, 256>>>(q, qn, m.seed + 17);
  KVPACK_CUDA_CHECK(cudaMemset(status, 0, 4));

  DecodePlan plan = splits > 0 ? plan_decode_with(s, batch, context, splits, stages, leaf)
                    : fallback   ? plan_decode_fallback(s, batch, context)
                                 : plan_decode(s, batch, context, table);
  if (leaf >= 0 && splits <= 0)  // the same validation as an explicit plan's, then the planned configuration
    plan.leaf = plan_decode_with(s, batch, context, plan.num_splits, plan.stages, leaf).leaf;
  void* ws = dmalloc<uint8_t>(plan.workspace_bytes);
  KVPACK_CUDA_CHECK(cudaMemset(ws, 0, plan.workspace_bytes));
  DecodeArgs a;
  a.q = q;
  a.k_pool = m.k_pool;
  a.v_pool = m.v_pool;
  a.num_pages = m.num_pages;
  a.out = out;
  a.workspace = ws;
  a.status = status;
  a.params = m.params;
  if (m.sink_rows) a.sinks = SinkView{m.k_sinks, m.v_sinks, m.sink_rows, m.max_batch};
  // The fills above (q, status, workspace) ran on the legacy default stream, which a non-blocking stream does not
  // wait for: finish them before the first launch.
  KVPACK_CUDA_CHECK(cudaDeviceSynchronize());
  // with_write: each rotation's step first writes one fresh token per sequence into its last position (context - 1),
  // through that rotation's own page table, so the attention that follows reads it.
  const size_t wn = size_t(batch) * s.num_kv_heads * s.head_dim;
  uint16_t* wkv = nullptr;
  int32_t* wslots = nullptr;
  if (with_write) {
    wkv = dmalloc<uint16_t>(wn * 2 * rot);
    random_bf16_kernel<<<(wn * 2 * rot + 255) / 256, 256>>>(wkv, wn * 2 * rot, m.seed + 23);
    std::vector<int32_t> slots(size_t(rot) * batch);
    const int64_t last = context - 1;
    for (int r = 0; r < rot; ++r)
      for (int b = 0; b < batch; ++b)
        slots[size_t(r) * batch + b] =
            tables[size_t(r) * needed + b * ppseq + last / P] * P + static_cast<int32_t>(last % P);
    wslots = dmalloc<int32_t>(slots.size());
    KVPACK_CUDA_CHECK(cudaMemcpy(wslots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    KVPACK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  cudaStream_t cs = nullptr;
  KVPACK_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  // A step (with_write) runs as a server would: decode_step, the write and the attention in one call.
  auto launch = [&](int r) {
    a.table = view_of(BlockTable{tables_d + size_t(r) * needed, lens_d, static_cast<int>(ppseq), batch});
    if (with_write) {
      WriteArgs w = m.write_args(wkv + wn * 2 * r, wkv + wn * (2 * r + 1), wslots + size_t(r) * batch, batch);
      w.status = status;
      decode_step(m.layout, w, plan, a, cs);
    } else {
      run_decode(plan, a, cs);
    }
  };
  const unsigned long long lean_before = lean_last_launch().launches;
  for (int r = 0; r < rot; ++r) launch(r);  // warm-up (module load, smem attribute)
  const LeanLaunchInfo li = lean_last_launch();  // what the lean launcher chose, if this plan ran the lean path
  const bool lean = li.launches != lean_before;
  KVPACK_CUDA_CHECK(cudaStreamSynchronize(cs));
  // One graph of the rotation's launches, replayed per sample; eager launches if capture or instantiation fails.
  cudaGraphExec_t exec = nullptr;
  if (!eager) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
      for (int r = 0; r < rot; ++r) launch(r);
      if (cudaStreamEndCapture(cs, &graph) == cudaSuccess && graph) {
        if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
        cudaGraphDestroy(graph);
      }
    }
    cudaGetLastError();  // a failed capture leaves an error behind; the eager path below is then the timing
    if (exec) {
      KVPACK_CUDA_CHECK(cudaGraphLaunch(exec, cs));  // warm-up replay (graph upload)
      KVPACK_CUDA_CHECK(cudaStreamSynchronize(cs));
    }
  }
  Events ev;
  std::vector<double> us;
  for (int it = 0; it < iters; ++it) {
    cudaEventRecord(ev.a, cs);
    if (exec) {
      KVPACK_CUDA_CHECK(cudaGraphLaunch(exec, cs));
    } else {
      for (int r = 0; r < rot; ++r) launch(r);
    }
    cudaEventRecord(ev.b, cs);
    KVPACK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    float ms = 0;
    cudaEventElapsedTime(&ms, ev.a, ev.b);
    us.push_back(ms * 1e3 / rot);
  }
  KVPACK_CUDA_CHECK(cudaGetLastError());
  // Measurement builds only (KVPACK_LEAN_STAMPS, src/cuda/lean_stamps.cuh): one more replay with the lean path's
  // kernels stamping their phases, appended to $KVPACK_STAMPS_OUT.
  if (const char* sp = std::getenv("KVPACK_STAMPS_OUT"); sp && exec && lean_stamps_reset()) {
    KVPACK_CUDA_CHECK(cudaGraphLaunch(exec, cs));
    KVPACK_CUDA_CHECK(cudaStreamSynchronize(cs));
    const std::string label = fmt::format("{}/{}q{}kv{}/b{}/ctx{}/leaf{}/splits{}", format_name(s.format),
                                          s.num_qo_heads, s.num_kv_heads, s.head_dim, batch, context, plan.leaf,
                                          plan.num_splits);
    lean_stamps_dump(sp, label.c_str());
  }
  const bool graphed = exec != nullptr;
  if (exec) cudaGraphExecDestroy(exec);
  cudaStreamDestroy(cs);
  int32_t st = 0;
  KVPACK_CUDA_CHECK(cudaMemcpy(&st, status, 4, cudaMemcpyDeviceToHost));
  KVPACK_CHECK(st == 0, "bench: decode kernel reported status {}", st);
  // The output must be finite everywhere (a timed kernel is a checked kernel; values are checked by the GPU tests).
  std::vector<uint16_t> h(qn);
  KVPACK_CUDA_CHECK(cudaMemcpy(h.data(), out, qn * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < qn; ++i)
    KVPACK_CHECK(std::isfinite(bf16_to_f32(h[i])), "bench: output element {} is not finite", i);

  DecodeTiming t;
  t.median_us = median(us);
  t.min_us = *std::min_element(us.begin(), us.end());
  t.bytes = bytes;
  t.bandwidth_tbs = bytes / (t.median_us * 1e-6) / 1e12;
  t.num_splits = plan.num_splits;
  t.leaf = plan.leaf;
  if (lean) t.lean = li;
  t.stages = plan.stages;
  t.rotations = rot;
  t.plan_source = plan.source;
  t.timing = graphed ? "graph" : "eager";
  cudaFree(tables_d);
  cudaFree(lens_d);
  cudaFree(q);
  cudaFree(out);
  cudaFree(status);
  cudaFree(ws);
  cudaFree(wkv);
  cudaFree(wslots);
  return t;
}

WriteTiming DecodeBench::time_write(int num_tokens, int iters) {
  Impl& m = *impl_;
  const DecodeShape& s = m.shape;
  const int64_t total = m.num_pages * s.page_size;
  num_tokens = static_cast<int>(std::min<int64_t>(num_tokens, total));
  const size_t elems = size_t(num_tokens) * s.num_kv_heads * s.head_dim;
  // Inputs rotated over enough copies to exceed L2 four times (the model writes fresh activations each step).
  const DeviceSummary dev = device_summary();
  const double in_bytes = 2.0 * elems * 2;
  const int rot = std::clamp<int>(static_cast<int>(std::ceil(4.0 * dev.l2_bytes / in_bytes)), 1, 64);
  uint16_t* kv = dmalloc<uint16_t>(elems * 2 * rot);
  random_bf16_kernel<<<(elems * 2 * rot + 255) / 256, 256>>>(kv, elems * 2 * rot, m.seed + 99);
  // Slots spread over the pool: token i goes to sequence i's next position (decode-like scatter).
  std::vector<int32_t> slots(num_tokens);
  const int64_t stride_tokens = total / num_tokens;
  for (int i = 0; i < num_tokens; ++i) {
    const int64_t t = i * stride_tokens + (stride_tokens > 1 ? 7 % stride_tokens : 0);
    slots[i] = m.perm[t / s.page_size] * s.page_size + static_cast<int32_t>(t % s.page_size);
  }
  int32_t* slots_d = dmalloc<int32_t>(slots.size());
  KVPACK_CUDA_CHECK(cudaMemcpy(slots_d, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  auto launch = [&](int r) {
    write_kv(m.layout, m.write_args(kv + elems * 2 * r, kv + elems * (2 * r + 1), slots_d, num_tokens));
  };
  for (int r = 0; r < rot; ++r) launch(r);
  KVPACK_CUDA_CHECK(cudaDeviceSynchronize());
  Events ev;
  std::vector<double> us;
  for (int it = 0; it < iters; ++it) {
    cudaEventRecord(ev.a);
    for (int r = 0; r < rot; ++r) launch(r);
    cudaEventRecord(ev.b);
    KVPACK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    float ms = 0;
    cudaEventElapsedTime(&ms, ev.a, ev.b);
    us.push_back(ms * 1e3 / rot);
  }
  KVPACK_CUDA_CHECK(cudaGetLastError());
  // Measurement builds only (KVPACK_WRITE_STAMPS, write_kv.cu): one more launch with the small q write kernel's
  // phase clocks, appended to $KVPACK_WRITE_STAMPS_OUT.
  if (const char* sp = std::getenv("KVPACK_WRITE_STAMPS_OUT"); sp && write_stamps_reset()) {
    launch(0);
    KVPACK_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string label = fmt::format("write/{}/{}q{}kv{}/n{}", format_name(s.format), s.num_qo_heads,
                                          s.num_kv_heads, s.head_dim, num_tokens);
    write_stamps_dump(sp, label.c_str());
  }
  WriteTiming w;
  w.median_us = median(us);
  w.bytes = in_bytes + 2.0 * num_tokens * s.num_kv_heads * (m.layout.code_bytes_per_token + m.layout.meta_bytes_per_token);
  w.bandwidth_tbs = w.bytes / (w.median_us * 1e-6) / 1e12;
  cudaFree(kv);
  cudaFree(slots_d);
  return w;
}

}  // namespace kvpack::bench
