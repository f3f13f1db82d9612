// Binds the quality harness (WindowLogits, RulerModel) to the CPU reference runner and the format codecs.
#include <algorithm>
#include <map>

#include "kvpack/calibration.h"
#include "kvpack/codec.h"
#include "kvpack/error.h"
#include "kvpack/eval.h"
#include "kvpack/llama.h"
#include "kvpack/tokenizer.h"

namespace kvpack {
namespace {

// K through one codec, V through another: a format on one half with bf16 on the other (QuantizedKinds::k / ::v), or
// a row's format on K with another on V (--v-format).
class SplitCodec final : public KvCodec {
 public:
  SplitCodec(std::unique_ptr<KvCodec> k, std::unique_ptr<KvCodec> v, std::string name)
      : k_(std::move(k)), v_(std::move(v)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void store(int layer, KvKind kind, int n_tokens, const int* positions, int n_kv_heads, int head_dim,
             float* x) const override {
    (kind == KvKind::K ? k_ : v_)->store(layer, kind, n_tokens, positions, n_kv_heads, head_dim, x);
  }

 private:
  std::unique_ptr<KvCodec> k_, v_;
  std::string name_;
};

// One codec per format, made on first use (make_codec checks the calibration against the model and names what is
// missing, e.g. a q3 run with a file calibrated without q3). bf16 is the reference and is never restricted.
class CodecCache {
 public:
  CodecCache(const LlamaModel& m, const Calibration* c, QuantizedKinds q, std::optional<Format> v = std::nullopt)
      : model_(m), calib_(c), kinds_(q), v_format_(v) {}
  const KvCodec* get(Format f) {
    auto it = codecs_.find(f);
    if (it == codecs_.end()) {
      auto c = make_codec(f, model_.config(), calib_);
      if (v_format_ && f != Format::bf16) {
        auto v = make_codec(*v_format_, model_.config(), calib_);
        const std::string name = c->name() + " K + " + v->name() + " V";
        c = std::make_unique<SplitCodec>(std::move(c), std::move(v), name);
      }
      if (kinds_ != QuantizedKinds::kv && f != Format::bf16) {
        const std::string name = c->name() + (kinds_ == QuantizedKinds::k ? " (K only)" : " (V only)");
        if (kinds_ == QuantizedKinds::k)
          c = std::make_unique<SplitCodec>(std::move(c), make_bf16_codec(), name);
        else
          c = std::make_unique<SplitCodec>(make_bf16_codec(), std::move(c), name);
      }
      it = codecs_.emplace(f, std::move(c)).first;
    }
    return it->second.get();
  }

 private:
  const LlamaModel& model_;
  const Calibration* calib_;
  QuantizedKinds kinds_;
  std::optional<Format> v_format_;
  std::map<Format, std::unique_ptr<KvCodec>> codecs_;
};

class ModelWindowLogits final : public WindowLogits {
 public:
  ModelWindowLogits(const LlamaModel& m, const Calibration* c, QuantizedKinds q, std::optional<Format> v)
      : model_(m), codecs_(m, c, q, v) {}
  int vocab_size() const override { return model_.config().vocab_size; }
  void run(Format f, std::span<const int32_t> tokens,
           const std::function<void(int, int, const float*)>& cb) override {
    // A fresh sequence per window: the session's cache is sized to the window, so no stale positions exist.
    LlamaSession s(model_, static_cast<int>(tokens.size()), codecs_.get(f));
    s.forward(tokens, [&](int first, int n, const float* logits) { cb(first, n, logits); });
  }

 private:
  const LlamaModel& model_;
  CodecCache codecs_;
};

int argmax_of(const std::vector<float>& l) {
  return static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());  // first maximum on ties
}

class ModelRuler final : public RulerModel {
 public:
  ModelRuler(const LlamaModel& m, const Calibration* c, int max_context, QuantizedKinds q)
      : model_(m), tok_(m.tokenizer()), codecs_(m, c, q), max_ctx_(max_context) {}

  std::vector<int32_t> prompt_tokens(const RulerSample& s) const override {
    // Chat-templated question, then the answer prefix inside the assistant turn (RULER's answer_prefix).
    const std::string text = tok_.apply_chat_template({{"user", s.user}}, true) + s.answer_prefix;
    std::vector<int32_t> ids = tok_.encode(text, model_.add_bos(), true);
    KVPACK_CHECK(static_cast<int>(ids.size()) <= max_ctx_, "ruler: {} sample {} prompt has {} tokens > context {}",
                 ruler_task_name(s.task), s.index, ids.size(), max_ctx_);
    return ids;
  }
  std::vector<int32_t> encode_continuation(const std::string& text) const override {
    return tok_.encode(text, false, false);
  }
  std::string decode(std::span<const int32_t> tokens) const override {
    std::vector<int32_t> kept;
    for (int32_t t : tokens)
      if (!tok_.is_special(t)) kept.push_back(t);
    return tok_.decode(kept);
  }
  int vocab_size() const override { return model_.config().vocab_size; }

  // Greedy decoding doubles as teacher forcing while it agrees with the gold answer (same prefix, same logits), so a
  // correct answer costs one prefill. After a divergence the remaining gold positions need the gold prefix: a second
  // session prefills prompt + gold and reports only those positions.
  std::vector<int32_t> answer(Format f, std::span<const int32_t> prompt, std::span<const int32_t> gold, int max_new,
                              const std::function<void(int, const float*)>& gold_cb) override {
    const int k = static_cast<int>(gold.size());
    const int limit = std::max(max_new, k + 8);
    const int P = static_cast<int>(prompt.size());
    const KvCodec* codec = codecs_.get(f);
    std::vector<int32_t> out;
    int reported = 0;
    bool following = true;
    {
      LlamaSession s(model_, std::min(max_ctx_, P + limit + 1), codec);
      std::vector<float> logits = s.forward_last(prompt);
      std::string text;
      for (;;) {
        const int t = static_cast<int>(out.size());
        if (following && t < k) {
          gold_cb(t, logits.data());
          reported = t + 1;
        }
        const int32_t next = argmax_of(logits);
        out.push_back(next);
        if (following && (t >= k || next != gold[static_cast<size_t>(t)])) following = false;
        if (model_.is_eog(next) || static_cast<int>(out.size()) >= limit || s.position() >= s.max_context()) break;
        // A blank line ends the answer (the model moved on); single newlines may separate listed values.
        text += tok_.token_bytes(next);
        if (text.find("\n\n") != std::string::npos) break;
        // Once the gold span is fully reported and the answer diverged, only the answer text matters.
        logits = s.forward_last(std::span<const int32_t>(&next, 1));
      }
    }
    if (reported < k) {
      // Positions P-1+j predict gold[j]; prefill without logits up to the first missing one.
      std::vector<int32_t> seq(prompt.begin(), prompt.end());
      seq.insert(seq.end(), gold.begin(), gold.end() - 1);
      LlamaSession s(model_, static_cast<int>(seq.size()), codec);
      const size_t head = static_cast<size_t>(P - 1 + reported);
      s.forward(std::span<const int32_t>(seq).first(head), {});
      const int V = vocab_size();
      s.forward(std::span<const int32_t>(seq).subspan(head), [&](int first, int n, const float* logits) {
        for (int i = 0; i < n; ++i) gold_cb(first + i - (P - 1), logits + static_cast<size_t>(i) * V);
      });
    }
    return out;
  }

 private:
  const LlamaModel& model_;
  const Tokenizer& tok_;
  CodecCache codecs_;
  int max_ctx_;
};

}  // namespace

QuantizedKinds parse_quantized_kinds(const std::string& s) {
  if (s == "kv") return QuantizedKinds::kv;
  if (s == "k") return QuantizedKinds::k;
  if (s == "v") return QuantizedKinds::v;
  fail("quantized kinds '{}': expected kv, k or v", s);
}
const char* quantized_kinds_name(QuantizedKinds q) {
  return q == QuantizedKinds::k ? "k" : q == QuantizedKinds::v ? "v" : "kv";
}

std::unique_ptr<WindowLogits> make_model_window_logits(const LlamaModel& model, const Calibration* calib,
                                                       QuantizedKinds kinds, std::optional<Format> v_format) {
  return std::make_unique<ModelWindowLogits>(model, calib, kinds, v_format);
}

std::unique_ptr<RulerModel> make_model_ruler(const LlamaModel& model, const Calibration* calib, int max_context,
                                             QuantizedKinds kinds) {
  return std::make_unique<ModelRuler>(model, calib, max_context, kinds);
}

}  // namespace kvpack
