// Thin C ABI over kvpack's public decode API (include/kvpack/decode.h), for ctypes callers such as the FlashInfer
// baseline harness (bench/flashinfer/fi_bench.py). Not part of the library's supported interface.
//
// Pointers are passed as uint64 device addresses (torch's data_ptr()), streams as uint64 cudaStream_t (0 = the
// legacy default stream). Every function returns 0 (or a handle / size) on success and -1 (or null) on error; the
// message of the last error of the calling thread is kvpack_capi_last_error().
//
// Formats: those whose parameters are only the per-kv-head K/V scales (bf16, fp8, int4, int4h). The kvpack formats
// with calibrated transforms (q4, q3.5, q3) need per-layer tables and attention sinks that this ABI does not carry.
#include <cstdint>
#include <exception>
#include <string>

#include "kvpack/decode.h"
#include "kvpack/error.h"
#include "kvpack/formats.h"
#include "kvpack/paged.h"

namespace {

thread_local std::string g_last_error;

template <class F>
int64_t guarded(F&& f) {
  try {
    g_last_error.clear();
    return f();
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown exception";
  }
  return -1;
}

kvpack::Format capi_format(const char* name) {
  KVPACK_CHECK(name != nullptr, "kvpack_capi: format is null");
  const auto f = kvpack::parse_format(name);
  KVPACK_CHECK(f.has_value(), "kvpack_capi: unknown format '{}'", name);
  KVPACK_CHECK(*f == kvpack::Format::bf16 || *f == kvpack::Format::fp8 || *f == kvpack::Format::int4 ||
                   *f == kvpack::Format::int4h,
               "kvpack_capi: format '{}' needs calibrated parameters this ABI does not carry (bf16, fp8, int4, "
               "int4h only)",
               name);
  return *f;
}

template <class T>
T* ptr(uint64_t p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

struct CapiPlan {
  kvpack::DecodePlan plan;
  kvpack::PagedLayout layout;
};

}  // namespace

extern "C" {

const char* kvpack_capi_last_error(void) { return g_last_error.c_str(); }

// Library version string (static storage).
const char* kvpack_capi_version(void) {
  static const std::string v = kvpack::library_version();
  return v.c_str();
}

// Bytes of one page of one pool (K or V): num_kv_heads * head_block_bytes.
int64_t kvpack_capi_page_bytes(const char* format, int num_kv_heads, int head_dim, int page_size) {
  return guarded([&]() -> int64_t {
    return kvpack::make_paged_layout(capi_format(format), page_size, num_kv_heads, head_dim).page_bytes();
  });
}

// Host-side plan (plan_decode without a table: the running GPU's built-in tuning table, else the fallback).
// Returns an opaque handle or null; free it with kvpack_capi_plan_free.
void* kvpack_capi_plan_decode(const char* format, int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
                              int batch, int64_t max_context) {
  CapiPlan* out = nullptr;
  guarded([&]() -> int64_t {
    const kvpack::Format f = capi_format(format);
    auto* p = new CapiPlan;
    try {
      p->layout = kvpack::make_paged_layout(f, page_size, num_kv_heads, head_dim);
      p->plan = kvpack::plan_decode(kvpack::DecodeShape{f, num_qo_heads, num_kv_heads, head_dim, page_size}, batch,
                                    max_context);
    } catch (...) {
      delete p;
      throw;
    }
    out = p;
    return 0;
  });
  return out;
}

void kvpack_capi_plan_free(void* plan) { delete static_cast<CapiPlan*>(plan); }

// Device workspace run_decode needs (zero it once after allocation).
int64_t kvpack_capi_plan_workspace_bytes(void* plan) {
  return guarded([&]() -> int64_t {
    KVPACK_CHECK(plan != nullptr, "kvpack_capi: plan is null");
    return static_cast<int64_t>(static_cast<CapiPlan*>(plan)->plan.workspace_bytes);
  });
}

// num_splits and stages of the plan (for logs).
int kvpack_capi_plan_info(void* plan, int* num_splits, int* stages) {
  return static_cast<int>(guarded([&]() -> int64_t {
    KVPACK_CHECK(plan != nullptr, "kvpack_capi: plan is null");
    const auto& p = static_cast<CapiPlan*>(plan)->plan;
    if (num_splits) *num_splits = p.num_splits;
    if (stages) *stages = p.stages;
    return 0;
  }));
}

// Decode attention over HND pools with a vLLM block table:
//   q, out: [batch][num_qo_heads][head_dim] bf16; k_pool, v_pool: [num_pages][num_kv_heads][head_block_bytes]
//   (fp8: [num_pages][num_kv_heads][page_size][head_dim] e4m3); block_table: [batch][max_blocks_per_seq] int32;
//   seq_lens: [batch] int32; k_scale, v_scale: [num_kv_heads] fp32 or 0 (= 1); lse: [batch][num_qo_heads] fp32 or 0;
//   workspace: plan workspace bytes, zeroed once; status: device int32 or 0. sm_scale 0 = 1/sqrt(head_dim).
// Launch only (capturable in a CUDA graph).
int kvpack_capi_run_decode(void* plan, uint64_t q, uint64_t k_pool, uint64_t v_pool, int64_t num_pages,
                           uint64_t block_table, uint64_t seq_lens, int max_blocks_per_seq, uint64_t k_scale,
                           uint64_t v_scale, float sm_scale, uint64_t out, uint64_t lse, uint64_t workspace,
                           uint64_t status, uint64_t stream) {
  return static_cast<int>(guarded([&]() -> int64_t {
    KVPACK_CHECK(plan != nullptr, "kvpack_capi: plan is null");
    const auto& p = static_cast<CapiPlan*>(plan)->plan;
    kvpack::DecodeArgs a;
    a.q = ptr<const uint16_t>(q);
    a.k_pool = ptr<const uint8_t>(k_pool);
    a.v_pool = ptr<const uint8_t>(v_pool);
    a.num_pages = num_pages;
    a.table = kvpack::view_of(kvpack::BlockTable{ptr<const int32_t>(block_table), ptr<const int32_t>(seq_lens),
                                                 max_blocks_per_seq, p.batch});
    a.params.k_scale = ptr<const float>(k_scale);
    a.params.v_scale = ptr<const float>(v_scale);
    a.sm_scale = sm_scale;
    a.out = ptr<uint16_t>(out);
    a.lse = ptr<float>(lse);
    a.workspace = ptr<void>(workspace);
    a.status = ptr<int32_t>(status);
    kvpack::run_decode(p, a, ptr<void>(stream));
    return 0;
  }));
}

// Write path: encode bf16 K/V tokens ([num_tokens][num_kv_heads][head_dim]) into their slots
// (slot = page * page_size + offset, < 0 skipped). Scales as in kvpack_capi_run_decode.
int kvpack_capi_write_kv(const char* format, int num_kv_heads, int head_dim, int page_size, uint64_t k, uint64_t v,
                         uint64_t slot_mapping, int num_tokens, uint64_t k_pool, uint64_t v_pool, int64_t num_pages,
                         uint64_t k_scale, uint64_t v_scale, uint64_t status, uint64_t stream) {
  return static_cast<int>(guarded([&]() -> int64_t {
    const auto layout = kvpack::make_paged_layout(capi_format(format), page_size, num_kv_heads, head_dim);
    kvpack::WriteArgs a;
    a.k = ptr<const uint16_t>(k);
    a.v = ptr<const uint16_t>(v);
    a.slot_mapping = ptr<const int32_t>(slot_mapping);
    a.num_tokens = num_tokens;
    a.k_pool = ptr<uint8_t>(k_pool);
    a.v_pool = ptr<uint8_t>(v_pool);
    a.num_pages = num_pages;
    a.params.k_scale = ptr<const float>(k_scale);
    a.params.v_scale = ptr<const float>(v_scale);
    a.status = ptr<int32_t>(status);
    kvpack::write_kv(layout, a, ptr<void>(stream));
    return 0;
  }));
}

}  // extern "C"
