// Synthetic q-format parameters for tests and benchmarks (the real ones come from `kvpack calibrate`).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kvpack/block/q_lanes.h"
#include "kvpack/error.h"
#include "kvpack/paged.h"

namespace kvpack {

block::QHeadTable QHostParams::table() const {
  return table_via([](const auto& v) { return v.data(); });
}

QHostParams synthetic_q_params(Format f, bool is_v, int num_heads, int D, uint64_t seed) {
  const int bits_x2 = f == Format::q4 ? 8 : f == Format::q3_5 ? 7 : f == Format::q3 ? 6 : 0;
  KVPACK_CHECK(bits_x2 > 0, "synthetic_q_params: '{}' is not a q format", format_name(f));
  KVPACK_CHECK(D == 64 || D == 128, "synthetic_q_params: head_dim {} is not 64 or 128", D);
  KVPACK_CHECK(num_heads >= 1, "synthetic_q_params: num_heads {} < 1", num_heads);
  QHostParams q;
  q.format = f;
  q.num_heads = num_heads;
  q.head_dim = D;
  const size_t H = size_t(num_heads);
  q.mean.resize(H * D);
  q.fwd.resize(H * D * D);
  q.inv.resize(H * D * D);
  q.step.resize(H * D);
  q.inv_step.resize(H * D);
  q.rms_weight.assign(H * D, 1.0f / float(D));
  q.group_bits.resize(H * (D / 8));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  // Optimal uniform quantiser step of a unit Gaussian, by bits (1..8).
  constexpr double kStep[9] = {0, 1.596, 0.996, 0.586, 0.335, 0.188, 0.104, 0.057, 0.031};
  const int groups = D / 8, budget = block::q_code_bytes(bits_x2, D);
  for (size_t h = 0; h < H; ++h) {
    // Random orthogonal F (modified Gram-Schmidt on a Gaussian matrix, rows orthonormal); G = F^T.
    std::vector<double> m(size_t(D) * D);
    for (auto& x : m) x = nd(rng);
    for (int r = 0; r < D; ++r) {
      double* a = &m[size_t(r) * D];
      for (int p = 0; p < r; ++p) {
        const double* b = &m[size_t(p) * D];
        double dot = 0;
        for (int c = 0; c < D; ++c) dot += a[c] * b[c];
        for (int c = 0; c < D; ++c) a[c] -= dot * b[c];
      }
      double n = 0;
      for (int c = 0; c < D; ++c) n += a[c] * a[c];
      n = std::sqrt(n);
      for (int c = 0; c < D; ++c) a[c] /= n;
    }
    for (int r = 0; r < D; ++r)
      for (int c = 0; c < D; ++c) {
        q.fwd[(h * D + r) * D + c] = static_cast<float>(m[size_t(r) * D + c]);
        q.inv[(h * D + c) * D + r] = static_cast<float>(m[size_t(r) * D + c]);
      }
    for (int c = 0; c < D; ++c) q.mean[h * D + c] = static_cast<float>(0.1 * nd(rng));
    // Bit allocation: greedy reverse water-filling on random group energies (a wide spread, so widths 0..8 occur).
    std::vector<double> energy(groups);
    std::vector<int> order(groups);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int g = 0; g < groups; ++g) energy[order[g]] = std::pow(2.0, -0.9 * g);
    std::vector<int> bits(groups, 0);
    for (int spent = 0; spent < budget; ++spent) {
      int best = -1;
      double gain = -1;
      for (int g = 0; g < groups; ++g) {
        if (bits[g] >= 8) continue;
        const double d = energy[g] * (std::pow(4.0, -bits[g]) - std::pow(4.0, -bits[g] - 1));
        if (d > gain) gain = d, best = g;
      }
      ++bits[best];
    }
    if (const int lb = lane_bits_x2(f))  // the fixed pattern (include/kvpack/block/q_lanes.h); the energies above are still drawn
      for (int g = 0; g < groups; ++g) bits[g] = block::lane_group_bits(lb, D, is_v, g);
    for (int g = 0; g < groups; ++g) {
      q.group_bits[h * groups + g] = static_cast<uint8_t>(bits[g]);
      for (int i = 0; i < 8; ++i) {
        const size_t c = h * D + 8 * g + i;
        q.step[c] = bits[g] ? static_cast<float>(kStep[bits[g]]) : 1.0f;
        q.inv_step[c] = bits[g] ? 1.0f / q.step[c] : 0.0f;
      }
    }
  }
  return q;
}

}  // namespace kvpack
