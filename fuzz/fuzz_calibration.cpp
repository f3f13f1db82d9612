// libFuzzer target: any byte string either loads as a kvpack calibration file (`Calibration::load(path)`, the
// reader behind `kvpack inspect FILE.kvcal`, which takes the model shape from the file) or throws kvpack::Error.
// A loaded file must be self-consistent: every q format's slots fill the block, and the width-pattern summary
// counts every K and V slot once.
// Seeds: run the target once with KVPACK_FUZZ_SEED_DIR=DIR set to write a small valid file there (1 layer, 1 kv
// head, head_dim 64), then fuzz that directory (see docs/MODEL_FILES.md, fuzzing).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kvpack/block/q_lanes.h"
#include "kvpack/block/qx.h"
#include "kvpack/calibration.h"
#include "kvpack/error.h"

namespace {

std::string tmp_file() { return "/tmp/kvpack_fuzz_calibration_" + std::to_string(::getpid()) + ".kvcal"; }

void write_seed(const std::string& dir) {
  kvpack::ModelConfig c;
  c.name = "fuzz-seed";
  c.arch = "llama";
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.n_heads = 1;
  c.head_dim = 64;
  kvpack::Calibration cal(c, kvpack::calibration_model_id(c));
  for (kvpack::Format f : {kvpack::Format::q4, kvpack::Format::q3_5, kvpack::Format::q3}) {
    kvpack::QFormatTables& t = cal.q_mut(f);
    const int D = 64, G = D / 8, bytes = kvpack::block::q_code_bytes(t.bits_x2, D);
    for (int s = 0; s < t.n_slots; ++s) {
      // The format's fixed width pattern (block/q_lanes.h; slot s is K for even s, V for odd): the loader rejects
      // any other widths, so a seed with other widths would never reach the checks past that one.
      int sum = 0;
      for (int g = 0; g < G; ++g) {
        const int b = kvpack::block::lane_group_bits(t.bits_x2, D, s % 2 == 1, g);
        t.group_bits[static_cast<size_t>(s) * G + g] = static_cast<uint8_t>(b);
        sum += b;
      }
      if (sum != bytes) std::abort();
      for (int i = 0; i < D; ++i) {
        t.fwd[(static_cast<size_t>(s) * D + i) * D + i] = 1.0f;
        t.inv[(static_cast<size_t>(s) * D + i) * D + i] = 1.0f;
        t.step[static_cast<size_t>(s) * D + i] = 0.25f;
        t.rms_weight[static_cast<size_t>(s) * D + i] = 1.0f / D;
      }
    }
    t.derive();
  }
  cal.save(dir + "/seed.kvcal");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("KVPACK_FUZZ_SEED_DIR")) write_seed(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tmp_file();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    const kvpack::Calibration cal = kvpack::Calibration::load(path);
    if (cal.n_layers() <= 0 || cal.n_kv_heads() <= 0) std::abort();
    for (kvpack::Format fm : {kvpack::Format::q4, kvpack::Format::q3_5, kvpack::Format::q3}) {
      if (!cal.has(fm)) continue;
      const kvpack::QFormatTables& t = cal.q(fm);
      for (kvpack::KvKind kind : {kvpack::KvKind::K, kvpack::KvKind::V}) {
        int slots = 0;
        for (const auto& p : kvpack::width_patterns(t, kind)) {
          int bytes = 0;
          for (int b : p.bits) bytes += b;
          if (bytes != kvpack::block::q_code_bytes(t.bits_x2, cal.head_dim())) std::abort();
          slots += p.slots;
        }
        if (slots != cal.n_layers() * cal.n_kv_heads()) std::abort();
      }
    }
  } catch (const kvpack::Error&) {
  }
  std::remove(path.c_str());
  return 0;
}
