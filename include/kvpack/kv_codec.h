// The seam between the CPU reference runner and the KV-cache formats.
//
// Every K/V vector the runner writes to its cache goes through KvCodec::store(), which replaces it, in place, with
// exactly what attention will read back (decode(encode(x))). Attention then reads only these stored values, so every
// position attends to the quantized K/V of all earlier positions, as in real decoding. For formats whose transforms
// are applied to the query (keys) or to the attention output (values), the round trip in the model's own basis is the
// same mathematics, so the runner needs no format knowledge.
#pragma once
#include <memory>
#include <string>

namespace kvpack {

enum class KvKind : int { K = 0, V = 1 };

class KvCodec {
 public:
  virtual ~KvCodec() = default;
  virtual std::string name() const = 0;
  // x: [n_tokens, n_kv_heads, head_dim] fp32 for one layer; K after RoPE, V as projected.
  // positions[i]: absolute position of token i in its sequence (sink tokens are positions < sink count).
  // Must be thread-safe (const) and deterministic.
  virtual void store(int layer, KvKind kind, int n_tokens, const int* positions, int n_kv_heads, int head_dim,
                     float* x) const = 0;
};

// bf16 identity codec: rounds to bf16 (round-to-nearest-even), as a bf16 cache stores it.
std::unique_ptr<KvCodec> make_bf16_codec();

// Observer for calibration: sees every layer's attention inputs during a forward pass.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // q: [n_tokens, n_heads, head_dim] after RoPE; k: [n_tokens, n_kv_heads, head_dim] after RoPE (before the codec);
  // v: [n_tokens, n_kv_heads, head_dim] (before the codec).
  virtual void on_attention_inputs(int layer, int n_tokens, const int* positions, const float* q, const float* k,
                                   const float* v) = 0;
};

}  // namespace kvpack
