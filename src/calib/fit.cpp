// q-format fitting: metric-whitened KLT, greedy integer bit allocation over equal-bit groups of 8, an 8-point
// Hadamard inside each group, per-token scale weights, and per-group step sizes fitted on real samples by running
// the encoder itself (so the fit sees exactly the arithmetic the cache will use).
#include "fit.h"

#include <algorithm>
#include <cmath>

#include "kvpack/block/q_lanes.h"
#include "kvpack/block/qx.h"
#include "kvpack/error.h"
#include "kvpack/formats.h"

extern "C" void dsyev_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                       double* work, const int* lwork, int* info);

namespace kvpack::calib {

void SlotStats::init(int head_dim) {
  d = head_dim;
  n = 0;
  sum.assign(d, 0.0);
  outer.assign(static_cast<size_t>(d) * d, 0.0);
  metric.assign(static_cast<size_t>(d) * d, 0.0);
  samples.clear();
}

std::vector<double> sym_eig(const std::vector<double>& a, int n, std::vector<double>& vecs) {
  // LAPACK is column-major; a symmetric matrix is its own transpose, and the eigenvector matrix comes back
  // column-major, i.e. eigenvectors are the rows of the buffer; transpose into columns of row-major `vecs`.
  std::vector<double> buf(a), w(n);
  int lwork = -1, info = 0;
  double q = 0;
  dsyev_("V", "U", &n, buf.data(), &n, w.data(), &q, &lwork, &info);
  lwork = static_cast<int>(q);
  std::vector<double> work(std::max(1, lwork));
  dsyev_("V", "U", &n, buf.data(), &n, w.data(), work.data(), &lwork, &info);
  KVPACK_CHECK(info == 0, "calibration: eigen-decomposition failed (dsyev info {})", info);
  vecs.assign(static_cast<size_t>(n) * n, 0.0);
  for (int k = 0; k < n; ++k) {
    // Fix each eigenvector's sign (largest-magnitude component positive) so the fit does not depend on LAPACK's.
    int arg = 0;
    for (int i = 1; i < n; ++i)
      if (std::abs(buf[static_cast<size_t>(k) * n + i]) > std::abs(buf[static_cast<size_t>(k) * n + arg])) arg = i;
    const double sgn = buf[static_cast<size_t>(k) * n + arg] < 0 ? -1.0 : 1.0;
    for (int i = 0; i < n; ++i) vecs[static_cast<size_t>(i) * n + k] = sgn * buf[static_cast<size_t>(k) * n + i];
  }
  return w;
}

namespace {

// MSE per unit variance of the MSE-optimal mid-rise uniform quantizer with 2^b levels on a Gaussian, and its step.
constexpr double kGaussDist[9] = {1.0, 0.3634, 0.1188, 0.03744, 0.01154, 0.003490, 0.001035, 0.0002993, 0.0000851};
constexpr double kGaussStep[9] = {0.0, 1.596, 0.9957, 0.5860, 0.3352, 0.1881, 0.1041, 0.05687, 0.03083};

// Relative weight of the identity mixed into the metric: keeps the metric's square root well conditioned, and
// protects directions the calibration queries never used.
constexpr double kMetricRidge = 0.01;

using Mat = std::vector<double>;  // row-major D x D

Mat matmul(const Mat& a, const Mat& b, int n) {
  Mat c(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k) {
      const double v = a[static_cast<size_t>(i) * n + k];
      for (int j = 0; j < n; ++j) c[static_cast<size_t>(i) * n + j] += v * b[static_cast<size_t>(k) * n + j];
    }
  return c;
}

template <int D, int BitsX2>
void fit_steps(const SlotStats& s, QFormatTables& t, int slot, const std::vector<double>& sigma) {
  using QB = block::QBlock<D, BitsX2>;
  constexpr int G = D / 8;
  const uint8_t* bits = t.group_bits.data() + static_cast<size_t>(slot) * G;
  float* step = t.step.data() + static_cast<size_t>(slot) * D;
  float* inv_step = t.inv_step.data() + static_cast<size_t>(slot) * D;
  const int64_t ns = s.n_samples();
  // Transform every sample once and pick its scale byte (independent of the steps).
  std::vector<float> ys(static_cast<size_t>(ns) * D);
  std::vector<uint8_t> es(ns);
  const block::QParams p0 = t.params(slot);
  for (int64_t i = 0; i < ns; ++i) {
    QB::transform(p0, s.samples.data() + i * D, ys.data() + i * D);
    es[i] = QB::scale_byte_rms(p0, ys.data() + i * D);  // the search needs steps: not yet
  }
  // Two passes: the first fits the steps at the RMS scale bytes (the search needs steps), the second at the bytes the
  // encoder's scale search picks with the first pass's steps, i.e. at the scales the cache will actually use
  // (docs/FORMATS.md, "Scale search": q4 KL -3.5% over one pass).
  constexpr int kStepPasses = 2;
  for (int pass = 0; pass < kStepPasses; ++pass) {
    if (pass > 0) {  // the encoder's searched scale bytes at the steps of the previous pass
      const block::QParams pf = t.params(slot);
      for (int64_t i = 0; i < ns; ++i) es[i] = QB::scale_byte_of(pf, ys.data() + i * D);
    }
    // Geometric grid of multipliers of the Gaussian-optimal step, evaluated for all groups at once.
    constexpr int kGrid = 25;
    std::vector<double> err(static_cast<size_t>(kGrid) * G, 0.0);
    uint8_t codes[QB::kCodeBytes + 1];
    float yh[D];
    for (int j = 0; j < kGrid; ++j) {
      const double mult = std::exp2((j - 12) / 16.0);
      for (int c = 0; c < D; ++c) {
        const int b = bits[c / 8];
        step[c] = b ? static_cast<float>(kGaussStep[b] * mult * sigma[c]) : 0.0f;
        inv_step[c] = b ? 1.0f / step[c] : 0.0f;
      }
      const block::QParams p = t.params(slot);
      for (int64_t i = 0; i < ns; ++i) {
        QB::quantize(p, ys.data() + i * D, es[i], codes);
        codes[QB::kCodeBytes] = es[i];
        QB::decode_transformed(p, codes, codes + QB::kCodeBytes, yh);
        for (int c = 0; c < D; ++c) {
          const double e = static_cast<double>(yh[c]) - ys[static_cast<size_t>(i) * D + c];
          err[static_cast<size_t>(j) * G + c / 8] += e * e;
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      int best = 12;
      for (int j = 0; j < kGrid; ++j)
        if (err[static_cast<size_t>(j) * G + g] < err[static_cast<size_t>(best) * G + g]) best = j;
      const double mult = std::exp2((best - 12) / 16.0);
      for (int i = 0; i < 8; ++i) {
        const int c = 8 * g + i;
        const int b = bits[g];
        step[c] = b ? static_cast<float>(kGaussStep[b] * mult * sigma[c]) : 0.0f;
        inv_step[c] = b ? 1.0f / step[c] : 0.0f;
      }
    }
  }
}

template <int D>
void dispatch_steps(const SlotStats& s, QFormatTables& t, int slot, const std::vector<double>& sigma) {
  switch (t.bits_x2) {
    case 8: return fit_steps<D, 8>(s, t, slot, sigma);
    case 7: return fit_steps<D, 7>(s, t, slot, sigma);
    case 6: return fit_steps<D, 6>(s, t, slot, sigma);
  }
  fail("calibration: unsupported q-format bits x2 = {}", t.bits_x2);
}

}  // namespace

void fit_q_slot(const SlotStats& s, QFormatTables& t, int slot) {
  const int D = s.d;
  const size_t DD = static_cast<size_t>(D) * D;
  KVPACK_CHECK(D == t.head_dim && (D == 64 || D == 128), "calibration: head_dim {} not supported", D);
  KVPACK_CHECK(s.n > D, "calibration: only {} tokens for a {}-dim slot; use longer calibration text", s.n, D);
  const int G = D / 8;
  const int budget = block::q_code_bytes(t.bits_x2, D);

  // Mean and covariance.
  std::vector<double> mu(D);
  for (int i = 0; i < D; ++i) mu[i] = s.sum[i] / static_cast<double>(s.n);
  Mat C(DD);
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j)
      C[static_cast<size_t>(i) * D + j] = s.outer[static_cast<size_t>(i) * D + j] / static_cast<double>(s.n) - mu[i] * mu[j];

  // Metric square root S = M^(1/2) and its inverse (M normalised to trace D, plus a ridge).
  Mat M(s.metric);
  double tr = 0;
  for (int i = 0; i < D; ++i) tr += M[static_cast<size_t>(i) * D + i];
  if (!(tr > 0)) {  // no metric: plain MSE
    std::fill(M.begin(), M.end(), 0.0);
    for (int i = 0; i < D; ++i) M[static_cast<size_t>(i) * D + i] = 1.0;
    tr = D;
  }
  for (auto& v : M) v *= D / tr;
  for (int i = 0; i < D; ++i) M[static_cast<size_t>(i) * D + i] += kMetricRidge;
  Mat P;
  std::vector<double> lam = sym_eig(M, D, P);
  Mat S(DD, 0.0), Si(DD, 0.0);
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      double a = 0, b = 0;
      for (int k = 0; k < D; ++k) {
        const double l = std::max(lam[k], 1e-12);
        const double pp = P[static_cast<size_t>(i) * D + k] * P[static_cast<size_t>(j) * D + k];
        a += pp * std::sqrt(l);
        b += pp / std::sqrt(l);
      }
      S[static_cast<size_t>(i) * D + j] = a;
      Si[static_cast<size_t>(i) * D + j] = b;
    }

  // KLT of the whitened covariance, eigenvalues descending.
  Mat Cz = matmul(matmul(S, C, D), S, D);
  Mat U;
  std::vector<double> gam = sym_eig(Cz, D, U);
  std::vector<int> order(D);
  for (int i = 0; i < D; ++i) order[i] = D - 1 - i;
  std::vector<double> g_sorted(D);
  for (int i = 0; i < D; ++i) g_sorted[i] = std::max(gam[order[i]], 0.0);

  // Greedy integer allocation (optimal for convex decreasing distortion): one byte = one more bit for 8 channels.
  std::vector<double> energy(G, 0.0);
  for (int c = 0; c < D; ++c) energy[c / 8] += g_sorted[c];
  std::vector<int> bits(G, 0);
  // q4, q3.5, q3: the fixed pattern of their lane layout (include/kvpack/block/q_lanes.h), the same for every slot,
  // so the decode kernel's masks are compile-time constants; the greedy allocation below serves other bit budgets
  // (the experiments of docs/FORMATS.md).
  int lanes = 0;  // formats.h: lane_bits_x2 of the format these tables belong to, by its bits
  for (const FormatInfo& fi : all_formats())
    if (fi.sink_tokens > 0 && std::lround(2 * fi.bits_per_element) == t.bits_x2) lanes = lane_bits_x2(fi.id);
  if (lanes)
    for (int g = 0; g < G; ++g) bits[g] = block::lane_group_bits(lanes, D, slot % 2 == 1, g);
  for (int left = lanes ? 0 : budget; left > 0; --left) {
    int best = -1;
    double gain = -1;
    for (int g = 0; g < G; ++g) {
      if (bits[g] >= 8) continue;
      const double d = energy[g] * (kGaussDist[bits[g]] - kGaussDist[bits[g] + 1]);
      if (d > gain) {
        gain = d;
        best = g;
      }
    }
    KVPACK_CHECK(best >= 0, "calibration: bit budget {} bytes exceeds 8 bits per channel", budget);
    ++bits[best];
  }

  // F = Hg U^T S and G = S^-1 U Hg (Hg: normalised 8-point Hadamard on each group, symmetric and orthogonal).
  Mat Ut(DD), Us(DD);
  for (int r = 0; r < D; ++r)
    for (int c = 0; c < D; ++c) {
      Ut[static_cast<size_t>(r) * D + c] = U[static_cast<size_t>(c) * D + order[r]];
      Us[static_cast<size_t>(c) * D + r] = U[static_cast<size_t>(c) * D + order[r]];
    }
  Mat A = matmul(Ut, S, D);   // rows: whitened KLT directions
  Mat B = matmul(Si, Us, D);  // columns: their inverses
  double h8[8][8];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) h8[i][j] = (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) / std::sqrt(8.0);
  const size_t so = static_cast<size_t>(slot);
  float* fwd = t.fwd.data() + so * DD;
  float* inv = t.inv.data() + so * DD;
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < 8; ++i)
      for (int c = 0; c < D; ++c) {
        double f = 0, v = 0;
        for (int j = 0; j < 8; ++j) {
          f += h8[i][j] * A[static_cast<size_t>(8 * g + j) * D + c];
          v += B[static_cast<size_t>(c) * D + 8 * g + j] * h8[j][i];
        }
        fwd[static_cast<size_t>(8 * g + i) * D + c] = static_cast<float>(f);
        inv[static_cast<size_t>(c) * D + 8 * g + i] = static_cast<float>(v);
      }

  // Channel variances after the group Hadamard are the group's mean eigenvalue; the scale byte normalises the RMS
  // of the coded channels by them.
  int n_coded = 0;
  for (int g = 0; g < G; ++g) n_coded += bits[g] > 0 ? 8 : 0;
  std::vector<double> sigma(D);
  for (int c = 0; c < D; ++c) {
    const double var = std::max(energy[c / 8] / 8.0, 1e-20);
    sigma[c] = std::sqrt(var);
    t.rms_weight[so * D + c] = bits[c / 8] > 0 ? static_cast<float>(1.0 / (var * n_coded)) : 0.0f;
    t.mean[so * D + c] = static_cast<float>(mu[c]);
  }
  for (int g = 0; g < G; ++g) t.group_bits[so * G + g] = static_cast<uint8_t>(bits[g]);
  if (D == 64) dispatch_steps<64>(s, t, slot, sigma);
  else dispatch_steps<128>(s, t, slot, sigma);
}

double q_slot_relative_error(const SlotStats& s, const QFormatTables& t, int slot) {
  const int D = s.d;
  const block::QParams p = t.params(slot);
  // Normalised metric (the same one fit_q_slot used, without the ridge) for weighting.
  const std::vector<double>& M = s.metric;
  std::vector<uint8_t> buf(static_cast<size_t>(block::q_code_bytes(t.bits_x2, D)) + 1);
  std::vector<float> xh(D);
  double num = 0, den = 0;
  const int64_t ns = s.n_samples();
  auto quad = [&](const std::vector<double>& e) {
    double q = 0;
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) q += e[i] * M[static_cast<size_t>(i) * D + j] * e[j];
    return q;
  };
  std::vector<double> e(D), x0(D);
  for (int64_t i = 0; i < ns; ++i) {
    const float* x = s.samples.data() + i * D;
    auto run = [&]<int DD, int B>() {
      using QB = block::QBlock<DD, B>;
      QB::encode(p, x, buf.data(), buf.data() + QB::kCodeBytes);
      QB::decode(p, buf.data(), buf.data() + QB::kCodeBytes, xh.data());
    };
    if (D == 64) {
      if (t.bits_x2 == 8) run.template operator()<64, 8>();
      else if (t.bits_x2 == 7) run.template operator()<64, 7>();
      else run.template operator()<64, 6>();
    } else {
      if (t.bits_x2 == 8) run.template operator()<128, 8>();
      else if (t.bits_x2 == 7) run.template operator()<128, 7>();
      else run.template operator()<128, 6>();
    }
    for (int c = 0; c < D; ++c) {
      e[c] = static_cast<double>(xh[c]) - x[c];
      x0[c] = x[c] - s.sum[c] / static_cast<double>(s.n);
    }
    num += quad(e);
    den += quad(x0);
  }
  return den > 0 ? num / den : 0.0;
}

}  // namespace kvpack::calib
