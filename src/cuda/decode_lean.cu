// The lean decode kernel's instances (decode_lean.cuh): fp8 at head_dim 128 on sm_90, q4, q3.5 and q3 everywhere.
#include "decode_kernel.cuh"
#include "decode_lean.cuh"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace kvpack::cuda_detail {
bool launch_lean_decode(Format f, const DecodeKernelParams& kp, int head_dim, int batch, cudaStream_t st) {
  if (const int b2 = lane_bits_x2(f)) {
    // The q formats' lane layout has no other reader (the regular kernel reads token-major codes).
    KVPACK_CU_CHECK(lean_q_applies(), "decode: format '{}' needs a GPU of compute capability 8.0 or later",
                    format_name(f));
    if (b2 == 8) {
      if (head_dim == 64) launch_lean<64, 8>(kp, batch, st);
      else launch_lean<128, 8>(kp, batch, st);
    } else if (b2 == 7) {
      if (head_dim == 64) launch_lean<64, 7>(kp, batch, st);
      else launch_lean<128, 7>(kp, batch, st);
    } else {
      if (head_dim == 64) launch_lean<64, 6>(kp, batch, st);
      else launch_lean<128, 6>(kp, batch, st);
    }
    return true;
  }
  if (f != Format::fp8 || !lean_fp8_applies(head_dim, kp.num_qo_heads, kp.num_kv_heads)) return false;
  launch_lean<128, 0>(kp, batch, st);
  return true;
}
}  // namespace kvpack::cuda_detail

namespace kvpack {
bool lean_pdl_on() { return cuda_detail::lean_pdl_applies(); }

bool lean_stamps_reset() {
#ifdef KVPACK_LEAN_STAMPS
  const unsigned zero = 0;
  KVPACK_CUDA_CHECK(cudaMemcpyToSymbol(cuda_detail::g_stamp_n, &zero, sizeof zero));
  return true;
#else
  return false;
#endif
}
void append_stamp_records(const char* path, const char* label, const void* count_symbol, const void* records_symbol,
                          unsigned cap, int words) {
  unsigned n = 0;
  KVPACK_CUDA_CHECK(cudaMemcpyFromSymbol(&n, count_symbol, sizeof n));
  n = std::min(n, cap);
  std::vector<unsigned long long> r(size_t(n) * words);
  if (n) KVPACK_CUDA_CHECK(cudaMemcpyFromSymbol(r.data(), records_symbol, r.size() * sizeof(r[0])));
  FILE* f = std::fopen(path, "a");
  KVPACK_CHECK(f != nullptr, "bench: cannot open the stamps file '{}'", path);
  for (unsigned i = 0; i < n; ++i) {
    std::fprintf(f, "%s", label);
    for (int j = 0; j < words; ++j) std::fprintf(f, " %llu", r[size_t(i) * words + j]);
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}
// One line per record: label, then the 8 words (bench/tools/stamps.py).
bool lean_stamps_dump(const char* path, const char* label) {
#ifdef KVPACK_LEAN_STAMPS
  append_stamp_records(path, label, &cuda_detail::g_stamp_n, cuda_detail::g_stamps, cuda_detail::kStampCap, 8);
  return true;
#else
  (void)path, (void)label;
  return false;
#endif
}

void lean_force_merge_slices(int slices) { cuda_detail::g_force_merge_slices.store(slices); }
void lean_force_mix(int mix) { cuda_detail::g_force_mix.store(mix); }
void lean_force_general_instance(bool on) { cuda_detail::g_force_general.store(on); }
void lean_force_warp_only_instance(bool on) { cuda_detail::g_force_warp_only.store(on); }
void lean_force_group_fold(int mode) { cuda_detail::g_force_group_fold.store(mode); }
LeanLaunchInfo lean_last_launch() { return cuda_detail::g_last_lean; }

int lean_env_rule() {
  static const int rule = env_int("KVPACK_LEAN_RULE", 1);
  return rule;
}
int lean_ctas_per_sm(Format f, int head_dim) {
  using namespace cuda_detail;
  int n = 0;
  if (lane_bits_x2(f) == 8) n = head_dim == 64 ? lean_prepare<64, 8>() : lean_prepare<128, 8>();
  else if (lane_bits_x2(f) == 7) n = head_dim == 64 ? lean_prepare<64, 7>() : lean_prepare<128, 7>();
  else if (lane_bits_x2(f) == 6) n = head_dim == 64 ? lean_prepare<64, 6>() : lean_prepare<128, 6>();
  else if (f == Format::fp8 && head_dim == 128) n = lean_prepare<128, 0>();
  return n > 0 ? n : 3;  // no device (host-only planning) or no q kernel here: the sm_90a occupancy of q4 at D = 128
}
}  // namespace kvpack
