// libFuzzer target: any byte string either parses as a Hugging Face config.json (`parse_hf_config`, the reader
// behind the safetensors runner and `kvpack plan --model config.json`) or throws kvpack::Error. A parsed config
// passes kvpack::validate(), and its parameter count is positive (UBSan flags an overflow on the way).
// Seeds: tests/data/hf/*.json (see docs/MODEL_FILES.md, fuzzing).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvpack/error.h"
#include "kvpack/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto info = kvpack::parse_hf_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    kvpack::validate(info.config, "fuzz");
    if (info.config.n_params <= 0 || kvpack::count_params(info.config) != info.config.n_params) std::abort();
  } catch (const kvpack::Error&) {
  }
  return 0;
}
