// An emulation of the lean decode kernel's q4 / q3.5 / q3 arithmetic (src/cuda/decode_lean.cuh) on the CPU, lane by lane,
// with the m16n8k16 fragments laid out as PTX defines them: the lane's share words of a unit read as the kernel's
// lean_q_rows reads them (rows, slots, the shift by 8 of q3's second row), one AND per f16x2 (codes
// as f16 subnormals), the quad / ballot gathering of the scale bytes, the query folded with 2^(24 - pos') and 2^E,
// q'.o, L_tau and the chunk-end conversion, then the merge's mu L + G (s O). Exact products and fp64 sums stand in
// for the tensor core. It checks the kernel's maps and constants against the fp64 reference on the dequantised cache
// where no GPU runs (the GPU tests check the kernel itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kvpack/bf16.h"
#include "kvpack/block/q_lanes.h"
#include "kvpack/paged.h"

namespace kvpack {
namespace {

// The kernel's lean_q_rows: a lane's share words of a unit (bytes 4 k .. 4 k + 3 of its share), as rows 0 and 1 at
// their slots' bit positions.
template <class L>
void lane_rows(const uint8_t* unit, int lane, uint32_t (&r0)[L::kSlots], uint32_t (&r1)[L::kSlots]) {
  uint32_t sw[L::kShareWords] = {};
  for (int k = 0; k < L::kShareWords; ++k)
    for (int i = 0; i < 4; ++i) sw[k] |= static_cast<uint32_t>(unit[L::share_offset(lane, 4 * k + i)]) << (8 * i);
  for (int slot = 0; slot < L::kReg; ++slot) {
    r0[slot] = sw[L::share_word(slot, 0)] >> L::row_shift(slot, 0);
    r1[slot] = sw[L::share_word(slot, 1)] >> L::row_shift(slot, 1);
  }
  for (int n = 0; n < L::kNib; ++n) {  // q3.5: the aligned word, shifted, spread into the rows
    const int o = L::nib_word_offset(n, lane);
    uint32_t w = 0;
    for (int i = 0; i < 4; ++i) w |= static_cast<uint32_t>(unit[o + i]) << (8 * i);
    w >>= L::nib_shift(lane);
    r0[L::kReg + n] = L::nib_row(w, 0);
    r1[L::kReg + n] = L::nib_row(w, 1);
  }
}
// The kernel's lean_q_pair: group i of a row's slot words w (and w >> 6), as the two f16 values it stands for.
template <class L>
void pair_values(const uint32_t* w, int i, double& lo, double& hi) {
  const block::LaneGroup g = L::group(i);
  const int pos = L::shifted(i) ? g.pos - 6 : g.pos;
  const uint32_t m = ((1u << g.w) - 1u) << pos;
  const uint32_t x = (L::shifted(i) ? w[g.word] >> 6 : w[g.word]) & (m | (m << 16));
  lo = f16_to_f32(static_cast<uint16_t>(x & 0xffffu));
  hi = f16_to_f32(static_cast<uint16_t>(x >> 16));
}
int range_exponent(float mx) {  // the kernel's f16_range_exponent
  int e = 0;
  if (mx > 0.f && mx <= 3.0e38f) std::frexp(mx, &e);
  return mx > 0.f && mx <= 3.0e38f ? std::min(std::max(14 - e, -120), 120) : 0;
}

template <int B2, int D>
void emulate(uint64_t seed) {
  using LK = block::QLanes<B2, D, false>;
  using LV = block::QLanes<B2, D, true>;
  constexpr int W = LK::kSlots, SK = LK::kScaleSlot, SV = LV::kScaleSlot, KB = D / 16, G = 4, n = 40;  // 3 units
  static_assert(W == LV::kSlots);
  const Format f = B2 == 8 ? Format::q4 : B2 == 7 ? Format::q3_5 : Format::q3;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  const PagedLayout l = make_paged_layout(f, 16, 1, D);
  const int pages = 3;
  std::vector<uint8_t> kp(pages * l.page_bytes(), 0x77), vp(pages * l.page_bytes(), 0x77);
  const QHostParams qk = synthetic_q_params(f, false, 1, D, seed), qv = synthetic_q_params(f, true, 1, D, seed + 1);
  FormatParams fp;
  fp.qk = qk.table();
  fp.qv = qv.table();
  std::vector<uint16_t> k(n * D), v(n * D), qh(G * D);
  for (auto& x : k) x = f32_to_bf16(nd(rng) * 2.f);
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  for (auto& x : qh) x = f32_to_bf16(nd(rng));
  std::vector<int32_t> slots(n);
  for (int t = 0; t < n; ++t) slots[t] = t;
  paged_write_ref(l, kp.data(), vp.data(), pages, k.data(), v.data(), slots.data(), n, fp);
  const float qks = static_cast<float>(1.0 / std::sqrt(double(D)) * 1.4426950408889634);

  // fp64 reference on the dequantised cache (log2 units).
  std::vector<double> K(n * D), V(n * D);
  for (int t = 0; t < n; ++t) {
    std::vector<float> x(D);
    dequant_token_ref(l, kp.data(), t / 16, 0, t % 16, false, fp, x.data());
    for (int d = 0; d < D; ++d) K[t * D + d] = x[d];
    dequant_token_ref(l, vp.data(), t / 16, 0, t % 16, true, fp, x.data());
    for (int d = 0; d < D; ++d) V[t * D + d] = x[d];
  }

  // The kernel's query preparation.
  std::vector<float> qs(G * D), tq(G * D);
  std::vector<uint16_t> hq(8 * D, 0);
  double un[8] = {}, qo[8] = {}, cz[8] = {};
  for (int h = 0; h < G; ++h)
    for (int r = 0; r < D; ++r) qs[h * D + r] = bf16_to_f32(qh[h * D + r]) * qks;
  for (int h = 0; h < G; ++h) {
    for (int c = 0; c < D; ++c) {
      float a = 0.f;
      for (int r = 0; r < D; ++r) a = std::fma(qk.inv[r * D + c], qs[h * D + r], a);
      const int gi = c / 8, kexp = 24 - LK::group(gi).pos + (LK::shifted(gi) ? 6 : 0);
      tq[h * D + c] = a * std::ldexp(qk.step[c], kexp);
    }
    float mx = 0.f, c0 = 0.f;
    for (int c = 0; c < D; ++c) mx = std::max(mx, std::fabs(tq[h * D + c]));
    const int E = range_exponent(mx);
    for (int c = 0; c < D; ++c) {
      hq[h * D + c] = f32_to_f16(std::ldexp(tq[h * D + c], E));
      const int gi = c / 8, kexp = 24 - LK::group(gi).pos + (LK::shifted(gi) ? 6 : 0);
      qo[h] += f16_to_f32(hq[h * D + c]) * std::ldexp(1.0, -kexp - E) * (0.5 * ((1 << LK::bits(gi)) - 1));
    }
    for (int r = 0; r < D; ++r) c0 = std::fma(qs[h * D + r], qk.mean[r], c0);
    un[h] = std::ldexp(1.0, -E);
    cz[h] = c0;
  }

  // Scores, unit by unit, through the fragments.
  std::vector<double> sc(n * G), sref(n * G);
  for (int u = 0; u < 3; ++u) {
    const uint8_t* ku = kp.data() + u * l.page_bytes();  // page u = unit u (page size 16)
    double A[KB][16][16] = {}, B[KB][16][8] = {}, C[16][8] = {};
    uint8_t tauk[16] = {};
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, q = lane % 4;
      uint32_t k0[W], k8[W];
      lane_rows<LK>(ku, lane, k0, k8);
      for (int kb = 0; kb < KB; ++kb) {
        pair_values<LK>(k0, 2 * kb, A[kb][g][2 * q], A[kb][g][2 * q + 1]);              // a0
        pair_values<LK>(k8, 2 * kb, A[kb][g + 8][2 * q], A[kb][g + 8][2 * q + 1]);      // a1
        pair_values<LK>(k0, 2 * kb + 1, A[kb][g][2 * q + 8], A[kb][g][2 * q + 9]);      // a2
        pair_values<LK>(k8, 2 * kb + 1, A[kb][g + 8][2 * q + 8], A[kb][g + 8][2 * q + 9]);
        // b0 / b1 of head g: groups 2 kb / 2 kb + 1, members 2q, 2q + 1.
        B[kb][2 * q][g] = f16_to_f32(hq[g * D + 8 * (2 * kb) + 2 * q]);
        B[kb][2 * q + 1][g] = f16_to_f32(hq[g * D + 8 * (2 * kb) + 2 * q + 1]);
        B[kb][2 * q + 8][g] = f16_to_f32(hq[g * D + 8 * (2 * kb + 1) + 2 * q]);
        B[kb][2 * q + 9][g] = f16_to_f32(hq[g * D + 8 * (2 * kb + 1) + 2 * q + 1]);
      }
      // Scale bits of tokens g and g + 8: bit 15 -> 2q, bit 31 -> 2q + 1 (the quad OR).
      tauk[g] |= static_cast<uint8_t>((((k0[SK] >> 15) & 1u) | ((k0[SK] >> 30) & 2u)) << (2 * q));
      tauk[g + 8] |= static_cast<uint8_t>((((k8[SK] >> 15) & 1u) | ((k8[SK] >> 30) & 2u)) << (2 * q));
    }
    for (int kb = 0; kb < KB; ++kb)
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c)
          for (int x = 0; x < 16; ++x) C[r][c] += A[kb][r][x] * B[kb][x][c];
    for (int r = 0; r < 16; ++r) {
      const int t = 16 * u + r;
      if (t >= n) continue;
      // The stored scale byte, read back through the reference decoder of the logical block.
      int codes[D];
      uint8_t e = 0;
      LK::load_token(ku, r, codes, e);
      ASSERT_EQ(tauk[r], e) << "K scale byte of token " << t;
      for (int h = 0; h < G; ++h) {
        sc[t * G + h] = block::decode_scale_byte(tauk[r]) * (C[r][h] * un[h] - qo[h]) + cz[h];
        double a = 0;
        for (int d = 0; d < D; ++d) a += double(qs[h * D + d]) * K[t * D + d];
        sref[t * G + h] = a;
      }
    }
  }
  for (int i = 0; i < n * G; ++i) EXPECT_NEAR(sc[i], sref[i], 2e-3 * (1 + std::fabs(sref[i]))) << "B2=" << B2 << " D=" << D << " score " << i;

  // P.V through the fragments, then the chunk-end conversion and the merge.
  for (int h = 0; h < G; ++h) {
    double mx = -1e300, mref = -1e300;
    for (int t = 0; t < n; ++t) mx = std::max(mx, sc[t * G + h]), mref = std::max(mref, sref[t * G + h]);
    std::vector<double> O(D, 0.0), oref(D, 0.0);
    double L = 0, Lt = 0, Lref = 0;
    for (int u = 0; u < 3; ++u) {
      const uint8_t* vu = vp.data() + u * l.page_bytes();
      double A[KB][16][16] = {}, Bw[16] = {};
      uint32_t bal[4] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, q = lane % 4;
        uint32_t v0[W], v1[W];
        lane_rows<LV>(vu, lane, v0, v1);
        for (int mb = 0; mb < KB; ++mb) {
          pair_values<LV>(v0, 2 * mb, A[mb][g][2 * q], A[mb][g][2 * q + 1]);              // a0
          pair_values<LV>(v0, 2 * mb + 1, A[mb][g + 8][2 * q], A[mb][g + 8][2 * q + 1]);  // a1
          pair_values<LV>(v1, 2 * mb, A[mb][g][2 * q + 8], A[mb][g][2 * q + 9]);          // a2
          pair_values<LV>(v1, 2 * mb + 1, A[mb][g + 8][2 * q + 8], A[mb][g + 8][2 * q + 9]);
        }
        const uint32_t la = v0[SV], lb = v1[SV];
        bal[0] |= ((la >> 15) & 1u) << lane, bal[1] |= (la >> 31) << lane;
        bal[2] |= ((lb >> 15) & 1u) << lane, bal[3] |= (lb >> 31) << lane;
      }
      for (int r = 0; r < 16; ++r) {
        const int t = 16 * u + r;
        // tau_V of token r: ballot (r >= 8 ? 2 : 0) + (r & 1), lanes 4 g' + (r % 8) / 2.
        uint32_t e = 0;
        for (int gp = 0; gp < 8; ++gp) e |= ((bal[(r >= 8 ? 2 : 0) + (r & 1)] >> (4 * gp + (r % 8) / 2)) & 1u) << gp;
        if (t < n) {
          int codes[D];
          uint8_t ev = 0;
          LV::load_token(vu, r, codes, ev);
          ASSERT_EQ(e, ev) << "V scale byte of token " << t;
        }
        const double p = t < n ? std::exp2(sc[t * G + h] - mx) : 0.0;
        L += p;
        Bw[r] = f16_to_f32(f32_to_f16(static_cast<float>(p * block::decode_scale_byte(static_cast<uint8_t>(e)))));
        Lt += Bw[r];
        if (t < n) {
          const double pr = std::exp2(sref[t * G + h] - mref);
          Lref += pr;
          for (int d = 0; d < D; ++d) oref[d] += pr * V[t * D + d];
        }
      }
      for (int mb = 0; mb < KB; ++mb)
        for (int r = 0; r < 16; ++r) {
          const int c = r < 8 ? 8 * (2 * mb) + r : 8 * (2 * mb + 1) + r - 8;
          for (int x = 0; x < 16; ++x) O[c] += A[mb][r][x] * Bw[x];
        }
    }
    std::vector<double> acc(D);
    for (int c = 0; c < D; ++c) {
      const int gi = c / 8;
      acc[c] = O[c] * std::ldexp(1.0, 24 - LV::group(gi).pos + (LV::shifted(gi) ? 6 : 0)) -
               0.5 * ((1 << LV::bits(gi)) - 1) * Lt;
    }
    double omax = 0, err = 0;
    for (int r = 0; r < D; ++r) {
      double uu = qv.mean[r] * L;
      for (int c = 0; c < D; ++c) uu += double(qv.inv[r * D + c]) * qv.step[c] * acc[c];
      const double want = oref[r] / Lref;
      omax = std::max(omax, std::fabs(want));
      err = std::max(err, std::fabs(uu / L - want));
    }
    EXPECT_LT(err, 5e-3 * omax) << "B2=" << B2 << " D=" << D << " head " << h;
  }
}

TEST(QLeanEmulation, FragmentsScalesAndFoldsMatchTheReference) {
  emulate<8, 64>(31);
  emulate<8, 128>(32);
  emulate<6, 64>(33);
  emulate<6, 128>(34);
  emulate<7, 64>(35);
  emulate<7, 128>(36);
}

}  // namespace
}  // namespace kvpack
