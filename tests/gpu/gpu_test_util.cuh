// Helpers shared by the GPU tests: device buffers, skip-without-GPU, random paged caches built with the CPU
// reference (the oracle) and mirrored on the device.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "kvpack/bf16.h"
#include "kvpack/cuda_runtime_info.h"
#include "kvpack/decode.h"
#include "kvpack/paged.h"

#define KVPACK_REQUIRE_GPU()                                              \
  do {                                                                    \
    if (::kvpack::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << cudaGetErrorString(cudaGetLastError())

namespace kvpack::test {

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) {
    if (count && cudaMalloc(&p, count * sizeof(T)) != cudaSuccess) {
      p = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << count * sizeof(T) << " bytes failed";
    }
  }
  DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; o.n = 0; }
  void upload(const std::vector<T>& h) {
    EXPECT_EQ(cudaSuccess, cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaSuccess, cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_bytes(int v) { EXPECT_EQ(cudaSuccess, cudaMemset(p, v, n * sizeof(T))); }
};

inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  return v;
}

// A batch of sequences in a shuffled page pool, with both page-table views, built on the host.
struct PagedBatch {
  PagedLayout layout;
  std::vector<int64_t> lens;
  int64_t num_pages = 0;
  std::vector<int32_t> indptr, indices, last_page_len;  // CSR
  std::vector<int32_t> block_table, seq_lens;           // vLLM
  int max_blocks = 0;
  std::vector<int32_t> slots;                           // slot of token i of the concatenated sequences
  std::vector<uint16_t> k, v;                           // [tokens][heads][D] bf16
  std::vector<uint8_t> k_pool, v_pool;                  // CPU reference pools
  std::vector<float> k_scale, v_scale;                  // per-kv-head format scales (fp8), empty = none
  std::optional<QHostParams> qk, qv;                    // q formats: synthetic calibrated parameters
  // Sink tokens (formats that keep them): pools [rows][kSinkTokens][heads][D], sequence b in row sink_rows[b]
  // (rows in reverse order, so a wrong row index reads another sequence's sinks).
  std::vector<uint16_t> k_sinks, v_sinks;
  std::vector<int32_t> sink_rows, sink_slots;           // sink_slots: per token of `slots`, row*4+pos or -1
  FormatParams host_params() const {
    FormatParams p;
    if (!k_scale.empty()) p.k_scale = k_scale.data();
    if (!v_scale.empty()) p.v_scale = v_scale.data();
    if (qk) p.qk = qk->table();
    if (qv) p.qv = qv->table();
    return p;
  }
  SinkView host_sinks() const {
    SinkView s;
    if (sink_rows.empty()) return s;
    s.k = k_sinks.data();
    s.v = v_sinks.data();
    s.rows = sink_rows.data();
    s.num_rows = static_cast<int64_t>(sink_rows.size());
    return s;
  }

  int64_t total_tokens() const { return std::accumulate(lens.begin(), lens.end(), int64_t{0}); }
  PageTableView csr_view() const {
    CsrPageTable t{indptr.data(), indices.data(), last_page_len.data(), static_cast<int>(lens.size())};
    return view_of(t);
  }
  PageTableView block_view() const {
    BlockTable t{block_table.data(), seq_lens.data(), max_blocks, static_cast<int>(lens.size())};
    return view_of(t);
  }
};

// extra_pages: unused pages mixed into the pool, so a wrong page index reads the wrong data.
inline PagedBatch make_batch(const PagedLayout& layout, const std::vector<int64_t>& lens, std::mt19937& rng,
                             int extra_pages = 3, bool write_ref = true) {
  PagedBatch pb;
  pb.layout = layout;
  if (layout.format == Format::fp8) {  // calibrated-looking scales, different per head and for K and V
    std::uniform_real_distribution<float> sd(0.004f, 0.02f);
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      pb.k_scale.push_back(sd(rng));
      pb.v_scale.push_back(sd(rng));
    }
  }
  if (format_info(layout.format).sink_tokens > 0) {
    pb.qk = synthetic_q_params(layout.format, false, layout.num_kv_heads, layout.head_dim, rng());
    pb.qv = synthetic_q_params(layout.format, true, layout.num_kv_heads, layout.head_dim, rng());
  }
  pb.lens = lens;
  const int P = layout.page_size;
  int64_t need = 0;
  for (auto l : lens) need += (l + P - 1) / P;
  pb.num_pages = need + extra_pages;
  std::vector<int32_t> perm(pb.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // shuffled page table
  pb.indptr.push_back(0);
  for (auto l : lens) pb.max_blocks = std::max<int>(pb.max_blocks, static_cast<int>((l + P - 1) / P));
  pb.max_blocks = std::max(pb.max_blocks, 1);
  int64_t next = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t np = (lens[b] + P - 1) / P;
    for (int64_t j = 0; j < np; ++j) pb.indices.push_back(perm[next + j]);
    pb.indptr.push_back(static_cast<int32_t>(pb.indices.size()));
    pb.last_page_len.push_back(np ? static_cast<int32_t>(lens[b] - (np - 1) * P) : 0);
    for (int j = 0; j < pb.max_blocks; ++j)
      pb.block_table.push_back(j < np ? perm[next + j] : -7);  // garbage beyond the sequence: never read
    pb.seq_lens.push_back(static_cast<int32_t>(lens[b]));
    for (int64_t t = 0; t < lens[b]; ++t) pb.slots.push_back(perm[next + t / P] * P + static_cast<int32_t>(t % P));
    next += np;
  }
  const size_t elems = size_t(pb.total_tokens()) * layout.num_kv_heads * layout.head_dim;
  pb.k = random_bf16(elems, rng);
  pb.v = random_bf16(elems, rng);
  const int ST = format_info(layout.format).sink_tokens;
  if (ST > 0) {
    const int B = static_cast<int>(lens.size());
    const size_t tok_elems = size_t(layout.num_kv_heads) * layout.head_dim;
    pb.k_sinks = random_bf16(size_t(B) * ST * tok_elems, rng);  // rows of short sequences keep random junk
    pb.v_sinks = random_bf16(size_t(B) * ST * tok_elems, rng);
    int64_t t0 = 0;
    for (int b = 0; b < B; ++b) {
      const int row = B - 1 - b;
      pb.sink_rows.push_back(row);
      for (int64_t t = 0; t < lens[b]; ++t) {
        const bool sink = t < ST;
        pb.sink_slots.push_back(sink ? row * ST + static_cast<int32_t>(t) : -1);
        if (sink) {
          std::copy_n(pb.k.begin() + (t0 + t) * tok_elems, tok_elems, pb.k_sinks.begin() + (size_t(row) * ST + t) * tok_elems);
          std::copy_n(pb.v.begin() + (t0 + t) * tok_elems, tok_elems, pb.v_sinks.begin() + (size_t(row) * ST + t) * tok_elems);
        }
      }
      t0 += lens[b];
    }
  }
  pb.k_pool.assign(size_t(pb.num_pages * layout.page_bytes()), 0xA5);  // poison: unwritten bytes stay visible
  pb.v_pool.assign(size_t(pb.num_pages * layout.page_bytes()), 0xA5);
  if (write_ref)
    paged_write_ref(layout, pb.k_pool.data(), pb.v_pool.data(), pb.num_pages, pb.k.data(), pb.v.data(),
                    pb.slots.data(), static_cast<int>(pb.slots.size()), pb.host_params());
  return pb;
}

// Device copy of q-format parameters.
struct DevQ {
  DevBuf<float> mean, fwd, inv, step, inv_step, rms_weight;
  DevBuf<uint8_t> group_bits;
  explicit DevQ(const QHostParams& q)
      : mean(q.mean), fwd(q.fwd), inv(q.inv), step(q.step), inv_step(q.inv_step), rms_weight(q.rms_weight),
        group_bits(q.group_bits) {}
  block::QHeadTable table() const {
    return block::QHeadTable::from(
        block::QParams{mean.p, fwd.p, inv.p, step.p, inv_step.p, rms_weight.p, group_bits.p});
  }
};

// Device copy of a PagedBatch's format parameters (what WriteArgs/DecodeArgs::params take).
struct DevParams {
  DevBuf<float> k_scale, v_scale;
  std::optional<DevQ> qk, qv;
  explicit DevParams(const PagedBatch& pb) : k_scale(pb.k_scale), v_scale(pb.v_scale) {
    if (pb.qk) qk.emplace(*pb.qk);
    if (pb.qv) qv.emplace(*pb.qv);
  }
  FormatParams params() const {
    FormatParams p;
    if (k_scale.n) p.k_scale = k_scale.p;
    if (v_scale.n) p.v_scale = v_scale.p;
    if (qk) p.qk = qk->table();
    if (qv) p.qv = qv->table();
    return p;
  }
};

// Device mirror of a PagedBatch's pools and tables.
struct DevBatch {
  DevBuf<uint8_t> k_pool, v_pool;
  DevBuf<int32_t> indptr, indices, last_page_len, block_table, seq_lens;
  DevParams fp;
  DevBuf<uint16_t> k_sinks, v_sinks;
  DevBuf<int32_t> sink_rows;
  explicit DevBatch(const PagedBatch& pb)
      : k_pool(pb.k_pool), v_pool(pb.v_pool), indptr(pb.indptr), indices(pb.indices),
        last_page_len(pb.last_page_len), block_table(pb.block_table), seq_lens(pb.seq_lens), fp(pb),
        k_sinks(pb.k_sinks), v_sinks(pb.v_sinks), sink_rows(pb.sink_rows) {}
  FormatParams params() const { return fp.params(); }
  SinkView sinks() const {
    SinkView s;
    if (!sink_rows.n) return s;
    s.k = k_sinks.p;
    s.v = v_sinks.p;
    s.rows = sink_rows.p;
    s.num_rows = static_cast<int64_t>(sink_rows.n);
    return s;
  }
  PageTableView csr_view(int batch) const {
    return view_of(CsrPageTable{indptr.p, indices.p, last_page_len.p, batch});
  }
  PageTableView block_view(int batch, int max_blocks) const {
    return view_of(BlockTable{block_table.p, seq_lens.p, max_blocks, batch});
  }
};

inline bool bits_equal(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

}  // namespace kvpack::test
