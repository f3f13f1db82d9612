#include "kvpack/error.h"
#include "kvpack/model_config.h"

namespace kvpack {

void validate(const ModelConfig& c, const std::string& source) {
  auto positive = [&](const char* field, int64_t v) {
    KVPACK_CHECK(v > 0, "{}: model field '{}' must be positive, got {}", source, field, v);
  };
  positive("n_layers", c.n_layers);
  positive("d_model", c.d_model);
  positive("n_heads", c.n_heads);
  positive("n_kv_heads", c.n_kv_heads);
  positive("head_dim", c.head_dim);
  positive("vocab_size", c.vocab_size);
  positive("max_context", c.max_context);
  KVPACK_CHECK(c.n_heads % c.n_kv_heads == 0, "{}: n_heads ({}) is not a multiple of n_kv_heads ({})", source,
               c.n_heads, c.n_kv_heads);
  KVPACK_CHECK(c.head_dim % 2 == 0, "{}: head_dim ({}) must be even for RoPE", source, c.head_dim);
  KVPACK_CHECK(c.rope_theta > 0, "{}: rope_theta must be positive, got {}", source, c.rope_theta);
}

}  // namespace kvpack
