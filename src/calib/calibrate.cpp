// `calibrate()`: runs the model in bf16 over calibration windows, gathers per-(layer, kv head, K|V) statistics
// through a ForwardObserver, and fits fp8 scales and the q4/q3.5/q3 parameters.
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fit.h"
#include "kvpack/calibration.h"
#include "kvpack/error.h"
#include "kvpack/llama.h"
#include "kvpack/parallel.h"
#include "kvpack/progress.h"

namespace kvpack {
namespace {

// Every kSampleStride-th non-sink token of each slot is kept (up to kMaxSamples) for fitting step sizes.
constexpr int kSampleStride = 4;
constexpr int kMaxSamples = 2048;

class StatsObserver final : public ForwardObserver {
 public:
  StatsObserver(const ModelConfig& c, int sinks) : c_(c), sinks_(sinks) {
    const int slots = c.n_layers * c.n_kv_heads * 2;
    stats_.resize(slots);
    for (auto& s : stats_) s.init(c.head_dim);
    absmax_.assign(slots, 0.0f);
    seen_.assign(slots, 0);
  }

  void on_attention_inputs(int layer, int n_tokens, const int* positions, const float* q, const float* k,
                           const float* v) override {
    const int D = c_.head_dim, H = c_.n_kv_heads, grp = c_.group_size();
    std::vector<double> a;
    for (int h = 0; h < H; ++h) {
      for (int kind = 0; kind < 2; ++kind) {
        const float* x = kind == 0 ? k : v;
        const int slot = (layer * H + h) * 2 + kind;
        calib::SlotStats& s = stats_[slot];
        // fp8 sees every token (it has no sinks); NaN/inf activations are ignored.
        for (int t = 0; t < n_tokens; ++t)
          for (int i = 0; i < D; ++i) {
            const float av = std::abs(x[(static_cast<size_t>(t) * H + h) * D + i]);
            if (std::isfinite(av)) absmax_[slot] = std::max(absmax_[slot], av);
          }
        a.clear();
        for (int t = 0; t < n_tokens; ++t) {
          if (positions[t] < sinks_) continue;
          const float* row = x + (static_cast<size_t>(t) * H + h) * D;
          for (int i = 0; i < D; ++i) a.push_back(row[i]);
          if (seen_[slot]++ % kSampleStride == 0 && s.n_samples() < kMaxSamples)
            s.samples.insert(s.samples.end(), row, row + D);
        }
        const int n = static_cast<int>(a.size() / D);
        if (n == 0) continue;
        for (int t = 0; t < n; ++t)
          for (int i = 0; i < D; ++i) s.sum[i] += a[static_cast<size_t>(t) * D + i];
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, n, 1.0, a.data(), D, 1.0, s.outer.data(), D);
        s.n += n;
        if (kind == 0) {  // key metric: second moment of the queries that read this kv head
          a.clear();
          for (int t = 0; t < n_tokens; ++t)
            for (int j = 0; j < grp; ++j) {
              const float* row = q + (static_cast<size_t>(t) * c_.n_heads + h * grp + j) * D;
              for (int i = 0; i < D; ++i) a.push_back(row[i]);
            }
          cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, static_cast<int>(a.size() / D), 1.0, a.data(), D,
                      1.0, s.metric.data(), D);
        }
      }
    }
  }

  std::vector<calib::SlotStats>& stats() { return stats_; }
  const std::vector<float>& absmax() const { return absmax_; }

 private:
  const ModelConfig& c_;
  int sinks_;
  std::vector<calib::SlotStats> stats_;
  std::vector<float> absmax_;
  std::vector<int64_t> seen_;
};

void symmetrize(std::vector<double>& m, int d) {
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < i; ++j) m[static_cast<size_t>(i) * d + j] = m[static_cast<size_t>(j) * d + i];
}

}  // namespace

Calibration calibrate(const LlamaModel& model, const std::vector<std::vector<int32_t>>& windows, bool progress) {
  const ModelConfig& c = model.config();
  KVPACK_CHECK(c.head_dim == 64 || c.head_dim == 128, "calibrate: head_dim {} is not supported (64 or 128)",
               c.head_dim);
  KVPACK_CHECK(!windows.empty(), "calibrate: no calibration windows");
  const int sinks = format_info(Format::q4).sink_tokens;
  int64_t total = 0;
  int max_len = 0;
  for (const auto& w : windows) {
    KVPACK_CHECK(static_cast<int>(w.size()) > sinks, "calibrate: a window has only {} tokens", w.size());
    total += static_cast<int64_t>(w.size());
    max_len = std::max<int>(max_len, static_cast<int>(w.size()));
  }
  KVPACK_CHECK(max_len <= c.max_context, "calibrate: window of {} tokens exceeds the model's context {}", max_len,
               c.max_context);
  // Each (layer, kv head) slot's fit needs more non-sink tokens than head_dim (a full-rank covariance).
  const int64_t fit_tokens = total - static_cast<int64_t>(windows.size()) * sinks;
  KVPACK_CHECK(fit_tokens > c.head_dim,
               "calibrate: {} token(s) after the first {} (sink) token(s) of each window; the fit needs more than "
               "head_dim = {} (use a longer calibration text: the default windows are 2 x 8192 tokens)",
               fit_tokens, sinks, c.head_dim);

  StatsObserver obs(c, sinks);
  auto bf16 = make_bf16_codec();
  {
    Progress bar("calibrate: forward", total, progress);
    int64_t done = 0;
    for (const auto& w : windows) {
      LlamaSession session(model, static_cast<int>(w.size()), bf16.get(), &obs);
      const int chunk = session.chunk_size();
      for (size_t i = 0; i < w.size(); i += chunk) {
        const size_t n = std::min(w.size() - i, static_cast<size_t>(chunk));
        session.forward(std::span<const int32_t>(w.data() + i, n), {});
        done += static_cast<int64_t>(n);
        bar.update(done, fmt::format("{:.0f} tok/s", done / std::max(1e-9, bar.elapsed_s())));
      }
    }
    bar.finish();
  }

  Calibration cal(c, calibration_model_id(c));
  const int H = c.n_kv_heads, D = c.head_dim, L = c.n_layers, grp = c.group_size();
  auto& stats = obs.stats();
  // Value metric: how the output projection amplifies each direction of the head's output, summed over the query
  // heads that read this kv head: sum_h Wo_h^T Wo_h with Wo_h = wo[:, h*D:(h+1)*D].
  for (int l = 0; l < L; ++l) {
    const std::vector<float>& wo = model.weights().layers[l].wo;  // [d_model, n_heads*D]
    for (int h = 0; h < H; ++h) {
      calib::SlotStats& s = stats[(l * H + h) * 2 + 1];
      for (int j = 0; j < grp; ++j) {
        const int qh = h * grp + j;
        for (int r = 0; r < c.d_model; ++r) {
          const float* row = wo.data() + static_cast<size_t>(r) * c.n_heads * D + static_cast<size_t>(qh) * D;
          for (int a = 0; a < D; ++a)
            for (int b = a; b < D; ++b) s.metric[static_cast<size_t>(a) * D + b] += double(row[a]) * row[b];
        }
      }
    }
  }
  for (auto& s : stats) {
    symmetrize(s.outer, D);
    symmetrize(s.metric, D);
  }
  for (size_t i = 0; i < obs.absmax().size(); ++i) {
    const float am = obs.absmax()[i];
    cal.fp8_scales()[i] = am > 0 ? am / 448.0f : 1.0f;
  }

  const Format qformats[] = {Format::q4, Format::q3_5, Format::q3};
  QFormatTables* tables[3];
  for (int i = 0; i < 3; ++i) tables[i] = &cal.q_mut(qformats[i]);
  const int slots = L * H * 2;
  const int jobs = slots * 3;
  Progress bar("calibrate: fit", jobs, progress);
  // Slots are independent; an error names the slot (the lowest failing job, whatever the thread timing).
  parallel_items(jobs, std::min(4, hardware_threads()), [&](int64_t j) {
    const int slot = static_cast<int>(j % slots), l = slot / 2 / H, h = slot / 2 % H;
    try {
      calib::fit_q_slot(stats[slot], *tables[j / slots], slot);
    } catch (const std::exception& e) {
      fail("calibrate: {}, layer {}, kv head {}, {}: {}", format_name(qformats[j / slots]), l, h,
           slot % 2 ? "V" : "K", e.what());
    }
  }, [&](int64_t done) { bar.update(done); });
  bar.finish();
  for (QFormatTables* t : tables) t->derive();
  cal.info()["tokens"] = std::to_string(total);
  cal.info()["windows"] = std::to_string(windows.size());
  cal.info()["sink_tokens"] = std::to_string(sinks);
  return cal;
}

}  // namespace kvpack
