// Fitting one (layer, kv head, K|V) slot of a q-format from activation statistics (private to src/calib).
#pragma once
#include <cstdint>
#include <vector>

#include "kvpack/calibration.h"

namespace kvpack::calib {

// Statistics of one slot, gathered over the calibration windows (sink tokens left out).
struct SlotStats {
  int d = 0;
  int64_t n = 0;               // tokens accumulated in sum/outer
  std::vector<double> sum;     // [D]     sum of x
  std::vector<double> outer;   // [D, D]  sum of x x^T
  std::vector<double> metric;  // [D, D]  distortion metric: an error e costs e^T metric e (any positive scale)
  std::vector<float> samples;  // [n_samples, D] a deterministic subsample of x, for fitting the steps
  void init(int head_dim);
  int64_t n_samples() const { return d ? static_cast<int64_t>(samples.size()) / d : 0; }
};

// Fits mean, transform, inverse, bit allocation, per-token scale weights and steps of slot `slot` of t.
// Deterministic: same statistics -> same bytes.
void fit_q_slot(const SlotStats& s, QFormatTables& t, int slot);

// Weighted reconstruction error of the fitted slot on the stats' samples: mean of e^T metric e / mean of
// (x-mu)^T metric (x-mu) (a relative, metric-weighted MSE); for reporting and tests.
double q_slot_relative_error(const SlotStats& s, const QFormatTables& t, int slot);

// Symmetric eigen-decomposition (LAPACK dsyev): a [n, n] row-major symmetric; returns eigenvalues ascending and
// writes eigenvectors as the COLUMNS of vecs (row-major [n, n]).
std::vector<double> sym_eig(const std::vector<double>& a, int n, std::vector<double>& vecs);

}  // namespace kvpack::calib
