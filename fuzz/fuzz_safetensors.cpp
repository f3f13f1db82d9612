// libFuzzer target: any byte string either parses as a safetensors file or throws kvpack::Error; every tensor of a
// parsed file must lie inside the input (checked by touching its bytes under ASan) and convert to fp32.
// Seed with tests/data/safetensors/*.safetensors (see docs/MODEL_FILES.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kvpack/error.h"
#include "kvpack/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = kvpack::SafetensorsFile::from_memory(data, size, "fuzz");
    size_t covered = 0;
    for (const auto& t : f.tensors()) {
      if (t.n_bytes != static_cast<size_t>(t.numel()) * kvpack::st_dtype_size(t.dtype)) std::abort();
      covered += t.n_bytes;
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < t.n_bytes; ++i) sink = sink ^ t.data[i];  // ASan flags any byte outside the input
      if (kvpack::st_dtype_is_float(t.dtype)) {
        std::vector<float> out = kvpack::to_float(t);
        if (out.size() != static_cast<size_t>(t.numel())) std::abort();
      } else {
        try {
          kvpack::to_float(t);
          std::abort();  // integer dtypes must be refused
        } catch (const kvpack::Error&) {
        }
      }
      if (f.find(t.name) != &t) std::abort();
    }
    // Accepted files are tiled exactly: 8 + header + tensor bytes == input size.
    if (8 + f.header_size() + covered != size) std::abort();
  } catch (const kvpack::Error&) {
  }
  return 0;
}
