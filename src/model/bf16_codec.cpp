#include "kvpack/bf16.h"
#include "kvpack/kv_codec.h"

namespace kvpack {
namespace {
class Bf16Codec final : public KvCodec {
 public:
  std::string name() const override { return "bf16"; }
  void store(int, KvKind, int n_tokens, const int*, int n_kv_heads, int head_dim, float* x) const override {
    const long n = static_cast<long>(n_tokens) * n_kv_heads * head_dim;
    for (long i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
  }
};
}  // namespace

std::unique_ptr<KvCodec> make_bf16_codec() { return std::make_unique<Bf16Codec>(); }

}  // namespace kvpack
