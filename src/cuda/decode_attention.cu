// Decode attention host side: workspace layout, shared-memory sizes, argument checks and the launch dispatch.
// The kernel itself is decode_kernel.cuh, compiled once per format in decode_<format>.cu.
#include "decode_kernel.cuh"

namespace kvpack {

using namespace cuda_detail;

namespace {
// The regular kernel's ring stage; the q formats decode on the lean kernel, whose ring is not counted in the plan's
// stages: nothing.
template <class P, int D>
size_t stage_bytes_of() {
  if constexpr (P::kQ) return 0;
  else return Geo<P, D>::kStageBytes;
}
}  // namespace

size_t decode_stage_bytes(Format f, int head_dim) {
  return KVPACK_DISPATCH_FORMAT(f, P, [&]() -> size_t {
    return KVPACK_DISPATCH_HEAD_DIM(head_dim, D, [&]() -> size_t { return stage_bytes_of<P, D>(); });
  });
}
size_t decode_smem_bytes(Format f, int head_dim, int group, int stages) {
  const int gmax = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
  size_t extra = 0;
  switch (gmax) {
    case 1: extra = smem_extra_bytes<1>(head_dim); break;
    case 2: extra = smem_extra_bytes<2>(head_dim); break;
    case 4: extra = smem_extra_bytes<4>(head_dim); break;
    default: extra = smem_extra_bytes<8>(head_dim); break;
  }
  return size_t(stages) * decode_stage_bytes(f, head_dim) + extra;
}

int decode_ctas_per_sm(Format f, int head_dim, int group, int stages) {
  return KVPACK_DISPATCH_FORMAT(f, P, [&]() -> int { return ctas_per_sm_format<P>(head_dim, group, stages); });
}

namespace {
size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// The workspace, one layout for its size and its pointers: chunk partials (acc, then (m, l)), the per-(sequence,
// kv head) arrival counters, the per-fold-group counters, then the lean q kernels' prepared queries (fragments, head
// constants: 8 padded heads per (sequence, kv head)).
struct WorkspaceLayout {
  size_t ml_off, sem_off, fold_sem_off, qh_off, qc_off, bytes;
  int max_groups;
};
WorkspaceLayout workspace_layout(const DecodeShape& s, int batch, int max_chunks) {
  const int group = s.num_qo_heads / s.num_kv_heads;
  const size_t n = size_t(batch) * s.num_kv_heads * max_chunks * group;
  WorkspaceLayout w;
  w.max_groups = (max_chunks + kFoldChunks - 1) / kFoldChunks;
  w.ml_off = align256(n * s.head_dim * sizeof(float));
  w.sem_off = w.ml_off + align256(n * sizeof(float2));
  w.fold_sem_off = w.sem_off + align256(size_t(batch) * s.num_kv_heads * sizeof(int));
  w.qh_off = w.fold_sem_off + align256(size_t(batch) * s.num_kv_heads * w.max_groups * sizeof(int));
  w.qc_off = w.qh_off + align256(size_t(batch) * s.num_kv_heads * 8 * s.head_dim * sizeof(uint16_t));
  w.bytes = w.qc_off + align256(size_t(batch) * s.num_kv_heads * 8 * 4 * sizeof(float));
  return w;
}
}  // namespace

size_t decode_workspace_bytes(const DecodeShape& s, int batch, int max_chunks) {
  return workspace_layout(s, batch, max_chunks).bytes;
}

namespace {
// run_decode's checks (every one before any launch) and its kernels' parameters; after_write: decode_step's
// (DecodeKernelParams::prep_after_write).
DecodeKernelParams decode_params(const DecodePlan& plan, const DecodeArgs& a, bool after_write) {
  const DecodeShape& s = plan.shape;
  KVPACK_CU_CHECK(a.q && a.out, "run_decode: null q or out");
  KVPACK_CU_CHECK(a.k_pool && a.v_pool, "run_decode: null K or V page pool");
  KVPACK_CU_CHECK(a.table.pages, "run_decode: null page table (pages/indices)");
  KVPACK_CU_CHECK(reinterpret_cast<uintptr_t>(a.k_pool) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v_pool) % 16 == 0,
                  "run_decode: K and V page pools must be 16-byte aligned (tiles are copied in 16-byte pieces)");
  KVPACK_CU_CHECK(a.table.seq_lens || (a.table.row_start && a.table.last_page_len),
               "run_decode: page table needs seq_lens, or indptr and last_page_len");
  KVPACK_CU_CHECK(a.table.row_start || a.table.row_stride > 0, "run_decode: block table needs max_blocks_per_seq > 0");
  KVPACK_CU_CHECK(a.table.batch == plan.batch, "run_decode: page table batch {} != plan batch {}", a.table.batch,
               plan.batch);
  KVPACK_CU_CHECK(a.num_pages > 0, "run_decode: num_pages {} must be > 0", a.num_pages);
  KVPACK_CU_CHECK(a.workspace, "run_decode: null workspace");
  KVPACK_CU_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 16 == 0,
                  "run_decode: workspace must be 16-byte aligned (partials are copied in 16-byte pieces)");
  const size_t need = decode_workspace_bytes(s, plan.batch, plan.max_chunks);
  KVPACK_CU_CHECK(need <= plan.workspace_bytes, "run_decode: plan workspace {} B is smaller than needed {} B",
               plan.workspace_bytes, need);
  DecodeKernelParams kp{};
  kp.q = a.q;
  kp.k_pool = a.k_pool;
  kp.v_pool = a.v_pool;
  kp.num_pages = a.num_pages;
  kp.table = a.table;
  kp.fp = a.params;
  const double sm = a.sm_scale > 0 ? a.sm_scale : 1.0 / std::sqrt(double(s.head_dim));
  kp.qk_scale_log2 = static_cast<float>(sm * 1.4426950408889634074);
  kp.out = a.out;
  kp.lse = a.lse;
  kp.num_qo_heads = s.num_qo_heads;
  kp.num_kv_heads = s.num_kv_heads;
  kp.group = s.num_qo_heads / s.num_kv_heads;
  kp.page_size = s.page_size;
  kp.page_shift = __builtin_ctz(static_cast<unsigned>(s.page_size));
  KVPACK_CU_CHECK(plan.leaf >= -1 && plan.leaf <= 1, "run_decode: plan.leaf {} is not -1, 0 or 1", plan.leaf);
  kp.num_splits = plan.num_splits;
  kp.leaf = plan.leaf;
  kp.stages = plan.stages;
  kp.max_chunks = plan.max_chunks;
  kp.max_context = plan.max_context;
  kp.status = a.status;
  kp.prep_after_write = after_write ? 1 : 0;
  const WorkspaceLayout wl = workspace_layout(s, plan.batch, plan.max_chunks);
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  kp.ws_acc = reinterpret_cast<float*>(ws);
  kp.ws_ml = reinterpret_cast<float2*>(ws + wl.ml_off);
  kp.sem = reinterpret_cast<int*>(ws + wl.sem_off);
  kp.fold_sem = reinterpret_cast<int*>(ws + wl.fold_sem_off);
  kp.max_groups = wl.max_groups;
  kp.ws_qh = reinterpret_cast<uint32_t*>(ws + wl.qh_off);
  kp.ws_qc = reinterpret_cast<float4*>(ws + wl.qc_off);

  kp.sink_tokens = format_info(s.format).sink_tokens;
  kp.sink_rows = kp.sink_tokens > 0 ? a.sinks.rows : nullptr;
  kp.k_sinks = a.sinks.k;
  kp.v_sinks = a.sinks.v;
  kp.num_sink_rows = a.sinks.num_rows;
  KVPACK_CU_CHECK(!kp.sink_rows || (a.sinks.k && a.sinks.v), "run_decode: sinks.rows given without sinks.k / sinks.v");
  KVPACK_DISPATCH_FORMAT(s.format, P, [&] {
    if constexpr (P::kQ) {
      KVPACK_CU_CHECK(a.params.qk.valid() && a.params.qv.valid(),
                      "run_decode: format '{}' needs its calibrated parameters (params.qk and params.qv)",
                      format_name(s.format));
      // The lean path copies G (inv) in 16-byte pieces and reads the step sizes as float4.
      auto a16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
      KVPACK_CU_CHECK(a16(a.params.qk.inv) && a16(a.params.qv.inv) && a16(a.params.qk.step) && a16(a.params.qv.step),
                      "run_decode: params.qk / params.qv inv and step must be 16-byte aligned device arrays");
    }
  });
  const PagedLayout layout = make_paged_layout(s.format, s.page_size, s.num_kv_heads, s.head_dim);
  kp.head_block_bytes = layout.head_block_bytes;
  return kp;
}
void launch_decode(const DecodePlan& plan, const DecodeKernelParams& kp, void* stream) {
  if (plan.batch == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  KVPACK_DISPATCH_FORMAT(plan.shape.format, P, [&] { launch_decode_format<P>(kp, plan.shape.head_dim, plan.batch, st); });
  KVPACK_CUDA_CHECK(cudaGetLastError());
}
}  // namespace

bool decode_step_overlaps(Format f) {
  // KVPACK_STEP_PDL=0: the query preparation after the write, as with write_kv then run_decode (measurement).
  static const bool on = env_int("KVPACK_STEP_PDL", 1) != 0;
  return on && lane_bits_x2(f) != 0 && lean_pdl_on();
}

void run_decode(const DecodePlan& plan, const DecodeArgs& a, void* stream) {
  launch_decode(plan, decode_params(plan, a, false), stream);
}

void decode_step(const PagedLayout& layout, const WriteArgs& w, const DecodePlan& plan, const DecodeArgs& a,
                 void* stream) {
  const DecodeShape& s = plan.shape;
  KVPACK_CU_CHECK(layout.format == s.format && layout.page_size == s.page_size &&
                      layout.num_kv_heads == s.num_kv_heads && layout.head_dim == s.head_dim,
                  "decode_step: write layout ({}, page {}, {} kv heads, head_dim {}) does not match the plan's shape "
                  "({}, page {}, {} kv heads, head_dim {})",
                  format_name(layout.format), layout.page_size, layout.num_kv_heads, layout.head_dim,
                  format_name(s.format), s.page_size, s.num_kv_heads, s.head_dim);
  KVPACK_CU_CHECK(w.k_pool == a.k_pool && w.v_pool == a.v_pool && w.num_pages == a.num_pages,
                  "decode_step: the write's page pools (k_pool, v_pool, num_pages {}) are not the attention's "
                  "(num_pages {})",
                  w.num_pages, a.num_pages);
  // The attention's checks first: nothing is launched when either call's arguments are bad.
  const DecodeKernelParams kp = decode_params(plan, a, w.num_tokens > 0 && decode_step_overlaps(s.format));
  write_kv(layout, w, stream);
  launch_decode(plan, kp, stream);
}

}  // namespace kvpack
