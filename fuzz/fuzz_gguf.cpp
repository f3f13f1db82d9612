// libFuzzer target for the GGUF reader: parse arbitrary bytes, then exercise what a loader would do with the
// result (metadata summaries, typed getters, model config, dequantizing a few tensors). Every failure must be a
// kvpack::Error; anything else (crash, sanitizer report, other exception) is a bug.
//
// Build: cmake -S . -B build-fuzz -DKVPACK_FUZZ=ON -DKVPACK_CUDA=OFF -DKVPACK_TESTS=OFF \
//          -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz --target fuzz_gguf
// Run:   build-fuzz/fuzz_gguf fuzz/corpus-gguf tests/data/gguf/seeds -max_total_time=600 -rss_limit_mb=2048
#include <cstddef>
#include <cstdint>

#include "kvpack/error.h"
#include "kvpack/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = kvpack::GgufFile::from_memory(data, size, "fuzz.gguf");
    for (const auto& k : f.keys()) {
      const kvpack::GgufValue* v = f.find(k);
      (void)v->summary();
      (void)v->type_string();
      if (v->is_array()) {
        try { (void)f.get_int_array(k); } catch (const kvpack::Error&) {}
        try { (void)f.get_float_array(k); } catch (const kvpack::Error&) {}
        try { (void)f.get_string_array(k); } catch (const kvpack::Error&) {}
      }
    }
    // Dequantize up to 4 small tensors (the cap keeps each run fast; sizes are already checked against the file).
    int n = 0;
    for (const auto& t : f.tensors()) {
      if (n >= 4) break;
      if (!kvpack::ggml_type_supported(t.type) || t.n_elements > (1 << 16)) continue;
      (void)f.dequantize(t);
      ++n;
    }
    (void)kvpack::model_config_from_gguf(f);
  } catch (const kvpack::Error&) {
  }
  return 0;
}
