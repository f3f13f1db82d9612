// GPU tests of the paged write path, the dequantiser and decode attention, against the CPU reference.
// Labelled `gpu`; every test skips cleanly without a GPU. Inputs are fresh random values with fixed seeds.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "cuda/decode_internal.cuh"
#include "gpu_test_util.cuh"
#include "kvpack/error.h"
#include "kvpack/parallel.h"

namespace kvpack::test {
namespace {

// Every format with a paged layout; KVPACK_TEST_FORMATS (a comma list, e.g. "fp8") narrows the tests that loop over
// them to those (a device call that changed one format's kernels re-tests it alone).
std::vector<Format> paged_formats() {
  std::vector<Format> only;
  if (const char* env = std::getenv("KVPACK_TEST_FORMATS"); env && *env) only = parse_format_list(env);
  std::vector<Format> out;
  for (const auto& f : all_formats())
    if (paged_format_supported(f.id) && (only.empty() || std::find(only.begin(), only.end(), f.id) != only.end()))
      out.push_back(f.id);
  return out;
}

// ---------------------------------------------------------------- write path: byte-exact vs the CPU encoder
// The write of n tokens (device K/V inputs and slots) into device pools of num_pages pages.
WriteArgs device_write(const FormatParams& params, const DevBuf<uint16_t>& k, const DevBuf<uint16_t>& v,
                       const DevBuf<int32_t>& slots, int n, DevBuf<uint8_t>& k_pool, DevBuf<uint8_t>& v_pool,
                       int64_t num_pages, int32_t* status) {
  return {.k = k.p, .v = v.p, .slot_mapping = slots.p, .num_tokens = n, .k_pool = k_pool.p, .v_pool = v_pool.p,
          .num_pages = num_pages, .params = params, .status = status};
}
// Decode attention over a device batch's pools through `table` (query q, output out, workspace ws); no LSE, status,
// format parameters or sinks: callers add what they test.
DecodeArgs device_decode(const DevBatch& d, int64_t num_pages, PageTableView table, const uint16_t* q, uint16_t* out,
                         void* ws) {
  DecodeArgs a;
  a.q = q;
  a.k_pool = d.k_pool.p;
  a.v_pool = d.v_pool.p;
  a.num_pages = num_pages;
  a.table = table;
  a.out = out;
  a.workspace = ws;
  return a;
}
// The write of host K/V tokens at `slots` into the device pools kp / vp (pb's pages, layout l, pb's parameters),
// synchronised; the launch's status word into `status`.
void write_tokens(const PagedLayout& l, const PagedBatch& pb, const std::vector<uint16_t>& k,
                  const std::vector<uint16_t>& v, const std::vector<int32_t>& slots, DevBuf<uint8_t>& kp,
                  DevBuf<uint8_t>& vp, int32_t& status) {
  DevBuf<uint16_t> dk(k), dv(v);
  DevBuf<int32_t> ds(slots), st(std::vector<int32_t>{0});
  DevParams dp(pb);
  write_kv(l, device_write(dp.params(), dk, dv, ds, static_cast<int>(slots.size()), kp, vp, pb.num_pages, st.p));
  CUDA_OK(cudaDeviceSynchronize());
  status = st.download()[0];
}

// One ragged prefill-like launch (a 1-token sequence, a partial last page, padding slots with garbage data between
// tokens) written on the GPU and by the CPU encoder: the pools must be equal byte for byte.
void check_write_byte_exact(Format f, int D, int P, int H, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << format_name(f) << " D=" << D << " P=" << P << " H=" << H);
  const PagedLayout l = make_paged_layout(f, P, H, D);
  // prefill-like ragged batch incl. a 1-token sequence and a partial last page
  std::vector<int64_t> lens{1, P - 1, 3 * P + 5, 200};
  PagedBatch pb = make_batch(l, lens, rng);
  // padding slots interleaved: the kernel must skip them
  std::vector<int32_t> slots = pb.slots;
  std::vector<uint16_t> k = pb.k, v = pb.v;
  const size_t tok_elems = size_t(H) * D;
  std::vector<int32_t> slots2, sinks2;
  std::vector<uint16_t> k2, v2;
  const bool has_sinks = !pb.sink_slots.empty();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (i % 7 == 3) {  // a padding token with garbage data
      slots2.push_back(-1);
      sinks2.push_back(-1);
      for (size_t e = 0; e < tok_elems; ++e) {
        k2.push_back(0x7fc0);
        v2.push_back(0x7fc0);
      }
    }
    slots2.push_back(slots[i]);
    sinks2.push_back(has_sinks ? pb.sink_slots[i] : -1);
    k2.insert(k2.end(), k.begin() + i * tok_elems, k.begin() + (i + 1) * tok_elems);
    v2.insert(v2.end(), v.begin() + i * tok_elems, v.begin() + (i + 1) * tok_elems);
  }
  DevBuf<uint8_t> kp(pb.k_pool.size()), vp(pb.v_pool.size());
  kp.fill_bytes(0xA5);
  vp.fill_bytes(0xA5);
  DevBuf<uint16_t> dk(k2), dv(v2);
  DevBuf<int32_t> ds(slots2), status(std::vector<int32_t>{0}), dsink(sinks2);
  DevParams dp(pb);
  WriteArgs a = device_write(dp.params(), dk, dv, ds, static_cast<int>(slots2.size()), kp, vp, pb.num_pages, status.p);
  // Sink pools: poisoned, then only the sink slots of the batch written (compared with the expected pool).
  const size_t sink_elems = pb.k_sinks.size();
  DevBuf<uint16_t> ksk(sink_elems), vsk(sink_elems);
  std::vector<uint16_t> exp_k(sink_elems, 0xA5A5), exp_v(sink_elems, 0xA5A5);
  if (has_sinks) {
    ksk.fill_bytes(0xA5);
    vsk.fill_bytes(0xA5);
    const size_t te = size_t(H) * D;
    for (size_t i = 0; i < pb.sink_slots.size(); ++i) {
      if (pb.sink_slots[i] < 0) continue;
      std::copy_n(pb.k.begin() + i * te, te, exp_k.begin() + size_t(pb.sink_slots[i]) * te);
      std::copy_n(pb.v.begin() + i * te, te, exp_v.begin() + size_t(pb.sink_slots[i]) * te);
    }
    a.sink_slot_mapping = dsink.p;
    a.k_sinks = ksk.p;
    a.v_sinks = vsk.p;
    a.num_sink_rows = static_cast<int64_t>(pb.sink_rows.size());
  }
  write_kv(l, a);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(kp.download().data(), pb.k_pool.data(), pb.k_pool.size()));
  EXPECT_TRUE(bits_equal(vp.download().data(), pb.v_pool.data(), pb.v_pool.size()));
  if (has_sinks) {
    EXPECT_EQ(ksk.download(), exp_k);
    EXPECT_EQ(vsk.download(), exp_v);
  }
  EXPECT_EQ(status.download()[0], 0);
}

TEST(PagedWriteGpu, ByteExactVsCpuEncoder) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(1234);
  for (Format f : paged_formats())
    for (int D : {64, 128})
      for (int P : {16, 32, 64, 128})
        for (int H : {1, 3, 8}) check_write_byte_exact(f, D, P, H, rng);
}

// The q formats' small kernel (decode steps, v60) at every launch size: the same launches with the small kernel
// taking all of them, in tiles of 2 and 8 tokens, and in the tile chosen per launch (v61).
TEST(PagedWriteGpu, ByteExactThroughTheSmallKernel) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(4321);
  const int saved_max = write_small_max(), saved_tile = write_small_tokens();
  write_small_max() = 1 << 20;
  for (int tile : {2, 8, 0}) {  // 0: the tile chosen per launch (small_tile)
    write_small_tokens() = tile;
    for (Format f : {Format::q4, Format::q3_5, Format::q3})
      for (int D : {64, 128})
        for (int P : {16, 128})
          for (int H : {1, 3}) check_write_byte_exact(f, D, P, H, rng);
  }
  write_small_max() = saved_max;
  write_small_tokens() = saved_tile;
}

// And the other way round: the same launches with the small kernel capped at 1 token, so that every launch of
// 2-511 tokens takes kRows (by default, since v62, only those whose small grid would not fit 1.5 waves do).
TEST(PagedWriteGpu, ByteExactThroughTheRowsKernel) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(4322);
  const int saved_max = write_small_max();
  write_small_max() = 1;
  for (Format f : {Format::q4, Format::q3_5, Format::q3})
    for (int D : {64, 128})
      for (int P : {16, 128})
        for (int H : {1, 3}) check_write_byte_exact(f, D, P, H, rng);
  write_small_max() = saved_max;
}

TEST(PagedWriteGpu, DecodeStepOneTokenPerSequence) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(77);
  // q formats take a separate kernel for launches of <= 8 tokens (v60), in tiles of 2, 4 or 8 tokens per CTA: every
  // tile, launches of 1-8 tokens (partial tiles), a padding slot among them, head_dim 64 and 128.
  const int saved_tile = write_small_tokens();
  const std::vector<std::vector<int64_t>> batches{{33}, {5, 16}, {5, 16, 17}, {5, 16, 17, 40}, {1, 2, 3, 4, 5, 6, 7},
                                                  {9, 31, 1, 64, 100, 15, 16, 2}};
  for (int tile : {2, 4, 8}) {
    write_small_tokens() = tile;
    for (Format f : paged_formats())
      for (int D : {64, 128})
        for (const std::vector<int64_t>& lens : batches) {
          if (!format_info(f).calibrated && tile != 8) continue;  // the tile matters to the q formats only
          const PagedLayout l = make_paged_layout(f, 16, 4, D);
          PagedBatch pb = make_batch(l, lens, rng);
          DevBuf<uint8_t> kp(pb.k_pool), vp(pb.v_pool);
          // The reference: append one more token to each sequence at position len (pages have room: extra pages
          // used); with 3 or more sequences, the second one's token is padding (slot -1: nothing written).
          std::vector<int32_t> slots;
          int32_t spare = static_cast<int32_t>(pb.num_pages) - 1;
          for (size_t b = 0; b < pb.lens.size(); ++b) {
            const int64_t pos = pb.lens[b];
            const int64_t np = (pos + 15) / 16;
            const int32_t page = pos % 16 ? pb.indices[pb.indptr[b] + np - 1] : spare--;
            slots.push_back(lens.size() >= 3 && b == 1 ? -1 : page * 16 + static_cast<int32_t>(pos % 16));
          }
          auto nk = random_bf16(slots.size() * 4 * D, rng), nv = random_bf16(slots.size() * 4 * D, rng);
          paged_write_ref(l, pb.k_pool.data(), pb.v_pool.data(), pb.num_pages, nk.data(), nv.data(), slots.data(),
                          static_cast<int>(slots.size()), pb.host_params());
          int32_t status = -1;  // must come back 0
          write_tokens(l, pb, nk, nv, slots, kp, vp, status);
          EXPECT_TRUE(bits_equal(kp.download().data(), pb.k_pool.data(), pb.k_pool.size()))
              << format_name(f) << " D " << D << " tokens " << lens.size() << " tile " << tile;
          EXPECT_TRUE(bits_equal(vp.download().data(), pb.v_pool.data(), pb.v_pool.size()))
              << format_name(f) << " D " << D << " tokens " << lens.size() << " tile " << tile;
          EXPECT_EQ(status, 0);
        }
  }
  write_small_tokens() = saved_tile;
}

TEST(PagedWriteGpu, OutOfRangeSlotIsReportedAndNeverWritten) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(5);
  const PagedLayout l = make_paged_layout(Format::bf16, 16, 2, 64);
  const int64_t pages = 4;
  // The pool is followed by a guard region that must stay untouched.
  const size_t pool_bytes = size_t(pages * l.page_bytes()), guard = 1 << 16;
  DevBuf<uint8_t> kp(pool_bytes + guard), vp(pool_bytes + guard);
  kp.fill_bytes(0x5a);
  vp.fill_bytes(0x5a);
  auto k = random_bf16(3 * 2 * 64, rng), v = random_bf16(3 * 2 * 64, rng);
  DevBuf<uint16_t> dk(k), dv(v);
  DevBuf<int32_t> ds(std::vector<int32_t>{0, int32_t(pages * 16), int32_t(pages * 16 + 1000)});
  DevBuf<int32_t> status(std::vector<int32_t>{0});
  const WriteArgs a = device_write(FormatParams{}, dk, dv, ds, 3, kp, vp, pages, status.p);
  write_kv(l, a);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(status.download()[0] & 1, 1);
  auto hk = kp.download();
  for (size_t i = pool_bytes; i < hk.size(); ++i) ASSERT_EQ(hk[i], 0x5a) << "guard byte " << i << " written";
  // Null arguments are errors, not crashes.
  WriteArgs bad = a;
  bad.slot_mapping = nullptr;
  EXPECT_THROW(write_kv(l, bad), Error);
  bad = a;
  bad.k_pool = nullptr;
  EXPECT_THROW(write_kv(l, bad), Error);
}

// The q formats' small launch (<= 8 tokens, its own kernel): an out-of-range slot is reported, nothing outside the
// pool is written, and the launch's other tokens are still written as the CPU encoder writes them.
TEST(PagedWriteGpu, OutOfRangeSlotInASmallQLaunch) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(9);
  for (Format f : {Format::q4, Format::q3_5, Format::q3}) {
    const PagedLayout l = make_paged_layout(f, 16, 2, 128);
    PagedBatch pb = make_batch(l, {20}, rng);
    const int32_t end = static_cast<int32_t>(pb.num_pages * 16);
    const std::vector<int32_t> slots{pb.slots[3], end, end + 1000, pb.slots[17]};
    auto nk = random_bf16(slots.size() * 2 * 128, rng), nv = random_bf16(slots.size() * 2 * 128, rng);
    // The device pools: the batch's cache, then a guard region.
    const size_t pool_bytes = pb.k_pool.size(), guard = 1 << 14;
    std::vector<uint8_t> hk0(pool_bytes + guard, 0x5a), hv0(pool_bytes + guard, 0x5a);
    std::copy(pb.k_pool.begin(), pb.k_pool.end(), hk0.begin());
    std::copy(pb.v_pool.begin(), pb.v_pool.end(), hv0.begin());
    DevBuf<uint8_t> kp(hk0), vp(hv0);
    // The reference writes only the in-range tokens (tokens 3 and 17 overwritten with new values).
    const std::vector<int32_t> ref_slots{pb.slots[3], -1, -1, pb.slots[17]};
    paged_write_ref(l, pb.k_pool.data(), pb.v_pool.data(), pb.num_pages, nk.data(), nv.data(), ref_slots.data(),
                    static_cast<int>(ref_slots.size()), pb.host_params());
    int32_t status = 0;  // must come back with bit 0 set
    write_tokens(l, pb, nk, nv, slots, kp, vp, status);
    EXPECT_EQ(status & 1, 1) << format_name(f);
    const auto hk = kp.download(), hv = vp.download();
    EXPECT_TRUE(bits_equal(hk.data(), pb.k_pool.data(), pool_bytes)) << format_name(f);
    EXPECT_TRUE(bits_equal(hv.data(), pb.v_pool.data(), pool_bytes)) << format_name(f);
    for (size_t i = pool_bytes; i < hk.size(); ++i) {
      ASSERT_EQ(hk[i], 0x5a) << format_name(f) << " guard byte " << i << " written";
      ASSERT_EQ(hv[i], 0x5a) << format_name(f) << " guard byte " << i << " written";
    }
  }
}

// ---------------------------------------------------------------- dequantiser: bit-exact vs the CPU decoder
TEST(PagedDequantGpu, BitExactVsCpuDecoder) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(99);
  for (Format f : paged_formats())
    for (int D : {64, 128}) {
      const PagedLayout l = make_paged_layout(f, 32, 3, D);
      PagedBatch pb = make_batch(l, {100, 64}, rng, 0);
      DevBuf<uint8_t> kp(pb.k_pool), vp(pb.v_pool);
      DevParams dp(pb);
      const FormatParams dparams = dp.params();
      for (int is_v = 0; is_v < 2; ++is_v) {
        const size_t n = size_t(pb.num_pages) * 3 * 32 * D;
        DevBuf<float> out(n);
        out.fill_bytes(0xff);  // poisoned: NaN everywhere until written
        dequantize_pages(l, is_v ? vp.p : kp.p, pb.num_pages, is_v, dparams, out.p);
        CUDA_OK(cudaDeviceSynchronize());
        auto got = out.download();
        // Compare only slots that hold tokens (the rest of the pool is poison on both sides, not a format value).
        std::vector<float> ref(D);
        for (size_t t = 0; t < pb.slots.size(); ++t) {
          const int64_t page = pb.slots[t] / 32;
          const int off = pb.slots[t] % 32;
          for (int h = 0; h < 3; ++h) {
            dequant_token_ref(l, is_v ? pb.v_pool.data() : pb.k_pool.data(), page, h, off, is_v, pb.host_params(), ref.data(), true);
            const float* g = got.data() + ((page * 3 + h) * 32 + off) * D;
            ASSERT_TRUE(bits_equal(g, ref.data(), sizeof(float) * D))
                << format_name(f) << " D=" << D << " token " << t << " head " << h;
          }
        }
      }
    }
}

// ---------------------------------------------------------------- decode attention vs the fp64 reference
struct AttnResult {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  int32_t status = 0;
};

AttnResult run_attention(const PagedBatch& pb, const DevBatch& db, const std::vector<uint16_t>& q, int qo_heads,
                         bool csr, int splits, int stages, int64_t max_context = 0, bool sinks = true, int leaf = -1) {
  const int batch = static_cast<int>(pb.lens.size());
  DecodeShape s{pb.layout.format, qo_heads, pb.layout.num_kv_heads, pb.layout.head_dim, pb.layout.page_size};
  int64_t maxlen = 1;
  for (auto l : pb.lens) maxlen = std::max(maxlen, l);
  if (max_context == 0) max_context = maxlen;
  DecodePlan plan =
      splits > 0 ? plan_decode_with(s, batch, max_context, splits, stages, leaf) : plan_decode(s, batch, max_context);
  DevBuf<uint16_t> dq(q), out(size_t(batch) * qo_heads * pb.layout.head_dim);
  DevBuf<float> lse(size_t(batch) * qo_heads);
  out.fill_bytes(0xff);  // poison (bf16 NaN)
  lse.fill_bytes(0xff);
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  ws.fill_bytes(0);
  DevBuf<int32_t> status(std::vector<int32_t>{0});
  DecodeArgs a = device_decode(db, pb.num_pages, csr ? db.csr_view(batch) : db.block_view(batch, pb.max_blocks), dq.p,
                               out.p, ws.p);
  a.params = db.params();
  if (sinks) a.sinks = db.sinks();
  a.lse = lse.p;
  a.status = status.p;
  run_decode(plan, a);
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  return {out.download(), lse.download(), status.download()[0]};
}

struct Errors {
  double gpu = 0, plain = 0, lse_gpu = 0, lse_plain = 0;
  double lse_operand = 0;  // lane formats: the LSE error the f16 query operand allows (see compare())
};

Errors compare(const PagedBatch& pb, const std::vector<uint16_t>& q, int qo_heads, const AttnResult& r,
               bool sinks = true) {
  const int batch = static_cast<int>(pb.lens.size());
  const int D = pb.layout.head_dim;
  const size_t n = size_t(batch) * qo_heads * D;
  std::vector<double> ref(n), plain(n), lref(size_t(batch) * qo_heads), lplain(size_t(batch) * qo_heads);
  const double sm = 1.0 / std::sqrt(double(D));
  auto view = pb.csr_view();
  const SinkView sv = pb.host_sinks();
  const SinkView* svp = sinks ? &sv : nullptr;
  decode_attention_ref(pb.layout, pb.k_pool.data(), pb.v_pool.data(), view, q.data(), qo_heads, sm,
                       pb.host_params(), ref.data(), lref.data(), false, svp);
  decode_attention_ref(pb.layout, pb.k_pool.data(), pb.v_pool.data(), view, q.data(), qo_heads, sm,
                       pb.host_params(), plain.data(), lplain.data(), true, svp);
  double num_g = 0, num_p = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = bf16_to_f32(r.out[i]);
    EXPECT_TRUE(std::isfinite(g)) << "output element " << i << " not written or not finite";
    num_g += (g - ref[i]) * (g - ref[i]);
    num_p += (plain[i] - ref[i]) * (plain[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  Errors e;
  e.gpu = std::sqrt(num_g / std::max(den, 1e-300));
  e.plain = std::sqrt(num_p / std::max(den, 1e-300));
  for (size_t i = 0; i < lref.size(); ++i) {
    if (std::isinf(lref[i])) {
      EXPECT_TRUE(std::isinf(r.lse[i]) && r.lse[i] < 0) << "lse of an empty sequence must be -inf";
      continue;
    }
    e.lse_gpu = std::max(e.lse_gpu, std::abs(r.lse[i] - lref[i]));
    e.lse_plain = std::max(e.lse_plain, std::abs(lplain[i] - lref[i]));
  }
  if (lane_bits_x2(pb.layout.format)) {
    // q4 / q3 run on the f16 tensor cores with the query folded into f16 operands (unit roundoff 2^-11 per
    // element; src/cuda/decode_lean.cuh), where the plain implementation keeps fp32: a score moves by at most
    // 2^-11 sum_d |q_d k_d| sm, and the LSE by at most the largest such move. The bound is computed in the model's
    // basis on the dequantised keys (the rounding happens in the calibrated basis, of the same scale).
    // On all threads, in chunks of 256 tokens of one sequence (a max: the same whatever the order).
    const int H = pb.layout.num_kv_heads, group = qo_heads / H, P = pb.layout.page_size;
    constexpr int64_t kChunk = 256;
    std::vector<std::pair<int, int64_t>> chunks;  // (sequence, first token)
    for (int b = 0; b < batch; ++b)
      for (int64_t t = 0; t < pb.lens[b]; t += kChunk) chunks.emplace_back(b, t);
    std::vector<double> chunk_max(chunks.size(), 0.0);
    const FormatParams params = pb.host_params();
    parallel_items(static_cast<int64_t>(chunks.size()), hardware_threads(), [&](int64_t c) {
      const auto [b, t0] = chunks[size_t(c)];
      std::vector<float> kd(D);
      for (int64_t t = t0; t < std::min(pb.lens[b], t0 + kChunk); ++t) {
        const int64_t page = pb.indices[pb.indptr[b] + t / P];
        for (int h = 0; h < H; ++h) {
          dequant_token_ref(pb.layout, pb.k_pool.data(), page, h, static_cast<int>(t % P), false, params, kd.data());
          for (int j = 0; j < group; ++j) {
            const uint16_t* qr = q.data() + (size_t(b) * qo_heads + h * group + j) * D;
            double s1 = 0;
            for (int d = 0; d < D; ++d) s1 += std::abs(double(bf16_to_f32(qr[d])) * kd[d]);
            chunk_max[size_t(c)] = std::max(chunk_max[size_t(c)], std::ldexp(s1 * sm, -11));
          }
        }
      }
    });
    for (double m : chunk_max) e.lse_operand = std::max(e.lse_operand, m);
  }
  return e;
}

void expect_close(const Errors& e) {
  // Within 2x the error of a plain same-precision implementation (fp32 math, bf16 output) plus a small floor.
  EXPECT_LE(e.gpu, 2.0 * e.plain + 1e-4) << "gpu " << e.gpu << " plain " << e.plain;
  EXPECT_LE(e.lse_gpu, 4.0 * e.lse_plain + 1e-4 + e.lse_operand)
      << "lse gpu " << e.lse_gpu << " plain " << e.lse_plain << " f16 operand bound " << e.lse_operand;
}

TEST(DecodeGpu, RandomShapesVsFp64Reference) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(2024);
  struct Case {
    int qo, kv, D, P;
  };
  const std::vector<Case> cases{{32, 8, 128, 16}, {8, 1, 128, 64}, {9, 3, 64, 16}, {4, 4, 64, 32},
                                {16, 2, 128, 128}, {6, 3, 128, 32}, {7, 1, 64, 16}, {40, 8, 128, 16}};
  for (Format f : paged_formats())
    for (const auto& c : cases) {
      SCOPED_TRACE(::testing::Message() << format_name(f) << " " << c.qo << "q/" << c.kv << "kv D=" << c.D
                                        << " P=" << c.P);
      const PagedLayout l = make_paged_layout(f, c.P, c.kv, c.D);
      std::uniform_int_distribution<int> len_d(1, 3000);
      std::vector<int64_t> lens{1, c.P, c.P + 1, 512, 513, len_d(rng), len_d(rng)};
      PagedBatch pb = make_batch(l, lens, rng);
      DevBatch db(pb);
      auto q = random_bf16(lens.size() * c.qo * c.D, rng, 2.0f);  // larger q: peakier softmax
      for (bool csr : {true, false}) {
        AttnResult r = run_attention(pb, db, q, c.qo, csr, 0, 0);
        EXPECT_EQ(r.status, 0);
        expect_close(compare(pb, q, c.qo, r));
      }
      if (!pb.sink_rows.empty()) {  // the same cache without its sink pool: first tokens read from their codes
        AttnResult r = run_attention(pb, db, q, c.qo, true, 0, 0, 0, false);
        EXPECT_EQ(r.status, 0);
        expect_close(compare(pb, q, c.qo, r, false));
      }
    }
}

TEST(DecodeGpu, LongContext128k) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(128);
  for (Format f : paged_formats()) {
    const PagedLayout l = make_paged_layout(f, 64, 1, 128);
    std::vector<int64_t> lens{131072, 77777, 1};
    PagedBatch pb = make_batch(l, lens, rng);
    DevBatch db(pb);
    auto q = random_bf16(lens.size() * 8 * 128, rng, 2.0f);
    AttnResult r = run_attention(pb, db, q, 8, true, 0, 0);
    EXPECT_EQ(r.status, 0);
    expect_close(compare(pb, q, 8, r));
  }
}

TEST(DecodeGpu, EmptySequenceGivesZeroAndMinusInfLse) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(3);
  const PagedLayout l = make_paged_layout(Format::bf16, 16, 2, 64);
  PagedBatch pb = make_batch(l, {0, 20, 0}, rng);
  DevBatch db(pb);
  auto q = random_bf16(3 * 4 * 64, rng);
  for (bool csr : {true, false}) {
    AttnResult r = run_attention(pb, db, q, 4, csr, 0, 0);
    for (int i = 0; i < 4 * 64; ++i) EXPECT_EQ(r.out[i], 0) << i;
    expect_close(compare(pb, q, 4, r));
  }
}

// ---------------------------------------------------------------- determinism: bit for bit
TEST(DecodeGpu, BitwiseIdenticalAcrossPlansBatchOrderAndRuns) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(31337);
  for (Format f : paged_formats())
  for (int kv : f == Format::fp8 ? std::vector<int>{2, 1} : std::vector<int>{2}) {
    // fp8 also with one kv head: the shape fp8_lean_default puts on the lean kernel (sm_90).
    SCOPED_TRACE(::testing::Message() << format_name(f) << " kv " << kv);
    const PagedLayout l = make_paged_layout(f, 16, kv, 128);
    // 20001 tokens = 40 chunks: three fold groups (16, 16, 8) whose chunks are spread over the CTAs differently
    // by every split count below (v21's two-level fold); 8192 = 16 chunks is one group, folded directly.
    std::vector<int64_t> lens{5000, 1, 2049, 511, 8192, 20001};
    PagedBatch pb = make_batch(l, lens, rng);
    DevBatch db(pb);
    // group 4 and group 8, whose tensor-core kernels come in two register variants picked by grid size (v12):
    // splits 1..64 x 2 kv heads x 5 sequences span 10..640 CTAs, on both sides of the GPU's SM count.
    for (int qo : {4 * kv, 8 * kv}) {
      auto q = random_bf16(lens.size() * qo * 128, rng, 2.0f);
      AttnResult base = run_attention(pb, db, q, qo, true, 1, 2);
      expect_close(compare(pb, q, qo, base));
      for (int splits : {1, 2, 3, 7, 16, 64})
        for (int stages : {2, 3, 4, 6}) {
          for (bool csr : {true, false}) {
            AttnResult r = run_attention(pb, db, q, qo, csr, splits, stages, 32768);
            ASSERT_EQ(r.out, base.out) << "splits " << splits << " stages " << stages << " csr " << csr;
            ASSERT_TRUE(bits_equal(r.lse.data(), base.lse.data(), r.lse.size() * 4));
          }
        }
      // A plan for a much longer max_context: the lean kernel (q formats; fp8 at one kv head) then runs one warp per chunk instead of one CTA per
      // chunk (decode_lean.cuh, leaf mode), with the same bits.
      {
        AttnResult r = run_attention(pb, db, q, qo, true, 4, 3, int64_t{1} << 20);
        ASSERT_EQ(r.out, base.out) << "max_context 2^20";
        ASSERT_TRUE(bits_equal(r.lse.data(), base.lse.data(), r.lse.size() * 4));
      }
      // The lean kernel's mode chosen by the plan (DecodePlan::leaf): leaf and warp mode, same bits; each mode also on
      // the general kernel instance instead of its own (q formats: leaf-only, warp-only; decode_lean.cuh).
      if (std::string(decode_kernel_name(f)) == "lean") {
        int occ[2][2] = {};  // [leaf][general]
        for (int leaf : {0, 1})
          for (int general : {0, 1}) {
            lean_force_general_instance(general == 1);
            AttnResult r = run_attention(pb, db, q, qo, leaf == 0, 8, 3, 0, true, leaf);
            lean_force_general_instance(false);
            ASSERT_EQ(r.out, base.out) << "leaf " << leaf << " general " << general;
            ASSERT_TRUE(bits_equal(r.lse.data(), base.lse.data(), r.lse.size() * 4));
            const LeanLaunchInfo li = lean_last_launch();
            EXPECT_EQ(li.leaf, leaf);
            if (general == 1) EXPECT_EQ(li.instance, 0) << "the general instance, forced";
            if (general == 0 && leaf == 1) EXPECT_EQ(li.instance, 1) << "leaf mode's own instance";
            occ[leaf][general] = li.ctas_per_sm;
          }
        // At least as many CTAs per SM (H100, head_dim 128: 4 against 3 for the q formats' own instances).
        EXPECT_GE(occ[1][0], occ[1][1]) << "the leaf-only instance's CTAs per SM";
        EXPECT_GE(occ[0][0], occ[0][1]) << "the warp-only instance's CTAs per SM";
        EXPECT_GT(occ[1][0], 0);
        EXPECT_GT(occ[0][0], 0);
      }
      // The fallback plan and repeated runs.
      for (int rep = 0; rep < 3; ++rep) {
        AttnResult r = run_attention(pb, db, q, qo, true, 0, 0);
        ASSERT_EQ(r.out, base.out) << "run " << rep;
      }
      // Batch composition: a permuted batch (same pool, permuted table rows) gives the permuted outputs bit for bit,
      // and a sequence alone gives the same bits as inside the batch. 72 rows (each sequence 12 times, pages shared)
      // make the lean merge grid large enough for two merge slices per CTA at group 8 (four at group 4 and in the base
      // run: launch_lean's slice count depends on the grid; same bits; every count: LeanMergeSliceCountsGiveTheSameBits).
      auto rows_of = [&](const std::vector<int>& perm, std::vector<uint16_t>& q2) {
        PagedBatch pb2 = pb;
        pb2.lens.clear();
        pb2.indptr = {0};
        pb2.indices.clear();
        pb2.last_page_len.clear();
        pb2.seq_lens.clear();
        pb2.block_table.clear();
        pb2.sink_rows.clear();
        q2.clear();
        for (int i : perm) {
          pb2.lens.push_back(pb.lens[i]);
          for (int j = pb.indptr[i]; j < pb.indptr[i + 1]; ++j) pb2.indices.push_back(pb.indices[j]);
          pb2.indptr.push_back(static_cast<int32_t>(pb2.indices.size()));
          pb2.last_page_len.push_back(pb.last_page_len[i]);
          pb2.seq_lens.push_back(pb.seq_lens[i]);
          if (!pb.sink_rows.empty()) pb2.sink_rows.push_back(pb.sink_rows[i]);
          pb2.block_table.insert(pb2.block_table.end(), pb.block_table.begin() + size_t(i) * pb.max_blocks,
                                 pb.block_table.begin() + size_t(i + 1) * pb.max_blocks);
          q2.insert(q2.end(), q.begin() + size_t(i) * qo * 128, q.begin() + size_t(i + 1) * qo * 128);
        }
        return pb2;
      };
      std::vector<int> repeated;
      for (int k = 0; k < 72; ++k) repeated.push_back(k % 6);
      for (const std::vector<int>& perm : {std::vector<int>{3, 0, 5, 4, 2, 1}, repeated}) {
        std::vector<uint16_t> q2;
        PagedBatch pb2 = rows_of(perm, q2);
        DevBatch db2(pb2);
        for (int splits : {0, 5}) {
          AttnResult r = run_attention(pb2, db2, q2, qo, splits % 2 == 0, splits, 3, perm.size() > 6 ? 20001 : 0);
          for (size_t k = 0; k < perm.size(); ++k)
            ASSERT_TRUE(bits_equal(r.out.data() + k * qo * 128, base.out.data() + size_t(perm[k]) * qo * 128, qo * 128 * 2))
                << "row " << k << " of " << perm.size();
        }
      }
    }
  }
}

// The lean kernel's instances at head_dim 64 (q formats, SmolLM2's 9q/3kv): leaf and warp mode, each on the general
// instance, on the launcher's choice, and with the warp-only instance forced (4 CTAs per SM against the general one's
// 3 on the H100 and H200; measured 1.05-1.12x faster there in warp mode, bench/NOTES.md v54; the launcher's default
// in warp mode since this test passed, v56) give the same bits as a plain plan, which is checked against fp64. A
// 20,001-token sequence is 40 chunks (three fold groups), so warp mode's 8 splits give warps several chunks each.
TEST(DecodeGpu, LeanInstancesAtHeadDim64GiveTheSameBits) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(2718);
  for (Format f : {Format::q4, Format::q3_5, Format::q3}) {
    SCOPED_TRACE(format_name(f));
    const PagedLayout l = make_paged_layout(f, 16, 3, 64);
    const std::vector<int64_t> lens{5000, 1, 2049, 20001, 512};
    PagedBatch pb = make_batch(l, lens, rng);
    DevBatch db(pb);
    const int qo = 9;
    auto q = random_bf16(lens.size() * qo * 64, rng, 2.0f);
    AttnResult base = run_attention(pb, db, q, qo, true, 1, 2);
    expect_close(compare(pb, q, qo, base));
    for (int leaf : {0, 1})
      for (int inst : {0, 1, 2}) {  // 0: the general instance forced, 1: the launcher's choice, 2: warp-only forced
        lean_force_general_instance(inst == 0);
        lean_force_warp_only_instance(inst == 2);
        AttnResult r = run_attention(pb, db, q, qo, leaf == 0, 8, 3, 0, true, leaf);
        lean_force_general_instance(false);
        lean_force_warp_only_instance(false);
        ASSERT_EQ(r.status, 0);
        ASSERT_EQ(r.out, base.out) << "leaf " << leaf << " instance choice " << inst;
        ASSERT_TRUE(bits_equal(r.lse.data(), base.lse.data(), r.lse.size() * 4)) << "leaf " << leaf << " " << inst;
        const LeanLaunchInfo li = lean_last_launch();
        EXPECT_EQ(li.leaf, leaf);
        if (inst == 0) EXPECT_EQ(li.instance, 0) << "the general instance, forced";
        if (inst != 0 && leaf == 1) EXPECT_EQ(li.instance, 1) << "leaf mode's own instance";
        if (inst == 2 && leaf == 0) EXPECT_EQ(li.instance, 2) << "the warp-only instance, forced (H100 / H200)";
      }
  }
}

// The lean merge kernel's slice counts (1, 2, 4, 8, 16 fold groups per round, forced for the test) give the same bits:
// a 140,001-token sequence is 274 chunks = 18 fold groups (two rounds even at 16 slices, 18 at one), beside
// sequences of one group and of one token; head_dim 64 (one channel per thread) and 128 (two).
TEST(DecodeGpu, LeanMergeSliceCountsGiveTheSameBits) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(4711);
  for (Format f : paged_formats()) {
    if (std::string(decode_kernel_name(f)) != "lean") continue;
    for (int D : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << format_name(f) << " D=" << D);
      const PagedLayout l = make_paged_layout(f, 16, 1, D);
      const std::vector<int64_t> lens = D == 64 ? std::vector<int64_t>{140001, 5000, 1} : std::vector<int64_t>{20001, 1, 9000};
      PagedBatch pb = make_batch(l, lens, rng);
      DevBatch db(pb);
      for (int qo : {4, 8}) {
        auto q = random_bf16(lens.size() * qo * D, rng, 2.0f);
        lean_force_merge_slices(0);
        AttnResult base = run_attention(pb, db, q, qo, true, 0, 0);
        expect_close(compare(pb, q, qo, base));
        for (int slices : {1, 2, 4, 8, 16}) {
          lean_force_merge_slices(slices);
          AttnResult r = run_attention(pb, db, q, qo, slices % 2 == 0, 0, 0);
          ASSERT_EQ(r.status, 0);
          ASSERT_EQ(r.out, base.out) << "slices " << slices << " qo " << qo;
          ASSERT_TRUE(bits_equal(r.lse.data(), base.lse.data(), r.lse.size() * 4)) << "slices " << slices;
        }
        lean_force_merge_slices(0);
      }
    }
  }
}

// The lean kernel's group-folding instance (LeanInst::kGroup, q formats at head_dim 128, forced for the test): warps
// that own whole fold groups fold their chunks' partials with the merge's first-level arithmetic and store one
// partial per group, which the merge takes as the group's. It must give the bits of the launcher's own plan for every
// warp count per (sequence, kv head) (4: several groups per warp; 16, 64: more warps than groups, the spare ones
// exit), with sequences of one token, of exactly one group (8,192 tokens), one chunk past it, and of 2, 3 and 9 groups
// (the last one short), with a max_context beyond the lengths, and in both table views.
TEST(DecodeGpu, LeanGroupFoldGivesTheSameBits) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(4713);
  for (Format f : paged_formats()) {
    if (std::string(decode_kernel_name(f)) != "lean" || f == Format::fp8) continue;
    SCOPED_TRACE(format_name(f));
    const PagedLayout l = make_paged_layout(f, 16, 2, 128);
    const std::vector<int64_t> lens{20001, 1, 9000, 8192, 8193, 70001};
    PagedBatch pb = make_batch(l, lens, rng);
    DevBatch db(pb);
    for (int qo : {2, 8}) {
      auto q = random_bf16(lens.size() * qo * 128, rng, 2.0f);
      lean_force_group_fold(-1);
      AttnResult base = run_attention(pb, db, q, qo, true, 0, 0);
      lean_force_group_fold(0);
      ASSERT_EQ(base.status, 0);
      expect_close(compare(pb, q, qo, base));
      for (int splits : {4, 16, 64})
        for (int64_t max_context : {int64_t{0}, int64_t{100000}}) {
          lean_force_group_fold(1);
          AttnResult r = run_attention(pb, db, q, qo, splits != 16, splits, 3, max_context, true, 0);
          lean_force_group_fold(0);
          const LeanLaunchInfo li = lean_last_launch();
          ASSERT_EQ(li.instance, 3) << "the group-folding instance, forced";
          ASSERT_EQ(r.status, 0);
          ASSERT_EQ(r.out, base.out) << "qo " << qo << " splits " << splits << " max_context " << max_context;
          ASSERT_TRUE(bits_equal(r.lse.data(), base.lse.data(), r.lse.size() * 4)) << "splits " << splits;
        }
    }
  }
}

// The lean kernel's mixed grid (lean_mixed_chunks: chunks [0, mix) one warp each, the rest one CTA each; forced for the
// test) gives the bits of the launcher's own choice for every split point: mix = 4 (nearly all leaf mode), a split
// inside the longest sequence, one past a shorter sequence's end, and one past every chunk (warp part only); with a
// max_context beyond the lengths (spare chunks of both parts exit), and in both table views.
TEST(DecodeGpu, LeanMixedGridGivesTheSameBits) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(4712);
  for (Format f : paged_formats()) {
    if (std::string(decode_kernel_name(f)) != "lean") continue;
    for (int D : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << format_name(f) << " D=" << D);
      const PagedLayout l = make_paged_layout(f, 16, 2, D);
      const std::vector<int64_t> lens =
          D == 64 ? std::vector<int64_t>{70001, 5000, 1, 33000} : std::vector<int64_t>{20001, 1, 9000};
      PagedBatch pb = make_batch(l, lens, rng);
      DevBatch db(pb);
      for (int qo : {2, 8}) {
        auto q = random_bf16(lens.size() * qo * D, rng, 2.0f);
        lean_force_mix(0);
        AttnResult base = run_attention(pb, db, q, qo, true, 0, 0);
        ASSERT_EQ(base.status, 0);
        expect_close(compare(pb, q, qo, base));
        for (int mix : {4, 12, 20, 40, 1000}) {
          for (int64_t max_context : {int64_t{0}, int64_t{90000}}) {
            lean_force_mix(mix);
            AttnResult r = run_attention(pb, db, q, qo, mix % 8 == 4, 0, 0, max_context);
            lean_force_mix(0);
            ASSERT_EQ(r.status, 0);
            ASSERT_EQ(r.out, base.out) << "mix " << mix << " qo " << qo << " max_context " << max_context;
            ASSERT_TRUE(bits_equal(r.lse.data(), base.lse.data(), r.lse.size() * 4)) << "mix " << mix;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- CUDA graph capture and replay
TEST(DecodeGpu, GraphCaptureAndReplayReadsLengthsOnDevice) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(8);
  const PagedLayout l = make_paged_layout(Format::bf16, 16, 2, 64);
  // 9500 tokens = 19 chunks: two fold groups, so the replays also check that the group counters reset themselves.
  std::vector<int64_t> lens{1000, 9500, 17};
  PagedBatch pb = make_batch(l, lens, rng);
  DevBatch db(pb);
  const int qo = 6, batch = 3;
  auto q = random_bf16(batch * qo * 64, rng);
  DecodeShape s{Format::bf16, qo, 2, 64, 16};
  DecodePlan plan = plan_decode_with(s, batch, 16384, 4, 3);
  DevBuf<uint16_t> dq(q), out(batch * qo * 64);
  DevBuf<float> lse(batch * qo);
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  ws.fill_bytes(0);
  DecodeArgs a = device_decode(db, pb.num_pages, db.block_view(batch, pb.max_blocks), dq.p, out.p, ws.p);
  a.lse = lse.p;
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  run_decode(plan, a, st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  AttnResult direct = run_attention(pb, db, q, qo, false, 4, 3, 16384);
  for (int rep = 0; rep < 3; ++rep) {
    out.fill_bytes(0xff);
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    ASSERT_EQ(out.download(), direct.out) << "replay " << rep;
  }
  // Shorter sequences written into the same device arrays: the replay must follow them (no stale split plan).
  PagedBatch pb_short = pb;
  pb_short.lens = {999, 1, 17};
  pb_short.seq_lens = {999, 1, 17};
  for (int b = 0; b < batch; ++b) {
    const int64_t np = (pb_short.lens[b] + 15) / 16;
    pb_short.last_page_len[b] = static_cast<int32_t>(pb_short.lens[b] - (np - 1) * 16);
  }
  // CSR indptr stays (more pages than needed would change the length): only the block view is used here.
  db.seq_lens.upload(pb_short.seq_lens);
  out.fill_bytes(0xff);
  CUDA_OK(cudaGraphLaunch(exec, st));
  CUDA_OK(cudaStreamSynchronize(st));
  AttnResult direct_short = run_attention(pb_short, db, q, qo, false, 4, 3, 16384);
  EXPECT_EQ(out.download(), direct_short.out);
  // and against the fp64 reference
  PagedBatch pb_ref = pb_short;
  pb_ref.indptr = {0};
  pb_ref.indices.clear();
  for (int b = 0; b < batch; ++b) {
    const int64_t np = (pb_short.lens[b] + 15) / 16;
    for (int64_t j = 0; j < np; ++j) pb_ref.indices.push_back(pb.block_table[size_t(b) * pb.max_blocks + j]);
    pb_ref.indptr.push_back(static_cast<int32_t>(pb_ref.indices.size()));
  }
  expect_close(compare(pb_ref, q, qo, direct_short));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

// ---------------------------------------------------------------- decode_step: the write and the attention in one call
// decode_step must give the pools and the output bits of write_kv then run_decode, whatever runs beside what (q
// formats on sm_90: the query preparation overlaps the write, and must not let the lean kernel read the new token's
// page before the write has finished). Each step overwrites every sequence's last token with new values, so a stale
// read changes the output. Write launches of 1, 3 and 20 tokens (the small kernel; 20 also through kRows), group 8
// and 4, head_dim 64 and 128; the output also against the fp64 reference on the CPU encoder's pools; one case
// captured in a CUDA graph and replayed.
struct StepCase {
  Format f;
  int qo, H, D;
  std::vector<int64_t> lens;
};
void check_decode_step(const StepCase& c, std::mt19937& rng, bool graph) {
  SCOPED_TRACE(::testing::Message() << format_name(c.f) << " " << c.qo << "q/" << c.H << "kv/" << c.D << " batch "
                                    << c.lens.size() << (graph ? " graph" : ""));
  const int P = 16, batch = static_cast<int>(c.lens.size());
  const PagedLayout l = make_paged_layout(c.f, P, c.H, c.D);
  PagedBatch pb = make_batch(l, c.lens, rng);
  DevBatch da(pb), dbb(pb);  // two identical device copies: write_kv + run_decode, decode_step
  // The new token of each sequence at its last position; sequence 1's is padding (-1) when there are >= 3.
  std::vector<int32_t> slots;
  for (int b = 0; b < batch; ++b) {
    const int64_t pos = c.lens[b] - 1;
    slots.push_back(batch >= 3 && b == 1 ? -1 : pb.indices[pb.indptr[b] + pos / P] * P + static_cast<int32_t>(pos % P));
  }
  const size_t te = size_t(c.H) * c.D;
  auto nk = random_bf16(slots.size() * te, rng), nv = random_bf16(slots.size() * te, rng);
  auto q = random_bf16(size_t(batch) * c.qo * c.D, rng);
  DevBuf<uint16_t> dk(nk), dv(nv), dq(q);
  DevBuf<int32_t> ds(slots);
  DecodeShape s{c.f, c.qo, c.H, c.D, P};
  int64_t maxlen = 1;
  for (auto len : c.lens) maxlen = std::max(maxlen, len);
  const DecodePlan plan = plan_decode(s, batch, maxlen);
  // One side's outputs (poisoned), workspace and status, and its write / attention arguments over its pools.
  struct Side {
    DevBuf<uint16_t> out;
    DevBuf<float> lse;
    DevBuf<uint8_t> ws;
    DevBuf<int32_t> status{std::vector<int32_t>{0}};
    WriteArgs w;
    DecodeArgs a;
    Side(size_t out_n, size_t lse_n, size_t ws_n) : out(out_n), lse(lse_n), ws(ws_n) {
      out.fill_bytes(0xff);
      lse.fill_bytes(0xff);
      ws.fill_bytes(0);
    }
  };
  auto side = [&](const DevBatch& d, Side& sd) {
    sd.w = WriteArgs{.k = dk.p, .v = dv.p, .slot_mapping = ds.p, .num_tokens = batch, .k_pool = d.k_pool.p,
                     .v_pool = d.v_pool.p, .num_pages = pb.num_pages, .params = d.params(), .status = sd.status.p};
    sd.a = device_decode(d, pb.num_pages, d.block_view(batch, pb.max_blocks), dq.p, sd.out.p, sd.ws.p);
    sd.a.params = d.params();
    sd.a.sinks = d.sinks();
    sd.a.lse = sd.lse.p;
    sd.a.status = sd.status.p;
  };
  const size_t out_n = size_t(batch) * c.qo * c.D, lse_n = size_t(batch) * c.qo;
  Side sa(out_n, lse_n, plan.workspace_bytes), sb(out_n, lse_n, plan.workspace_bytes);
  side(da, sa);
  side(dbb, sb);
  CUDA_OK(cudaDeviceSynchronize());  // the fills ran on the legacy stream, which `st` does not wait for
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  write_kv(l, sa.w, st);
  run_decode(plan, sa.a, st);
  if (graph) {
    // One eager step first (module load, shared-memory opt-ins, cached device queries: not capturable); it writes the
    // same tokens the replays write again.
    decode_step(l, sb.w, plan, sb.a, st);
    CUDA_OK(cudaStreamSynchronize(st));
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    decode_step(l, sb.w, plan, sb.a, st);
    CUDA_OK(cudaStreamEndCapture(st, &g));
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    for (int rep = 0; rep < 3; ++rep) {
      sb.out.fill_bytes(0xff);
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      ASSERT_EQ(sb.out.download(), sa.out.download()) << "replay " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  } else {
    decode_step(l, sb.w, plan, sb.a, st);
  }
  CUDA_OK(cudaStreamSynchronize(st));
  cudaStreamDestroy(st);
  // The CPU encoder's pools with the new tokens: both sides byte for byte.
  paged_write_ref(l, pb.k_pool.data(), pb.v_pool.data(), pb.num_pages, nk.data(), nv.data(), slots.data(), batch,
                  pb.host_params());
  for (const DevBatch* d : {&da, &dbb}) {
    EXPECT_TRUE(bits_equal(d->k_pool.download().data(), pb.k_pool.data(), pb.k_pool.size()));
    EXPECT_TRUE(bits_equal(d->v_pool.download().data(), pb.v_pool.data(), pb.v_pool.size()));
  }
  const AttnResult ra{sa.out.download(), sa.lse.download(), sa.status.download()[0]};
  const AttnResult rb{sb.out.download(), sb.lse.download(), sb.status.download()[0]};
  EXPECT_EQ(rb.out, ra.out);
  EXPECT_TRUE(bits_equal(rb.lse.data(), ra.lse.data(), ra.lse.size() * sizeof(float)));
  EXPECT_EQ(rb.status, 0);
  EXPECT_EQ(ra.status, 0);
  expect_close(compare(pb, q, c.qo, rb));
}

TEST(DecodeStepGpu, SameBytesAndBitsAsWriteThenDecode) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(606);
  std::vector<int64_t> twenty;
  for (int i = 0; i < 20; ++i) twenty.push_back(5 + static_cast<int64_t>(rng() % 700));
  const std::vector<std::vector<int64_t>> batches{{300}, {37, 2100, 517}, twenty};
  for (Format f : {Format::q4, Format::q3_5, Format::q3, Format::fp8, Format::bf16})
    for (int D : {64, 128})
      for (const auto& [qo, H] : {std::pair{8, 1}, std::pair{12, 3}})
        for (const auto& lens : batches) check_decode_step(StepCase{f, qo, H, D, lens}, rng, false);
  // The 20-token launches through kRows too (by default, since v62, they take the small kernel).
  const int saved_max = write_small_max();
  write_small_max() = 8;
  for (Format f : {Format::q4, Format::q3_5, Format::q3})
    for (int D : {64, 128}) check_decode_step(StepCase{f, 12, 3, D, twenty}, rng, false);
  write_small_max() = saved_max;
  // Graph capture and replay (the replays write the same tokens again: same bytes, same output).
  check_decode_step(StepCase{Format::q4, 8, 1, 128, {4000, 33, 900}}, rng, true);
  check_decode_step(StepCase{Format::q3, 32, 8, 128, twenty}, rng, true);
}

TEST(DecodeStepGpu, BadArgumentsAreErrors) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(607);
  const PagedLayout l = make_paged_layout(Format::q4, 16, 2, 64);
  PagedBatch pb = make_batch(l, {40, 70}, rng);
  DevBatch d(pb), other(pb);
  const DecodePlan plan = plan_decode(DecodeShape{Format::q4, 4, 2, 64, 16}, 2, 100);
  DevBuf<uint16_t> k(random_bf16(2 * 2 * 64, rng)), v(random_bf16(2 * 2 * 64, rng)), q(random_bf16(2 * 4 * 64, rng)),
      out(2 * 4 * 64);
  DevBuf<int32_t> slots(std::vector<int32_t>{pb.slots[39], pb.slots[109]});
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  ws.fill_bytes(0);
  const WriteArgs w{.k = k.p, .v = v.p, .slot_mapping = slots.p, .num_tokens = 2, .k_pool = d.k_pool.p,
                    .v_pool = d.v_pool.p, .num_pages = pb.num_pages, .params = d.params()};
  DecodeArgs a = device_decode(d, pb.num_pages, d.csr_view(2), q.p, out.p, ws.p);
  a.params = d.params();
  // The layout must be the plan's shape.
  EXPECT_THROW(decode_step(make_paged_layout(Format::q4, 32, 2, 64), w, plan, a), Error);
  EXPECT_THROW(decode_step(make_paged_layout(Format::q3, 16, 2, 64), w, plan, a), Error);
  EXPECT_THROW(decode_step(make_paged_layout(Format::q4, 16, 1, 64), w, plan, a), Error);
  // The write must go into the pools the attention reads.
  WriteArgs w2 = w;
  w2.k_pool = other.k_pool.p;
  EXPECT_THROW(decode_step(l, w2, plan, a), Error);
  w2 = w;
  w2.num_pages = pb.num_pages - 1;
  EXPECT_THROW(decode_step(l, w2, plan, a), Error);
  // And the checks of write_kv and run_decode themselves.
  w2 = w;
  w2.slot_mapping = nullptr;
  EXPECT_THROW(decode_step(l, w2, plan, a), Error);
  DecodeArgs a2 = a;
  a2.workspace = nullptr;
  EXPECT_THROW(decode_step(l, w, plan, a2), Error);
  decode_step(l, w, plan, a);
  CUDA_OK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------- bad arguments
TEST(DecodeGpu, BadArgumentsAreErrorsNotCrashes) {
  KVPACK_REQUIRE_GPU();
  std::mt19937 rng(4);
  const PagedLayout l = make_paged_layout(Format::bf16, 16, 2, 64);
  PagedBatch pb = make_batch(l, {40, 70}, rng);
  DevBatch db(pb);
  DecodeShape s{Format::bf16, 4, 2, 64, 16};
  EXPECT_THROW(plan_decode(DecodeShape{Format::bf16, 5, 2, 64, 16}, 2, 100), Error);   // 5 not a multiple of 2
  EXPECT_THROW(plan_decode(DecodeShape{Format::bf16, 18, 2, 64, 16}, 2, 100), Error);  // group 9 > 8
  EXPECT_THROW(plan_decode(DecodeShape{Format::bf16, 4, 2, 96, 16}, 2, 100), Error);   // head_dim 96
  EXPECT_THROW(plan_decode(DecodeShape{Format::bf16, 4, 2, 64, 24}, 2, 100), Error);   // page 24
  DecodePlan plan = plan_decode(s, 2, 100);
  auto q = random_bf16(2 * 4 * 64, rng);
  DevBuf<uint16_t> dq(q), out(2 * 4 * 64);
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  ws.fill_bytes(0);
  DevBuf<int32_t> status(std::vector<int32_t>{0});
  DecodeArgs a = device_decode(db, pb.num_pages, db.csr_view(2), dq.p, out.p, ws.p);
  a.status = status.p;
  DecodeArgs bad = a;
  bad.table.pages = nullptr;
  EXPECT_THROW(run_decode(plan, bad), Error);
  bad = a;
  bad.table.batch = 3;
  EXPECT_THROW(run_decode(plan, bad), Error);
  DecodePlan small = plan;
  small.workspace_bytes = 16;
  EXPECT_THROW(run_decode(small, a), Error);
  bad = a;
  bad.workspace = static_cast<uint8_t*>(a.workspace) + 8;  // the merge stages partials in 16-byte pieces
  EXPECT_THROW(run_decode(plan, bad), Error);
  // The lean kernel's mode: only -1 / 0 / 1, and 0 / 1 only for formats on the lean kernel (this is bf16).
  DecodePlan bad_leaf = plan;
  bad_leaf.leaf = 2;
  EXPECT_THROW(run_decode(bad_leaf, a), Error);
  EXPECT_THROW(plan_decode_with(s, 2, 100, 1, 2, 1), Error);
  EXPECT_THROW(plan_decode_with(DecodeShape{Format::q4, 4, 2, 64, 16}, 2, 100, 4, 3, 2), Error);
  EXPECT_EQ(plan_decode_with(DecodeShape{Format::q4, 4, 2, 64, 16}, 2, 100, 4, 3, 1).leaf, 1);
  // Sequences longer than the plan's max_context: reported, cut, never past the workspace.
  DecodePlan short_plan = plan_decode_with(s, 2, 16, 1, 2);
  DevBuf<uint8_t> ws2(short_plan.workspace_bytes);
  ws2.fill_bytes(0);
  DecodeArgs a2 = a;
  a2.workspace = ws2.p;
  run_decode(short_plan, a2);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(status.download()[0] & 2, 2);
  // q formats: missing calibrated parameters are errors; sink slots on a format without sinks too.
  {
    const PagedLayout lq = make_paged_layout(Format::q4, 16, 2, 64);
    PagedBatch qb = make_batch(lq, {40, 70}, rng);
    DevBatch qd(qb);
    DecodeShape qs{Format::q4, 4, 2, 64, 16};
    DecodePlan qplan = plan_decode(qs, 2, 100);
    DevBuf<uint8_t> qws(qplan.workspace_bytes);
    qws.fill_bytes(0);
    DecodeArgs qa = a;
    qa.k_pool = qd.k_pool.p;
    qa.v_pool = qd.v_pool.p;
    qa.num_pages = qb.num_pages;
    qa.table = qd.csr_view(2);
    qa.workspace = qws.p;
    EXPECT_THROW(run_decode(qplan, qa), Error);  // no params.qk / qv
    qa.params = qd.params();
    qa.sinks = qd.sinks();
    qa.sinks.k = nullptr;
    EXPECT_THROW(run_decode(qplan, qa), Error);  // sink rows without a sink pool
    // A sink row beyond the pool: reported (status 4), that sequence decodes from its codes.
    qa.sinks = qd.sinks();
    qa.sinks.num_rows = 1;  // rows are {1, 0}: sequence 0's row 1 is out of range
    status.upload({0});
    run_decode(qplan, qa);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(status.download()[0] & 4, 4);
    WriteArgs w;
    DevBuf<uint16_t> wk(random_bf16(2 * 64, rng)), wv(random_bf16(2 * 64, rng));
    DevBuf<int32_t> ws_slots(std::vector<int32_t>{0}), sink_slots(std::vector<int32_t>{0});
    w.k = wk.p;
    w.v = wv.p;
    w.slot_mapping = ws_slots.p;
    w.num_tokens = 1;
    w.k_pool = qd.k_pool.p;
    w.v_pool = qd.v_pool.p;
    w.num_pages = qb.num_pages;
    EXPECT_THROW(write_kv(lq, w), Error);  // q4 without parameters
    w.k_pool = db.k_pool.p;
    w.v_pool = db.v_pool.p;
    w.num_pages = pb.num_pages;
    w.sink_slot_mapping = sink_slots.p;
    DevBuf<uint16_t> sk(4 * 2 * 64), sv(4 * 2 * 64);
    w.k_sinks = sk.p;
    w.v_sinks = sv.p;
    w.num_sink_rows = 1;
    EXPECT_THROW(write_kv(l, w), Error);  // bf16 keeps no sinks
  }
  // A page id outside the pool: reported and zero-filled, never read.
  std::vector<int32_t> idx = pb.indices;
  idx[1] = 1 << 30;
  db.indices.upload(idx);
  status.upload({0});
  run_decode(plan, a);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(status.download()[0] & 1, 1);
}

}  // namespace
}  // namespace kvpack::test
