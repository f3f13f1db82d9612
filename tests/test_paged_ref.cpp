// CPU tests of the paged-cache reference: layout arithmetic, page-table views, the reference write path and the
// fp64 reference attention (the oracle the GPU tests trust).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvpack/bf16.h"
#include "kvpack/block/layout.h"
#include "kvpack/block/q_lanes.h"
#include "kvpack/decode.h"
#include "kvpack/error.h"
#include "kvpack/paged.h"

namespace kvpack {
namespace {

TEST(PagedLayout, Bf16BytesAndAlignment) {
  for (int P : {16, 32, 64, 128})
    for (int D : {64, 128})
      for (int H : {1, 3, 8}) {
        PagedLayout l = make_paged_layout(Format::bf16, P, H, D);
        EXPECT_EQ(l.code_bytes_per_token, 2 * D);
        EXPECT_EQ(l.meta_bytes_per_token, 0);
        EXPECT_EQ(l.head_block_bytes, int64_t{P} * 2 * D);
        EXPECT_EQ(l.head_block_bytes % 16, 0);
        EXPECT_GE(l.head_block_bytes, 256);  // >= 256-byte runs per (page, head)
        EXPECT_EQ(l.page_bytes(), l.head_block_bytes * H);
      }
}

TEST(PagedLayout, BadArgumentsNameTheField) {
  auto msg = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([] { make_paged_layout(Format::bf16, 24, 2, 64); }).find("page_size 24"), std::string::npos);
  EXPECT_NE(msg([] { make_paged_layout(Format::bf16, 16, 2, 96); }).find("head_dim 96"), std::string::npos);
  EXPECT_NE(msg([] { make_paged_layout(Format::bf16, 16, 0, 64); }).find("num_kv_heads 0"), std::string::npos);
}

TEST(PageTableViews, CsrAndBlockTableAgree) {
  // Sequences of 0, 1, 16, 17 and 40 tokens, page size 16, pages shuffled.
  const int P = 16;
  std::vector<int64_t> lens{0, 1, 16, 17, 40};
  std::vector<int32_t> indptr{0}, indices, last, block, seq;
  const int maxb = 3;
  int32_t next = 100;
  for (auto l : lens) {
    const int np = static_cast<int>((l + P - 1) / P);
    for (int j = 0; j < np; ++j) indices.push_back(next - 7 * j);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(np ? static_cast<int32_t>(l - (np - 1) * P) : 0);
    for (int j = 0; j < maxb; ++j) block.push_back(j < np ? next - 7 * j : -1);
    seq.push_back(static_cast<int32_t>(l));
    next += 1;
  }
  const int B = static_cast<int>(lens.size());
  PageTableView c = view_of(CsrPageTable{indptr.data(), indices.data(), last.data(), B});
  PageTableView v = view_of(BlockTable{block.data(), seq.data(), maxb, B});
  for (int b = 0; b < B; ++b) {
    EXPECT_EQ(seq_len_of(c, P, b), lens[b]);
    EXPECT_EQ(seq_len_of(v, P, b), lens[b]);
    for (int64_t j = 0; j < (lens[b] + P - 1) / P; ++j) EXPECT_EQ(page_of(c, b, j), page_of(v, b, j));
  }
  // slots_from_csr: token at position p of sequence b lands in its page at p % P.
  auto slots = slots_from_csr(CsrPageTable{indptr.data(), indices.data(), last.data(), B}, P, {4, 4, 1, -1},
                              {0, 39, 0, 5});
  EXPECT_EQ(slots[0], page_of(c, 4, 0) * P + 0);
  EXPECT_EQ(slots[1], page_of(c, 4, 2) * P + 7);
  EXPECT_EQ(slots[2], page_of(c, 1, 0) * P);
  EXPECT_EQ(slots[3], -1);
  EXPECT_THROW(slots_from_csr(CsrPageTable{indptr.data(), indices.data(), last.data(), B}, P, {1}, {16}), Error);
}

TEST(PagedWriteRef, Bf16RoundTripAndPaddingSkipped) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const PagedLayout l = make_paged_layout(Format::bf16, 16, 2, 64);
  const int64_t pages = 3;
  std::vector<uint8_t> kp(pages * l.page_bytes(), 0xA5), vp(pages * l.page_bytes(), 0xA5);
  const int n = 5;
  std::vector<uint16_t> k(n * 2 * 64), v(n * 2 * 64);
  for (auto& x : k) x = f32_to_bf16(nd(rng));
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  std::vector<int32_t> slots{47, -1, 0, 17, 33};
  paged_write_ref(l, kp.data(), vp.data(), pages, k.data(), v.data(), slots.data(), n, {});
  std::vector<float> out(64);
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    for (int h = 0; h < 2; ++h) {
      dequant_token_ref(l, kp.data(), slots[i] / 16, h, slots[i] % 16, false, {}, out.data());
      for (int d = 0; d < 64; ++d) ASSERT_EQ(out[d], bf16_to_f32(k[(i * 2 + h) * 64 + d]));
      dequant_token_ref(l, vp.data(), slots[i] / 16, h, slots[i] % 16, true, {}, out.data());
      for (int d = 0; d < 64; ++d) ASSERT_EQ(out[d], bf16_to_f32(v[(i * 2 + h) * 64 + d]));
    }
  }
  // Slot 1 (page 0, offset 1) was never written: still poison.
  EXPECT_EQ(kp[l.code_bytes_per_token * 1], 0xA5);
  std::vector<int32_t> bad{48};
  EXPECT_THROW(paged_write_ref(l, kp.data(), vp.data(), pages, k.data(), v.data(), bad.data(), 1, {}), Error);
}

// Every supported format: the layout's byte counts are the block table's, and a token's codes and metadata sit
// exactly where docs/FORMATS.md says (codes at t*C, metadata at page_size*C + t*M; q4, q3.5, q3: their lane layout), holding
// the block core's bytes.
TEST(PagedWriteRef, AllFormatsPlaceBlockCoreBytesAtDocumentedOffsets) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  for (const auto& info : all_formats()) {
    const Format f = info.id;
    ASSERT_TRUE(paged_format_supported(f)) << format_name(f);
    for (int D : {64, 128}) {
      const int P = 32, H = 3;
      const PagedLayout l = make_paged_layout(f, P, H, D);
      const auto bl = block::block_layout(f, D);
      EXPECT_EQ(l.lanes, f == Format::q4 || f == Format::q3_5 || f == Format::q3);
      EXPECT_EQ(l.code_bytes_per_token, l.lanes ? bl.bytes() : bl.code_bytes);
      EXPECT_EQ(l.meta_bytes_per_token, l.lanes ? 0 : bl.meta_bytes);
      EXPECT_EQ(l.head_block_bytes % 16, 0);
      EXPECT_GE(l.head_block_bytes, int64_t{P} * bl.bytes());
      const int64_t pages = 2;
      std::vector<uint8_t> kp(pages * l.page_bytes(), 0xA5), vp(pages * l.page_bytes(), 0xA5);
      std::vector<uint16_t> k(H * D), v(H * D);
      for (auto& x : k) x = f32_to_bf16(nd(rng));
      for (auto& x : v) x = f32_to_bf16(nd(rng));
      std::vector<float> ks(H, 0.02f), vs(H, 0.03f);
      FormatParams fp{ks.data(), vs.data()};
      const bool q = info.sink_tokens > 0;
      QHostParams qk, qv;
      if (q) {
        qk = synthetic_q_params(f, false, H, D, 1);
        qv = synthetic_q_params(f, true, H, D, 2);
        fp.qk = qk.table();
        fp.qv = qv.table();
      }
      const int32_t slot = 1 * P + 5;  // page 1, offset 5
      paged_write_ref(l, kp.data(), vp.data(), pages, k.data(), v.data(), &slot, 1, fp);
      for (int h = 0; h < H; ++h) {
        std::vector<float> x(D);
        for (int d = 0; d < D; ++d) x[d] = bf16_to_f32(k[h * D + d]);
        std::vector<uint8_t> codes(bl.code_bytes), meta(bl.meta_bytes + 1);
        if (f == Format::bf16) std::memcpy(codes.data(), &k[h * D], 2 * D);
        if (f == Format::fp8 && D == 64) block::Fp8Block<64>::encode(x.data(), ks[h], codes.data());
        if (f == Format::fp8 && D == 128) block::Fp8Block<128>::encode(x.data(), ks[h], codes.data());
        if (f == Format::int4 && D == 64) block::Int4Block<64, false>::encode(x.data(), codes.data(), meta.data());
        if (f == Format::int4 && D == 128) block::Int4Block<128, false>::encode(x.data(), codes.data(), meta.data());
        if (f == Format::int4h && D == 64) block::Int4Block<64, true>::encode(x.data(), codes.data(), meta.data());
        if (f == Format::int4h && D == 128) block::Int4Block<128, true>::encode(x.data(), codes.data(), meta.data());
        const block::QParams qp = q ? qk.table().head(h, D) : block::QParams{};
        if (f == Format::q4 && D == 64) block::Q4Block<64>::encode(qp, x.data(), codes.data(), meta.data());
        if (f == Format::q4 && D == 128) block::Q4Block<128>::encode(qp, x.data(), codes.data(), meta.data());
        if (f == Format::q3_5 && D == 64) block::Q35Block<64>::encode(qp, x.data(), codes.data(), meta.data());
        if (f == Format::q3_5 && D == 128) block::Q35Block<128>::encode(qp, x.data(), codes.data(), meta.data());
        if (f == Format::q3 && D == 64) block::Q3Block<64>::encode(qp, x.data(), codes.data(), meta.data());
        if (f == Format::q3 && D == 128) block::Q3Block<128>::encode(qp, x.data(), codes.data(), meta.data());
        const uint8_t* blk = kp.data() + 1 * l.page_bytes() + h * l.head_block_bytes;
        if (l.lanes) {
          // The lane layout: token 5 is token 5 of unit 0; its halves and bytes hold the block's codes and scale
          // byte (block/q_lanes.h), every other byte of the head block is untouched.
          auto check = [&]<int DD, int B2>() {
            using L = block::QLanes<B2, DD, false>;
            int kc[DD];
            block::QBlock<DD, B2>::unpack(qp, codes.data(), kc);
            std::vector<bool> mine(l.head_block_bytes, false);
            for (int j = 0; j < L::kPieces; ++j) {
              const int o = L::piece_offset(5, j);
              const int got = L::piece_bytes(j) == 2 ? blk[o] | (blk[o + 1] << 8) : blk[o];
              EXPECT_EQ(got, L::piece_value(kc, meta[0], j)) << format_name(f) << " D=" << DD << " piece " << j;
              for (int b = 0; b < L::piece_bytes(j); ++b) mine[o + b] = true;
            }
            for (int64_t i = 0; i < l.head_block_bytes; ++i)
              if (!mine[i]) ASSERT_EQ(blk[i], 0xA5) << format_name(f) << " D=" << DD << " byte " << i;
          };
          if (f == Format::q4) {
            if (D == 64) check.template operator()<64, 8>();
            else check.template operator()<128, 8>();
          } else if (f == Format::q3_5) {
            if (D == 64) check.template operator()<64, 7>();
            else check.template operator()<128, 7>();
          } else {
            if (D == 64) check.template operator()<64, 6>();
            else check.template operator()<128, 6>();
          }
          continue;
        }
        EXPECT_EQ(0, std::memcmp(blk + 5 * bl.code_bytes, codes.data(), bl.code_bytes)) << format_name(f) << " D=" << D;
        if (bl.meta_bytes)
          EXPECT_EQ(0, std::memcmp(blk + P * bl.code_bytes + 5 * bl.meta_bytes, meta.data(), bl.meta_bytes));
        EXPECT_EQ(blk[4 * bl.code_bytes], 0xA5);  // the neighbour slot is untouched
      }
    }
  }
}

// The lane layouts (block/q_lanes.h): the 16 tokens' halves, bytes and nibble bytes tile the unit exactly once,
// offsets worked out by hand from docs/FORMATS.md, and random codes and scale bytes survive store_token / load_token
// for all 16 tokens.
template <int B2, int D, bool V>
void lanes_roundtrip(uint64_t seed) {
  using L = block::QLanes<B2, D, V>;
  std::vector<int> owner(L::kUnitBytes, -1);
  for (int t = 0; t < 16; ++t)
    for (int j = 0; j < L::kPieces; ++j) {
      const int o = L::piece_offset(t, j), n = L::piece_bytes(j);
      ASSERT_TRUE(o >= 0 && o + n <= L::kUnitBytes && o % n == 0) << o;
      for (int b = 0; b < n; ++b) {
        ASSERT_EQ(owner[o + b], -1) << "B2=" << B2 << " D=" << D << " V=" << V << " t=" << t << " j=" << j;
        owner[o + b] = t;
      }
    }
  for (int x : owner) ASSERT_GE(x, 0);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> unit(L::kUnitBytes, 0x5A);
  std::vector<std::vector<int>> codes(16, std::vector<int>(D));
  std::vector<uint8_t> scales(16);
  for (int t = 0; t < 16; ++t) {
    for (int c = 0; c < D; ++c) codes[t][c] = static_cast<int>(rng() % (1u << L::bits(c / 8)));
    scales[t] = static_cast<uint8_t>(rng());
    L::store_token(codes[t].data(), scales[t], t, unit.data());
  }
  for (int t = 15; t >= 0; --t) {
    std::vector<int> k(D, -1);
    uint8_t e = 0;
    L::load_token(unit.data(), t, k.data(), e);
    EXPECT_EQ(k, codes[t]) << "B2=" << B2 << " D=" << D << " V=" << V << " t=" << t;
    EXPECT_EQ(e, scales[t]);
  }
}

// paged_write_ref encodes the tokens of a launch with distinct slots on all threads: every format's pools must be the
// bytes of writing the tokens one call at a time, in order (a one-token call takes the sequential path). A launch that
// repeats a slot keeps the order (the last write wins). A bad slot anywhere is reported before anything is written.
TEST(PagedWriteRef, ThreadedWriteGivesTheSequentialBytes) {
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  for (const auto& info : all_formats()) {
    const Format f = info.id;
    SCOPED_TRACE(format_name(f));
    const int P = 16, H = 2, D = 128, n = 300;  // 300 tokens: 5 chunks of 64 on the threads
    const PagedLayout l = make_paged_layout(f, P, H, D);
    const int64_t pages = n / P + 3;
    std::vector<uint16_t> k(size_t(n) * H * D), v(size_t(n) * H * D);
    for (auto& x : k) x = f32_to_bf16(nd(rng));
    for (auto& x : v) x = f32_to_bf16(nd(rng));
    std::vector<float> ks(H, 0.02f), vs(H, 0.03f);
    FormatParams fp{ks.data(), vs.data()};
    QHostParams qk, qv;
    if (info.sink_tokens > 0) {
      qk = synthetic_q_params(f, false, H, D, 1);
      qv = synthetic_q_params(f, true, H, D, 2);
      fp.qk = qk.table();
      fp.qv = qv.table();
    }
    std::vector<int32_t> slots(n);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots[7] = -1;  // padding
    const size_t bytes = size_t(pages * l.page_bytes());
    // The K and V pools after one call with every token, and after one call per token in order.
    auto pools = [&](const std::vector<int32_t>& sl, bool one_by_one) {
      std::pair<std::vector<uint8_t>, std::vector<uint8_t>> kv{std::vector<uint8_t>(bytes, 0xA5),
                                                               std::vector<uint8_t>(bytes, 0xA5)};
      for (int i = 0; i < (one_by_one ? n : 1); ++i)
        paged_write_ref(l, kv.first.data(), kv.second.data(), pages, k.data() + size_t(i) * H * D,
                        v.data() + size_t(i) * H * D, &sl[i], one_by_one ? 1 : n, fp);
      return kv;
    };
    EXPECT_TRUE(pools(slots, false) == pools(slots, true));
    // Slot slots[0] written again by the last token: the last write wins, as in order.
    std::vector<int32_t> rep = slots;
    rep[n - 1] = slots[0];
    EXPECT_TRUE(pools(rep, false) == pools(rep, true));
    // A slot past the pool at the end: an error, and nothing written.
    std::vector<int32_t> bad = slots;
    bad[n - 1] = static_cast<int32_t>(pages * P);
    std::vector<uint8_t> kb(bytes, 0xA5), vb(bytes, 0xA5);
    EXPECT_THROW(paged_write_ref(l, kb.data(), vb.data(), pages, k.data(), v.data(), bad.data(), n, fp), Error);
    EXPECT_EQ(kb, std::vector<uint8_t>(bytes, 0xA5));
  }
}

TEST(QLanes, PiecesTileTheUnitAndRoundTrip) {
  lanes_roundtrip<8, 64, false>(1);
  lanes_roundtrip<8, 64, true>(2);
  lanes_roundtrip<8, 128, false>(3);
  lanes_roundtrip<8, 128, true>(4);
  lanes_roundtrip<6, 64, false>(5);
  lanes_roundtrip<6, 64, true>(6);
  lanes_roundtrip<6, 128, false>(7);
  lanes_roundtrip<6, 128, true>(8);
  lanes_roundtrip<7, 64, false>(9);
  lanes_roundtrip<7, 64, true>(10);
  lanes_roundtrip<7, 128, false>(11);
  lanes_roundtrip<7, 128, true>(12);
  // q4 K, D = 128: token 9 (g = 1, second 8), lane q = 2, word 3, member 1 -> j = (2 * 4 + 3) * 2 + 1 = 23; lane
  // 4 * 1 + 2 = 6, share byte 16 + 12 + 2 = 30 -> piece 1, byte 14: (32 + 6) * 16 + 14 = 622.
  EXPECT_EQ((block::Q4Lanes<128, false>::piece_offset(9, 23)), 622);
  // q4 V, D = 128: token 11 (pair (10, 11) of the second 8: q = 1, odd -> hi half), member g = 5, word 2 -> j = 22;
  // lane 4 * 5 + 1 = 21, share byte 16 + 8 + 2 = 26 -> piece 1, byte 10: (32 + 21) * 16 + 10 = 858.
  EXPECT_EQ((block::Q4Lanes<128, true>::piece_offset(11, 22)), 858);
  // q3 K, D = 64 (slots: 0 = half, 1 = byte): token 10 (g = 2, row 1), lane q = 3, the byte, member 1 ->
  // j = (3 * 2 + 1) * 2 + 1 = 15; lane 4 * 2 + 3 = 11, share word 3 * 0 + 2 = 2, byte r + 2 m = 3 -> s = 11:
  // word-major ((11 / 4) * 32 + 11) * 4 + 3 = 303.
  EXPECT_EQ((block::Q3Lanes<64, false>::piece_offset(10, 15)), 303);
  // q3 V, D = 128 (slots: halves 0, 1, bytes 2, 3): token 3 (pair (2, 3): q = 1, odd, row 0), member g = 6, slot 1
  // (the second half) -> j = 6 * 4 + 1 = 25; lane 4 * 6 + 1 = 25, share word 3 * 1 + 0 = 3, byte 2 m = 2 -> s = 14:
  // ((14 / 4) * 32 + 25) * 4 + 2 = 486.
  EXPECT_EQ((block::Q3Lanes<128, true>::piece_offset(3, 25)), 486);
  // q3.5 K, D = 64 (slots: 0 = half, 1 = byte, 2 = nibble; pieces: 16 halves and bytes, then 4 nibble bytes):
  // token 10 (g = 2, row 1), the nibble byte of lane q = 3 -> j = 16 + 3 = 19; lane 4 * 2 + 3 = 11, after the 3 share
  // words of 32 lanes (384 bytes): 384 + 2 * 11 + 1 = 407.
  EXPECT_EQ((block::Q35Lanes<64, false>::piece_offset(10, 19)), 407);
  // q3.5 V, D = 128 (slots: halves 0, 1, bytes 2, 3, nibbles 4, 5; pieces: 8 x 4 = 32, then 4 per nibble slot):
  // token 11 (pair (10, 11): q' = 1, odd, row 1), the second nibble slot, member pair 2 (members 4, 5) ->
  // j = 32 + 4 * 1 + 2 = 38; after the 6 share words (768 bytes) and the first nibble slot's 64: word 4 * 2 + 1 = 9,
  // byte r + 2 m = 3 -> 768 + 64 + 36 + 3 = 871.
  EXPECT_EQ((block::Q35Lanes<128, true>::piece_offset(11, 38)), 871);
  // The kernel's read of that nibble: lane (g = 5, q = 1) reads word 9 of the slot (member pair 5 / 2 = 2), shifts
  // by 4 (member 5 is the high nibble).
  EXPECT_EQ((block::Q35Lanes<128, true>::nib_word_offset(1, 4 * 5 + 1)), 768 + 64 + 36);
  EXPECT_EQ((block::Q35Lanes<128, true>::nib_shift(4 * 5 + 1)), 4);
  // The widths are the calibration's pattern, summing to the logical block's code bytes.
  for (int B2 : {8, 7, 6})
    for (int D : {64, 128})
      for (bool v : {false, true}) {
        int sum = 0;
        for (int g = 0; g < D / 8; ++g) sum += block::lane_group_bits(B2, D, v, g);
        EXPECT_EQ(sum, block::q_code_bytes(B2, D));
      }
}

TEST(DecodeRef, SingleTokenReturnsItsValueAndFp32MatchesFp64) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  const PagedLayout l = make_paged_layout(Format::bf16, 16, 1, 64);
  const int64_t pages = 40;
  std::vector<uint8_t> kp(pages * l.page_bytes()), vp(pages * l.page_bytes());
  const int n = 600;  // two sequences: 1 token and 599 tokens
  std::vector<uint16_t> k(n * 64), v(n * 64), q(2 * 2 * 64);
  for (auto& x : k) x = f32_to_bf16(nd(rng));
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  for (auto& x : q) x = f32_to_bf16(nd(rng));
  std::vector<int32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> slots(n), indptr{0, 1, 1 + 38}, indices, last{1, 599 - 37 * 16};
  slots[0] = perm[0] * 16;
  indices.push_back(perm[0]);
  for (int t = 0; t < 599; ++t) slots[1 + t] = perm[1 + t / 16] * 16 + t % 16;
  for (int j = 0; j < 38; ++j) indices.push_back(perm[1 + j]);
  paged_write_ref(l, kp.data(), vp.data(), pages, k.data(), v.data(), slots.data(), n, {});
  PageTableView view = view_of(CsrPageTable{indptr.data(), indices.data(), last.data(), 2});
  std::vector<double> o64(2 * 2 * 64), o32(2 * 2 * 64), l64(4), l32(4);
  decode_attention_ref(l, kp.data(), vp.data(), view, q.data(), 2, 0.125, {}, o64.data(), l64.data(), false);
  decode_attention_ref(l, kp.data(), vp.data(), view, q.data(), 2, 0.125, {}, o32.data(), l32.data(), true);
  for (int g = 0; g < 2; ++g)
    for (int d = 0; d < 64; ++d) EXPECT_NEAR(o64[g * 64 + d], bf16_to_f32(v[d]), 1e-12);
  double num = 0, den = 0;
  for (size_t i = 0; i < o64.size(); ++i) {
    num += (o64[i] - o32[i]) * (o64[i] - o32[i]);
    den += o64[i] * o64[i];
  }
  EXPECT_LT(std::sqrt(num / den), 5e-3);  // fp32 + bf16 output rounding
  EXPECT_GT(std::sqrt(num / den), 0.0);   // and it is a different computation
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(l64[i], l32[i], 1e-4);
}

// q formats keep the first kSinkTokens positions exactly: a sequence no longer than that, read with its sink row,
// attends exactly like the bf16 cache; without the sink row it reads the (lossy) codes.
TEST(DecodeRef, SinkTokensAreReadExactly) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int H = 2, D = 64, n = kSinkTokens;
  const PagedLayout lq = make_paged_layout(Format::q4, 16, H, D), lb = make_paged_layout(Format::bf16, 16, H, D);
  QHostParams qk = synthetic_q_params(Format::q4, false, H, D, 3), qv = synthetic_q_params(Format::q4, true, H, D, 4);
  FormatParams fp;
  fp.qk = qk.table();
  fp.qv = qv.table();
  std::vector<uint16_t> k(n * H * D), v(n * H * D), q(4 * D);
  for (auto& x : k) x = f32_to_bf16(nd(rng));
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  for (auto& x : q) x = f32_to_bf16(nd(rng));
  std::vector<int32_t> slots(n);
  std::iota(slots.begin(), slots.end(), 16);  // page 1
  std::vector<uint8_t> kq(2 * lq.page_bytes()), vq(2 * lq.page_bytes()), kb(2 * lb.page_bytes()), vb(2 * lb.page_bytes());
  paged_write_ref(lq, kq.data(), vq.data(), 2, k.data(), v.data(), slots.data(), n, fp);
  paged_write_ref(lb, kb.data(), vb.data(), 2, k.data(), v.data(), slots.data(), n, {});
  // sink pool with 2 rows; the sequence owns row 1
  std::vector<uint16_t> ks(2 * n * H * D, 0), vs(2 * n * H * D, 0);
  std::copy(k.begin(), k.end(), ks.begin() + n * H * D);
  std::copy(v.begin(), v.end(), vs.begin() + n * H * D);
  std::vector<int32_t> rows{1}, indptr{0, 1}, indices{1}, last{n};
  const SinkView sv{ks.data(), vs.data(), rows.data(), 2};
  PageTableView view = view_of(CsrPageTable{indptr.data(), indices.data(), last.data(), 1});
  std::vector<double> oq(4 * D), ob(4 * D), oc(4 * D), lq64(4), lb64(4), lc64(4);
  decode_attention_ref(lq, kq.data(), vq.data(), view, q.data(), 4, 0.125, fp, oq.data(), lq64.data(), false, &sv);
  decode_attention_ref(lb, kb.data(), vb.data(), view, q.data(), 4, 0.125, {}, ob.data(), lb64.data(), false);
  decode_attention_ref(lq, kq.data(), vq.data(), view, q.data(), 4, 0.125, fp, oc.data(), lc64.data(), false);
  double diff = 0;
  for (size_t i = 0; i < oq.size(); ++i) {
    EXPECT_DOUBLE_EQ(oq[i], ob[i]) << i;
    diff = std::max(diff, std::abs(oc[i] - ob[i]));
  }
  EXPECT_GT(diff, 1e-3);  // the codes are lossy: reading them instead of the sinks changes the output
}

}  // namespace
}  // namespace kvpack
