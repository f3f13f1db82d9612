// CPU reference Llama forward pass: fp32 activations, OpenBLAS sgemm for every matrix product (projections, QK^T,
// PV, logits), parallel_items (kvpack/parallel.h) for the element-wise work OpenBLAS does not parallelize
// (softmax, RoPE, SwiGLU).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <thread>

#include "kvpack/error.h"
#include "kvpack/llama.h"
#include "kvpack/parallel.h"

namespace kvpack {
namespace {

// Runs fn(begin, end) over [0, n) split into hardware_threads() ranges (parallel_items); inline when the work is
// small, because a thread start (~20 us) costs more than a few thousand multiply-adds.
template <typename Fn>
void parallel_for(int64_t n, int64_t cost_per_item, Fn fn) {
  const int workers = static_cast<int>(std::min<int64_t>(hardware_threads(), n));
  if (workers <= 1 || n * cost_per_item < 200000) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t per = (n + workers - 1) / workers;
  parallel_items(workers, workers, [&](int64_t w) {
    const int64_t b = w * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

// y[n, out] = x[n, in] * W[out, in]^T (+ beta * y)
void linear(const float* x, int n, int in, const std::vector<float>& w, int out, float* y, float beta = 0.0f) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w.data(), in, beta, y, out);
}

void add_bias(float* y, int n, const std::vector<float>& b) {
  if (b.empty()) return;
  const int m = static_cast<int>(b.size());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) y[static_cast<int64_t>(i) * m + j] += b[j];
}

void rms_norm(const float* x, int n, int d, const std::vector<float>& w, double eps, float* y) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * d;
    float* yi = y + static_cast<int64_t>(i) * d;
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += static_cast<double>(xi[j]) * xi[j];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int j = 0; j < d; ++j) yi[j] = xi[j] * r * w[j];
  }
}

}  // namespace

std::vector<double> rope_inv_freq(const ModelConfig& c, std::span<const float> freq_factors) {
  const int half = c.head_dim / 2;
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) f[i] = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
  const auto& s = c.rope_scaling;
  if (s.type == "linear") {
    for (auto& v : f) v /= s.factor;
  } else if (s.type == "llama3") {
    // Llama-3.1: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated smoothly
    // (same formula as transformers' _compute_llama3_parameters and llama.cpp's rope_freqs).
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
    for (auto& v : f) {
      const double wavelen = 2.0 * std::numbers::pi / v;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        v /= s.factor;
        continue;
      }
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      v = (1.0 - smooth) * v / s.factor + smooth * v;
    }
  } else {
    KVPACK_CHECK(s.type == "none" || s.type.empty() || s.type == "default",
                 "rope_scaling type '{}' is not supported (supported: none, linear, llama3)", s.type);
  }
  if (!freq_factors.empty()) {
    KVPACK_CHECK(freq_factors.size() == f.size(), "rope_freqs has {} factors, expected head_dim/2 = {}",
                 freq_factors.size(), f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      KVPACK_CHECK(freq_factors[i] > 0, "rope_freqs[{}] = {} is not positive", i, freq_factors[i]);
      f[i] /= freq_factors[i];
    }
  }
  return f;
}

std::unique_ptr<KvCodec> make_fp32_codec() {
  class Fp32Codec final : public KvCodec {
   public:
    std::string name() const override { return "fp32"; }
    void store(int, KvKind, int, const int*, int, int, float*) const override {}
  };
  return std::make_unique<Fp32Codec>();
}

LlamaSession::LlamaSession(const LlamaModel& model, int max_context, const KvCodec* codec, ForwardObserver* observer)
    : model_(model), cfg_(model.config()), codec_(codec), observer_(observer), max_ctx_(max_context) {
  KVPACK_CHECK(max_context > 0, "LlamaSession: max_context must be positive, got {}", max_context);
  if (!codec_) {
    own_codec_ = make_bf16_codec();
    codec_ = own_codec_.get();
  }
  const int64_t kv = static_cast<int64_t>(cfg_.n_layers) * max_ctx_ * cfg_.n_kv_heads * cfg_.head_dim;
  k_cache_.assign(kv, 0.0f);
  v_cache_.assign(kv, 0.0f);
  const int half = cfg_.head_dim / 2;
  const auto inv = rope_inv_freq(cfg_, model.weights().rope_freq_factors);
  cos_.resize(static_cast<int64_t>(max_ctx_) * half);
  sin_.resize(cos_.size());
  for (int p = 0; p < max_ctx_; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * inv[i];
      cos_[static_cast<int64_t>(p) * half + i] = static_cast<float>(std::cos(a));
      sin_[static_cast<int64_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
}

LlamaSession::~LlamaSession() = default;

void LlamaSession::set_chunk_size(int n) {
  KVPACK_CHECK(n > 0, "LlamaSession: chunk size must be positive, got {}", n);
  chunk_ = n;
}

void LlamaSession::forward(std::span<const int32_t> tokens, const LogitsCallback& logits_cb) {
  KVPACK_CHECK(pos_ + static_cast<int64_t>(tokens.size()) <= max_ctx_,
               "LlamaSession: {} tokens at position {} exceed the session's max_context {}", tokens.size(), pos_,
               max_ctx_);
  std::vector<float> logits;
  for (size_t off = 0; off < tokens.size(); off += chunk_) {
    const int n = static_cast<int>(std::min<size_t>(chunk_, tokens.size() - off));
    const int first = pos_;
    if (logits_cb) logits.resize(static_cast<size_t>(n) * cfg_.vocab_size);
    run_chunk(tokens.data() + off, n, logits_cb ? logits.data() : nullptr);
    if (logits_cb) logits_cb(first, n, logits.data());
  }
}

std::vector<float> LlamaSession::forward_last(std::span<const int32_t> tokens) {
  KVPACK_CHECK(!tokens.empty(), "LlamaSession::forward_last: no tokens");
  std::vector<float> last(cfg_.vocab_size);
  const size_t n_all = tokens.size();
  // Only the final chunk needs logits; earlier chunks skip the output projection.
  const size_t tail = (n_all - 1) % chunk_ + 1;
  forward(tokens.first(n_all - tail), {});
  forward(tokens.last(tail), [&](int, int n, const float* l) {
    std::memcpy(last.data(), l + static_cast<int64_t>(n - 1) * cfg_.vocab_size, last.size() * sizeof(float));
  });
  return last;
}

std::vector<int32_t> LlamaSession::generate_greedy(std::span<const int32_t> prompt, int max_new_tokens,
                                                   const std::function<void(int32_t)>& on_token) {
  std::vector<int32_t> out;
  if (max_new_tokens <= 0) return out;
  auto argmax = [](const std::vector<float>& l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());  // first maximum on ties
  };
  int32_t next = argmax(forward_last(prompt));
  for (;;) {
    out.push_back(next);
    if (on_token) on_token(next);
    if (model_.is_eog(next) || static_cast<int>(out.size()) >= max_new_tokens || pos_ >= max_ctx_) break;
    next = argmax(forward_last(std::span<const int32_t>(&next, 1)));
  }
  return out;
}

void LlamaSession::run_chunk(const int32_t* tokens, int n, float* logits_out) {
  const auto& W = model_.weights();
  const int d = cfg_.d_model, hd = cfg_.head_dim, nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, dff = cfg_.d_ff;
  const int qdim = nh * hd, kvdim = nkv * hd, half = hd / 2;
  x_.resize(static_cast<size_t>(n) * d);
  h_.resize(x_.size());
  q_.resize(static_cast<size_t>(n) * qdim);
  k_.resize(static_cast<size_t>(n) * kvdim);
  v_.resize(k_.size());
  att_.resize(q_.size());
  gate_.resize(static_cast<size_t>(n) * dff);
  up_.resize(gate_.size());
  positions_.resize(n);
  for (int i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    KVPACK_CHECK(t >= 0 && t < cfg_.vocab_size, "token id {} at position {} is outside the vocabulary [0, {})", t,
                 pos_ + i, cfg_.vocab_size);
    std::memcpy(&x_[static_cast<size_t>(i) * d], &W.tok_embd[static_cast<size_t>(t) * d], d * sizeof(float));
    positions_[i] = pos_ + i;
  }

  // Rotates `heads` vectors of head_dim per token in place at the chunk's positions.
  auto rope = [&](float* v, int heads) {
    parallel_for(n, int64_t{heads} * hd * 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float* c = &cos_[static_cast<size_t>(positions_[i]) * half];
        const float* s = &sin_[static_cast<size_t>(positions_[i]) * half];
        for (int h = 0; h < heads; ++h) {
          float* x = v + (i * heads + h) * hd;
          for (int j = 0; j < half; ++j) {
            // NeoX pairs (j, j + half); interleaved pairs (2j, 2j + 1).
            float& a = W.rope_style == RopeStyle::NeoX ? x[j] : x[2 * j];
            float& bb = W.rope_style == RopeStyle::NeoX ? x[j + half] : x[2 * j + 1];
            const float x0 = a, x1 = bb;
            a = x0 * c[j] - x1 * s[j];
            bb = x1 * c[j] + x0 * s[j];
          }
        }
      }
    });
  };

  const int64_t layer_stride = static_cast<int64_t>(max_ctx_) * kvdim;
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const auto& L = W.layers[l];
    rms_norm(x_.data(), n, d, L.attn_norm, cfg_.rms_eps, h_.data());
    linear(h_.data(), n, d, L.wq, qdim, q_.data());
    linear(h_.data(), n, d, L.wk, kvdim, k_.data());
    linear(h_.data(), n, d, L.wv, kvdim, v_.data());
    add_bias(q_.data(), n, L.bq);
    add_bias(k_.data(), n, L.bk);
    add_bias(v_.data(), n, L.bv);
    rope(q_.data(), nh);
    rope(k_.data(), nkv);
    if (observer_) observer_->on_attention_inputs(l, n, positions_.data(), q_.data(), k_.data(), v_.data());
    // The seam: K/V go into the cache, the codec replaces them with what the format stores, and attention below
    // reads only the cache, including this chunk's own keys/values.
    float* kc = &k_cache_[l * layer_stride + static_cast<int64_t>(pos_) * kvdim];
    float* vc = &v_cache_[l * layer_stride + static_cast<int64_t>(pos_) * kvdim];
    std::memcpy(kc, k_.data(), k_.size() * sizeof(float));
    std::memcpy(vc, v_.data(), v_.size() * sizeof(float));
    codec_->store(l, KvKind::K, n, positions_.data(), nkv, hd, kc);
    codec_->store(l, KvKind::V, n, positions_.data(), nkv, hd, vc);
    attention(l, n, q_.data(), att_.data());
    linear(att_.data(), n, qdim, L.wo, d, x_.data(), 1.0f);  // residual: x += att Wo^T

    rms_norm(x_.data(), n, d, L.ffn_norm, cfg_.rms_eps, h_.data());
    linear(h_.data(), n, d, L.w_gate, dff, gate_.data());
    linear(h_.data(), n, d, L.w_up, dff, up_.data());
    parallel_for(static_cast<int64_t>(n) * dff, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float g = gate_[i];
        gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];  // SwiGLU: silu(gate) * up
      }
    });
    linear(gate_.data(), n, dff, L.w_down, d, x_.data(), 1.0f);  // residual: x += ffn
  }
  pos_ += n;
  if (!logits_out) return;
  rms_norm(x_.data(), n, d, W.output_norm, cfg_.rms_eps, h_.data());
  linear(h_.data(), n, d, W.output.empty() ? W.tok_embd : W.output, cfg_.vocab_size, logits_out);
}

// Causal attention of the chunk's n queries (positions pos_..pos_+n-1) over the cache [0, pos_+n) of layer l.
void LlamaSession::attention(int l, int n, const float* q, float* out) {
  const int hd = cfg_.head_dim, nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, group = cfg_.group_size();
  const int qdim = nh * hd, kvdim = nkv * hd;
  const int T = pos_ + n;  // keys visible to the last query
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const int64_t per_head = static_cast<int64_t>(n) * T;
  scores_.resize(per_head * nh);  // [n_heads, n, T]
  const float* kbase = &k_cache_[static_cast<int64_t>(l) * max_ctx_ * kvdim];
  const float* vbase = &v_cache_[static_cast<int64_t>(l) * max_ctx_ * kvdim];
  for (int h = 0; h < nh; ++h) {
    const int g = h / group;  // GQA: query head h reads kv head h / group
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, T, hd, scale, q + h * hd, qdim, kbase + g * hd, kvdim,
                0.0f, &scores_[h * per_head], T);
  }
  // Softmax over keys j <= pos_ + i; later keys get weight exactly 0 so the PV product can run over all T.
  parallel_for(static_cast<int64_t>(nh) * n, T * 6, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* s = &scores_[r * T];
      const int valid = pos_ + static_cast<int>(r % n) + 1;
      float mx = s[0];
      for (int j = 1; j < valid; ++j) mx = std::max(mx, s[j]);
      float sum = 0.0f;
      for (int j = 0; j < valid; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const float inv = 1.0f / sum;
      for (int j = 0; j < valid; ++j) s[j] *= inv;
      std::fill(s + valid, s + T, 0.0f);
    }
  });
  for (int h = 0; h < nh; ++h) {
    const int g = h / group;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, T, 1.0f, &scores_[h * per_head], T,
                vbase + g * hd, kvdim, 0.0f, out + h * hd, qdim);
  }
}

}  // namespace kvpack
