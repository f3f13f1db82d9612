// libFuzzer target: any byte string either parses as a tuning table (`TuningTable::parse`, the reader behind
// `kvpack bench --table` and plan()) or throws kvpack::Error. A parsed table holds only entries plan_decode accepts,
// and writing it back (`to_json`) and parsing that gives the same JSON again.
// Seeds: bench/results/tune_*.json (see docs/PERFORMANCE.md, "The tuning table").
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvpack/decode.h"
#include "kvpack/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto t = kvpack::TuningTable::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& e : t.entries) {
      const bool ok = e.num_kv_heads >= 1 && e.num_qo_heads % e.num_kv_heads == 0 &&
                      e.num_qo_heads / e.num_kv_heads <= 8 && (e.head_dim == 64 || e.head_dim == 128) &&
                      e.page_size >= 16 && e.page_size <= 128 && (e.page_size & (e.page_size - 1)) == 0 &&
                      e.batch >= 1 && e.context >= 1 && e.num_splits >= 1 && e.stages >= 2 && e.stages <= 8 &&
                      e.median_us >= 0 && (e.kernel == "regular" || e.kernel == "lean") && e.leaf >= -1 &&
                      e.leaf <= 1 && (e.leaf == -1 || e.kernel == "lean");
      if (!ok) std::abort();
    }
    const std::string j = t.to_json();
    if (kvpack::TuningTable::parse(j, "fuzz (written back)").to_json() != j) std::abort();
  } catch (const kvpack::Error&) {
  }
  return 0;
}
