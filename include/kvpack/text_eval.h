// Windowed negative log-likelihood of a token stream under the CPU reference runner (`kvpack ppl`, and the base of
// `kvpack eval`). The text is cut into non-overlapping windows; each window starts with an empty KV cache (and BOS
// when the model adds one), so every window is scored exactly as a fresh prompt of that length would be.
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "kvpack/kv_codec.h"

namespace kvpack {

class LlamaModel;
class Progress;

// One scored position: logits (the model's raw output at the previous position) predicting tokens[index].
struct TokenScore {
  int64_t index = 0;           // index into the scored token stream
  int window = 0;              // which window
  int pos_in_window = 0;       // position of the predicting token in its window (KV-cache position)
  int32_t target = 0;          // tokens[index]
  double nll = 0;              // -log softmax(logits)[target], fp64 accumulation
  const float* logits = nullptr;  // [vocab]; valid only during the callback
};
using TokenScoreCallback = std::function<void(const TokenScore&)>;

struct ScoreOptions {
  int window = 0;                   // tokens per window including BOS; 0 = the model's max_context (capped at 8192)
  int bos = -2;                     // -2: the model decides (LlamaModel::add_bos/bos_id); -1: none; else this id
  const KvCodec* codec = nullptr;   // nullptr = bf16 cache
  ForwardObserver* observer = nullptr;
  int chunk = 256;                  // prefill chunk (bounds the [chunk, vocab] logits buffer)
  Progress* progress = nullptr;     // updated with the number of scored tokens
};

struct TextScore {
  int64_t tokens = 0;   // positions scored
  int windows = 0;
  double mean_nll = 0;  // nats per token
  double ppl = 0;       // exp(mean_nll)
  double seconds = 0;
  int window = 0;       // the window actually used
};

// Scores `tokens` (no BOS; it is added per window when the model uses one). With BOS every token is scored (the first
// of a window from BOS); without, the first token of each window only serves as context. The last window may be short.
TextScore score_text(const LlamaModel& model, std::span<const int32_t> tokens, const ScoreOptions& opt = {},
                     const TokenScoreCallback& cb = {});

// -log softmax(logits)[target] over n logits, fp64 accumulation.
double token_nll(const float* logits, int n, int32_t target);

}  // namespace kvpack
