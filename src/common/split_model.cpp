// The wave model behind plan_decode's split count (include/kvpack/decode.h): host code, so CI tests it.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kvpack/decode.h"
#include "kvpack/error.h"

namespace kvpack {

int wave_model_splits(int64_t units, int64_t chunks, int64_t slots) {
  KVPACK_CHECK(units >= 1 && chunks >= 1 && slots >= 1, "wave_model_splits: units {}, chunks {}, slots {} must be >= 1",
               units, chunks, slots);
  // Costs in half-chunk steps: 2 per chunk of a CTA plus 1 for the CTA itself.
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t sp = 1; sp <= std::min<int64_t>(chunks, 4096); ++sp) {
    const int64_t waves = (units * sp + slots - 1) / slots;
    const int64_t cost = waves * (2 * ((chunks + sp - 1) / sp) + 1);
    if (cost < best_cost) {
      best_cost = cost;
      best = sp;
    }
  }
  return static_cast<int>(best);
}

}  // namespace kvpack
