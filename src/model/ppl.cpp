// Windowed NLL over a token stream (see text_eval.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "kvpack/error.h"
#include "kvpack/llama.h"
#include "kvpack/parallel.h"
#include "kvpack/progress.h"
#include "kvpack/text_eval.h"

namespace kvpack {

double token_nll(const float* logits, int n, int32_t target) {
  KVPACK_CHECK(target >= 0 && target < n, "token id {} is outside the vocabulary [0, {})", target, n);
  float mx = logits[0];
  for (int j = 1; j < n; ++j) mx = std::max(mx, logits[j]);
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += std::exp(static_cast<double>(logits[j]) - mx);
  return std::log(sum) + mx - logits[target];
}

TextScore score_text(const LlamaModel& model, std::span<const int32_t> tokens, const ScoreOptions& opt,
                     const TokenScoreCallback& cb) {
  const auto& cfg = model.config();
  const int bos = opt.bos == -2 ? (model.add_bos() ? model.bos_id() : -1) : opt.bos;
  KVPACK_CHECK(bos < cfg.vocab_size, "score_text: BOS id {} is outside the vocabulary", bos);
  int window = opt.window > 0 ? opt.window : static_cast<int>(std::min<int64_t>(cfg.max_context, 8192));
  KVPACK_CHECK(window >= 2, "score_text: window must be at least 2 tokens, got {}", window);
  const auto t0 = std::chrono::steady_clock::now();

  // Each window holds BOS (if any) + `text_per_window` text tokens. Without BOS consecutive windows still do not
  // overlap, and each window's first token is context only.
  const int text_per_window = bos >= 0 ? window - 1 : window;
  LlamaSession session(model, window, opt.codec, opt.observer);
  session.set_chunk_size(std::max(1, opt.chunk));
  TextScore r;
  r.window = window;
  double nll_sum = 0;
  const int vocab = cfg.vocab_size;
  std::vector<int32_t> win;
  std::vector<double> nll;
  for (size_t start = 0; start < tokens.size(); start += text_per_window) {
    const size_t len = std::min<size_t>(text_per_window, tokens.size() - start);
    win.clear();
    if (bos >= 0) win.push_back(bos);
    win.insert(win.end(), tokens.begin() + start, tokens.begin() + start + len);
    if (win.size() < 2) break;  // a lone trailing token without BOS has nothing to predict it
    session.reset();
    // Position p's logits predict win[p + 1]; win[p + 1] is tokens[start + p + 1 - (bos >= 0 ? 1 : 0)].
    const int64_t base = static_cast<int64_t>(start) - (bos >= 0 ? 1 : 0);
    session.forward(win, [&](int first, int n, const float* logits) {
      const int m = std::min(n, static_cast<int>(win.size()) - 1 - first);  // the last position predicts nothing
      if (m <= 0) return;
      nll.assign(m, 0.0);
      // The log-sum-exp over 49k logits is ~10% of a chunk's work; split it over the cores.
      // (parallel_items deals the rows round-robin, one per item, clamped to m threads.)
      parallel_items(m, hardware_threads(), [&](int64_t i) {
        nll[i] = token_nll(logits + i * vocab, vocab, win[first + i + 1]);
      });
      for (int i = 0; i < m; ++i) {
        nll_sum += nll[i];
        if (cb) {
          TokenScore s;
          s.index = base + first + i + 1;
          s.window = r.windows;
          s.pos_in_window = first + i;
          s.target = win[first + i + 1];
          s.nll = nll[i];
          s.logits = logits + static_cast<int64_t>(i) * vocab;
          cb(s);
        }
      }
      r.tokens += m;
      if (opt.progress) opt.progress->update(r.tokens);
    });
    ++r.windows;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.mean_nll = r.tokens > 0 ? nll_sum / r.tokens : 0.0;
  r.ppl = std::exp(r.mean_nll);
  return r;
}

}  // namespace kvpack
