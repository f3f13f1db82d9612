// Per-position metrics (KL, top-1, NLL) and their aggregation into statistics per position bucket.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvpack/error.h"
#include "kvpack/eval.h"

namespace kvpack {

double log_softmax(const float* logits, int n, float* out) {
  KVPACK_CHECK(n > 0, "log_softmax: empty logits");
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, logits[i]);
  KVPACK_CHECK(std::isfinite(mx), "log_softmax: logits contain no finite maximum (NaN or all -inf)");
  // Sum in fp64: 49k terms of very different sizes; expf is exact enough per term (rel 1e-7) and far cheaper.
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(logits[i] - mx);
  const double lse = static_cast<double>(mx) + std::log(sum);
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
  return lse;
}

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

PositionScore score_position(const RefPosition& ref, const float* fmt_logits, int vocab, int target) {
  // Same arithmetic as log_softmax() but without a scratch buffer: log q_i is formed per element, rounded to float
  // exactly as log_softmax() rounds it, so bit-identical logits give bit-identical log-probs and KL exactly 0.
  float mx = -std::numeric_limits<float>::infinity();
  int fmt_arg = 0;
  for (int i = 0; i < vocab; ++i)
    if (fmt_logits[i] > mx) mx = fmt_logits[i], fmt_arg = i;
  KVPACK_CHECK(std::isfinite(mx), "format logits contain no finite maximum (NaN or all -inf)");
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(fmt_logits[i] - mx);
  const double lse = static_cast<double>(mx) + std::log(sum);
  double kl = 0;
  for (int i = 0; i < vocab; ++i) {
    const float lp = ref.logp[i];
    const float lq = static_cast<float>(static_cast<double>(fmt_logits[i]) - lse);
    kl += std::exp(static_cast<double>(lp)) * (static_cast<double>(lp) - static_cast<double>(lq));
  }
  PositionScore s;
  s.kl = std::max(kl, 0.0);  // rounding can leave a tiny negative sum when the distributions are nearly equal
  s.top1_match = fmt_arg == ref.argmax;
  if (target >= 0) {
    KVPACK_CHECK(target < vocab, "target token {} out of range for vocab {}", target, vocab);
    s.nll_ref = -static_cast<double>(ref.logp[target]);
    s.nll_fmt = -static_cast<double>(static_cast<float>(static_cast<double>(fmt_logits[target]) - lse));
  }
  return s;
}

void ScoreLog::add(int position, const PositionScore& s) {
  pos.push_back(position);
  kl.push_back(s.kl);
  nll_ref.push_back(s.nll_ref);
  nll_fmt.push_back(s.nll_fmt);
  top1.push_back(s.top1_match ? 1 : 0);
}

void ScoreLog::append(const ScoreLog& o) {
  pos.insert(pos.end(), o.pos.begin(), o.pos.end());
  kl.insert(kl.end(), o.kl.begin(), o.kl.end());
  nll_ref.insert(nll_ref.end(), o.nll_ref.begin(), o.nll_ref.end());
  nll_fmt.insert(nll_fmt.end(), o.nll_fmt.begin(), o.nll_fmt.end());
  top1.insert(top1.end(), o.top1.begin(), o.top1.end());
}

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the ceil(q*n)-th smallest value (1-based), at least the first.
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  rank = std::clamp<size_t>(rank, 1, values.size());
  std::nth_element(values.begin(), values.begin() + static_cast<long>(rank - 1), values.end());
  return values[rank - 1];
}

Stats ScoreLog::stats(int64_t lo, int64_t hi) const {
  Stats st;
  std::vector<double> kls;
  double kl_sum = 0, nll_sum = 0, nll_ref_sum = 0;
  int64_t agree = 0;
  for (size_t i = 0; i < kl.size(); ++i) {
    if (pos[i] < lo || pos[i] >= hi) continue;
    kls.push_back(kl[i]);
    kl_sum += kl[i];
    nll_sum += nll_fmt[i];
    nll_ref_sum += nll_ref[i];
    agree += top1[i];
    st.kl_max = std::max(st.kl_max, kl[i]);
  }
  st.positions = static_cast<int64_t>(kls.size());
  if (st.positions == 0) return st;
  const double n = static_cast<double>(st.positions);
  st.kl_mean = kl_sum / n;
  st.kl_p99 = quantile(std::move(kls), 0.99);
  st.top1_agreement = static_cast<double>(agree) / n;
  st.nll_mean = nll_sum / n;
  st.delta_nll = (nll_sum - nll_ref_sum) / n;
  st.ppl = std::exp(st.nll_mean);
  return st;
}

std::vector<int64_t> default_bucket_edges(int64_t window) {
  std::vector<int64_t> edges{0};
  for (int64_t e : {64, 512, 2048, 4096, 8192, 16384, 32768, 65536, 131072}) {
    if (e >= window) break;
    edges.push_back(e);
  }
  edges.push_back(window);
  return edges;
}

std::vector<int64_t> plot_bin_edges(int64_t window) {
  std::vector<int64_t> edges{0};
  for (int64_t e = 1; e < window; e *= 2) edges.push_back(e);
  edges.push_back(window);
  return edges;
}

}  // namespace kvpack
