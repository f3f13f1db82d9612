// The tuning tables embedded in the library (generated from bench/results/*.json by CMake).
#pragma once

namespace kvpack::detail {

struct BuiltinTableText {
  const char* name;  // the file it was embedded from, e.g. "tune_h100_v1.json"
  const char* json;  // its text
};
extern const BuiltinTableText kBuiltinTables[];
extern const int kNumBuiltinTables;

}  // namespace kvpack::detail
