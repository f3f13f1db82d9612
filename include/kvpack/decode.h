// CUDA paged KV write path and decode attention: plan() on the host, run() only launches.
//
// This header is CUDA-free (streams are passed as void*, a cudaStream_t) so host code and the CLI can include it
// without nvcc. All pointers in *Args are device pointers. Shapes are written beside every pointer.
//
// Determinism: decode attention splits every sequence into fixed chunks of kChunkTokens tokens. Each chunk's
// partial (max, sum, unnormalised output) is computed by the same code whatever CTA runs it, and the partials are
// folded by a fixed two-level tree: chunks 16 g .. 16 g + 15 in chunk order (fold group g), then the groups in
// group order (a sequence of <= 16 chunks: its chunks in order). The tree depends only on the sequence length, so
// the output is bitwise the same for every plan (split count, pipeline depth), every batch composition and run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvpack/formats.h"
#include "kvpack/paged.h"

namespace kvpack {

// Fixed reduction unit of decode attention (tokens). Part of the numerical definition of the output.
inline constexpr int kChunkTokens = 512;
// Chunks per fold group of the two-level merge (see above). Also part of the numerical definition of the output.
inline constexpr int kFoldChunks = 16;
// Warps per CTA of the lean decode kernel (q4 / q3.5 / q3): a chunk is that many 128-token leaves (leaf mode gives each
// warp one), and warp mode's split counts are multiples of it.
inline constexpr int kLeanCtaWarps = 4;

// Write new K/V tokens (bf16, as the model produced them) into their slots.
struct WriteArgs {
  const uint16_t* k = nullptr;             // [num_tokens][num_kv_heads][head_dim] bf16
  const uint16_t* v = nullptr;             // [num_tokens][num_kv_heads][head_dim] bf16
  const int32_t* slot_mapping = nullptr;   // [num_tokens]; slot = page * page_size + offset; < 0 = padding
  int num_tokens = 0;
  uint8_t* k_pool = nullptr;               // [num_pages][num_kv_heads][head_block_bytes]
  uint8_t* v_pool = nullptr;               // [num_pages][num_kv_heads][head_block_bytes]
  int64_t num_pages = 0;
  FormatParams params;
  int32_t* status = nullptr;               // device int32 or null; |= 1: a slot out of range (skipped), |= 4: a
                                           // sink slot out of range (skipped)
  // Formats with sink tokens (q4/q3.5/q3, see SinkView in paged.h): tokens whose sink slot (row * sink_tokens +
  // position) is >= 0 are also copied, in bf16, into the sink pool. All null: no sink writes.
  const int32_t* sink_slot_mapping = nullptr;  // [num_tokens]
  uint16_t* k_sinks = nullptr;             // [num_sink_rows][sink_tokens][num_kv_heads][head_dim]
  uint16_t* v_sinks = nullptr;
  int64_t num_sink_rows = 0;
};
// Validates the host-visible arguments (throws kvpack::Error) and launches; never synchronises. On sm_90 the q
// formats' write kernels allow programmatic dependents at their first instruction (decode_step's query preparation
// runs beside them): a kernel the caller launches after write_kv with programmatic stream serialization must wait
// (griddepcontrol.wait / cudaGridDependencySynchronize) before it reads the cache, as PDL requires anyway.
void write_kv(const PagedLayout& layout, const WriteArgs& args, void* stream = nullptr);

// Slots for appending tokens to sequences in the CSR view, computed on the host from host copies of the table:
// token i of sequence b gets position positions[i]. Convenience for callers holding the CSR view.
std::vector<int32_t> slots_from_csr(const CsrPageTable& host_table, int page_size, const std::vector<int32_t>& seq_of_token,
                                    const std::vector<int64_t>& position_of_token);

// Dequantise whole pages to fp32 (test/debug path; bit-exact with the CPU decoder).
// out: [num_pages][num_kv_heads][page_size][head_dim] fp32.
void dequantize_pages(const PagedLayout& layout, const uint8_t* pool, int64_t num_pages, bool is_v,
                      const FormatParams& params, float* out, void* stream = nullptr);

struct DecodeShape {
  Format format = Format::bf16;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 16;
};

struct DecodePlan {
  DecodeShape shape;
  int batch = 0;
  int64_t max_context = 0;   // longest sequence the plan accepts (tokens); longer ones set status and are cut
  int num_splits = 1;        // CTAs per (sequence, kv head) (the lean kernel of q4 / q3.5 / q3: warps per (sequence, kv
                             // head), rounded up to a multiple of 4); chunks are dealt to them round-robin
  int stages = 4;            // cp.async pipeline depth (tiles in flight per CTA)
  // The lean kernel's (q4 / q3.5 / q3) mode: 1 = leaf mode (one CTA per chunk, num_splits not read), 0 = warp mode
  // (num_splits warps per (sequence, kv head)), -1 = the launcher's rule (lean_default_leaf: leaf mode when one warp
  // per chunk would not fill the GPU's warp slots once). Both modes give the same bits. The regular kernel ignores it.
  int leaf = -1;
  int max_chunks = 0;        // ceil(max_context / kChunkTokens)
  size_t workspace_bytes = 0;  // device workspace run() needs; zero it once after allocation (run leaves it so)
  std::string source;        // "table", "built-in table", "fallback" or "explicit": where the configuration came from
};

// One tuned entry: for (format, shape, batch bucket, context bucket) the best (num_splits, stages).
struct TuneEntry {
  Format format = Format::bf16;
  int num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, page_size = 0;
  int batch = 0;             // bucket: the largest tuned batch <= the asked batch is used
  int64_t context = 0;       // bucket: the largest tuned context <= the asked max_context is used
  int num_splits = 1;
  int stages = 4;
  double median_us = 0;
  // The kernel it was measured on ("regular", or "lean" for q4 / q3.5 / q3; JSON field "kernel", absent = "regular"):
  // plan_decode takes an entry only for the kernel its format runs on now (decode_kernel_name), since the two read
  // num_splits differently.
  std::string kernel = "regular";
  // The lean kernel's mode it was measured in (DecodePlan::leaf; JSON "leaf": true / false, absent = -1, the
  // launcher's rule; only on "lean" entries). plan_decode takes it for the entry's own (batch, context) only.
  int leaf = -1;
};
struct TuningTable {
  std::string gpu;           // device name the table was measured on
  std::string version;       // library version it was measured with
  std::vector<TuneEntry> entries;
  // The JSON form (`kvpack tune` writes it): {"gpu", "version", "entries": [{format, num_qo_heads, num_kv_heads,
  // head_dim, page_size, batch, context, num_splits, stages, median_us, kernel, leaf (lean entries only)}]}. Host code
  // (src/common/tuning_table.cpp), no CUDA needed. parse/load throw kvpack::Error naming the source, the entry and
  // the field for invalid JSON, missing or mistyped fields, values outside what plan_decode accepts (group sizes
  // 1..8, head_dim 64 / 128, page_size 16 / 32 / 64 / 128, batch 1..65535, context 1..2^30, num_splits >= 1, stages
  // 2..8, median_us finite >= 0, kernel "regular" / "lean", leaf a bool on lean entries only) and two entries for the
  // same bucket and kernel.
  static TuningTable parse(const std::string& json_text, const std::string& source);
  // The entry plan_decode takes for (shape, batch, max_context), or null: same format, shape and page size, measured
  // on the kernel the format runs on (decode_kernel_name), the largest batch bucket <= batch and within it the
  // largest context bucket <= max_context. Host code.
  const TuneEntry* find(const DecodeShape& shape, int batch, int64_t max_context) const;
  static TuningTable load(const std::string& path);
  std::string to_json() const;
  void save(const std::string& path) const;
};

// Split count of the fallback plan (and of a tuned bucket's stages applied to an untuned batch or context): CTAs
// run in waves of `slots` (SMs x resident CTAs per SM); `units` (sequence, kv head) pairs of `chunks` KV chunks
// each, cut into s splits, take about waves(s) x (ceil(chunks / s) + c) chunk-times, where c = 1/2 chunk is what a
// CTA costs besides its chunks (prologue, query transform, partial writes and its share of the merge). The smallest
// s of least cost wins. Without c the model saw no price in splitting and cut batch 64 x 32k into one-chunk CTAs:
// 1.25x (fp8) to 1.7x (q formats) slower than the tuned plan on an H100 (bench/NOTES.md, v29). s runs over the
// multiples of `step` (the lean kernel: warps per (sequence, kv head), a multiple of its 4 warps per CTA, with
// `slots` counted in warps). Host code.
int wave_model_splits(int64_t units, int64_t chunks, int64_t slots, int step = 1);
// The lean kernel's default configuration (q4 / q3.5 / q3 without a tuned entry; bench/NOTES.md v43): leaf mode (one CTA
// of 4 warps per chunk) when one warp per chunk, units x chunks warps, would not fill the GPU's `warp_slots` (SMs x
// resident CTAs x 4) once; else warp mode with one warp per chunk: lean_default_splits(chunks) warps per (sequence,
// kv head), `chunks` rounded up to the CTA's 4 warps. Measured (v41, H100, kvpack tune --every over 24 cells): one
// warp per chunk was within 1% of the best split count of every warp-mode cell, where the wave model's choice was
// up to 7% slower, and leaf mode lost by 10-25% once one warp per chunk filled the GPU. Host code.
bool lean_default_leaf(int64_t units, int64_t chunks, int64_t warp_slots);
int lean_default_splits(int64_t chunks);
// The lean kernel's mixed grid (bench/NOTES.md v48): where one warp per chunk fills the GPU 1.x times, the last,
// partial wave of one-chunk warps runs each at one warp's pace (~5 us per 128-token leaf at one warp per scheduler,
// v47) and sets the launch's end. The mixed grid gives every (sequence, kv head) chunks [0, cw) one warp each (warp
// mode) and chunks [cw, chunks) one CTA each (leaf mode: its 4 warps one leaf each), the warp-mode CTAs of every
// sequence launched first, so the short leaf CTAs fill the end. Both modes give a chunk the same bits. Returns cw (a
// multiple of 4 in [4, chunks)) when a round model (a leaf CTA ~0.3 of a warp-mode CTA) predicts at least 5% less
// time than warp mode whole, else 0 (leaf mode below one wave, lean_default_leaf; warp mode whole above). Host code.
int lean_mixed_chunks(int64_t units, int64_t chunks, int64_t warp_slots);
// The lean kernel's group-folding mode (q formats at head_dim 128, bench/NOTES.md v74): one warp per fold group
// (kFoldChunks chunks) instead of one per chunk, the group's chunks folded in the warp, one partial per group. True
// where those units x ceil(chunks / kFoldChunks) warps are at least 2.5 waves of the `warp_slots` (SMs x resident
// CTAs x 4). Measured (H100, v74, A/B in one binary, 3 rounds): 1.01-1.10x at 32q/8kv batch 32-64 x 128k (2.6 and
// 5.2 waves), 0.88-0.96x at 1.3 waves and below (batch 64 x 32k, 8q/1kv batch 64 x 128k: the last wave's idle
// slots), far slower under one wave. H200 (v75, the rule against off): q4 1.08-1.14x, q3.5 1.06-1.07x at 32q/8kv
// batch 32-64 x 128k and 64 x 64k; q3 0.97-0.98x there, so the launcher takes the rule for q4 and q3.5 only. Host code.
bool lean_default_group_fold(int64_t units, int64_t chunks, int64_t warp_slots);
// The decode kernel a format runs on: "lean" (q4, q3.5, q3: their lane layout has no other reader) or "regular". Host code.
// (fp8 may also run on the lean kernel for some shapes, fp8_lean_default; its plans and tuning entries stay "regular":
// the lean kernel reads a regular fp8 plan's split count as warps, 8 per split.)
const char* decode_kernel_name(Format f);
// Whether fp8 decodes on the lean kernel (sm_90, head_dim 128) rather than the regular one for a model shape: one kv
// head (per GPU: e.g. Llama-3.1-70B under 8-way tensor parallelism, 8q/1kv) with a group of at most 8 (the lean
// kernel's n8 tile). Measured (H100, 2026-12-06, bench/NOTES.md v49; 30 cells of batch 1-64 x 32k-128k in one run):
// the lean kernel 1.00-1.78x faster than the regular one at 8q/1kv in every cell, but 0.86-0.96x at 32q/8kv batch
// >= 8. The choice depends on the shape only, never on the batch, so a sequence decodes to the same bits whatever
// batch it is in. KVPACK_LEAN_FP8=0 / 1 forces either kernel (measurement). Host code.
bool fp8_lean_default(int num_qo_heads, int num_kv_heads, int head_dim);
// The lean merge kernel's slices (fold groups folded per round: 1, 2, 4, 8 or 16, same bits for every count): the
// smallest power of two >= `fold_groups` (one round; at most 16), halved while its grid of `merge_ctas` CTAs does
// not fit one wave, `sms` x `ctas_per_sm[i]` (the kernel's occupancy at 1, 2, 4, 8, 16 slices). `forced` (one of
// those counts) overrides the wave rule, not the fold groups. Host code (bench/NOTES.md v40c/d, v47).
inline constexpr int kMergeSliceCounts = 5;
int lean_merge_slices(int64_t merge_ctas, int fold_groups, int sms, const int (&ctas_per_sm)[kMergeSliceCounts],
                      int forced = 0);

// The tuning tables shipped inside the library (bench/results/tune_v9.json: NVIDIA H200, tune_h100_v1.json: NVIDIA
// H100 80GB HBM3; embedded at build time), parsed on first use; the one measured on `gpu_name` (the CUDA device
// name), or null.
const std::vector<TuningTable>& builtin_tuning_tables();
const TuningTable* builtin_tuning_table(const std::string& gpu_name);

// Host only; never touches the device except to read the SM count and name once (cached). A table whose gpu/version
// do not match the running ones (or none), or that has no entry for the shape (TuningTable::find), gives way to the
// built-in table of the running GPU when there is one, else to the fallback (3 stages, splits from
// wave_model_splits; q4 / q3.5 / q3: lean_default_splits, one warp per chunk, and the launcher's lean_default_leaf
// and lean_mixed_chunks).
DecodePlan plan_decode(const DecodeShape& shape, int batch, int64_t max_context, const TuningTable* table = nullptr);
// The fallback configuration alone, whatever tables exist (what a GPU without a table gets; `kvpack bench --table
// fallback` compares it with the tuned plans).
DecodePlan plan_decode_fallback(const DecodeShape& shape, int batch, int64_t max_context);
// Same, with an explicit configuration (tuner, tests); validates it. leaf: DecodePlan::leaf (0 / 1 only for formats
// on the lean kernel, decode_kernel_name).
DecodePlan plan_decode_with(const DecodeShape& shape, int batch, int64_t max_context, int num_splits, int stages,
                            int leaf = -1);

struct DecodeArgs {
  const uint16_t* q = nullptr;        // [batch][num_qo_heads][head_dim] bf16, one query token per sequence
  const uint8_t* k_pool = nullptr;    // [num_pages][num_kv_heads][head_block_bytes]
  const uint8_t* v_pool = nullptr;    // [num_pages][num_kv_heads][head_block_bytes]
  int64_t num_pages = 0;
  PageTableView table;                // device pointers; lengths are read on the device
  FormatParams params;
  float sm_scale = 0;                 // 0 = 1/sqrt(head_dim)
  uint16_t* out = nullptr;            // [batch][num_qo_heads][head_dim] bf16
  float* lse = nullptr;               // [batch][num_qo_heads] natural-log LSE of the scaled scores, or null
  void* workspace = nullptr;          // plan.workspace_bytes, 16-byte aligned, zeroed once
  int32_t* status = nullptr;          // device int32 or null: |= 1 page id out of range, |= 2 length > max_context,
                                      // |= 4 sink row out of range (that sequence's first tokens read from codes)
  SinkView sinks;                     // formats with sink tokens: device sink pools and rows[batch] (rows null: none)
};
// Launches only (no allocation, no synchronisation): capturable in a CUDA graph. The grid depends only on the
// plan (batch, kv heads, max context); sequence lengths are read on the device. Throws kvpack::Error on
// arguments that can be checked on the host (null pointers, batch mismatch, workspace too small or not 16-byte
// aligned, pools or the q formats' params.qk / qv inv and step arrays not 16-byte aligned). q4 / q3.5 / q3 launch
// three kernels on `stream` (query preparation, the lean kernel, the merge); on sm_90 the second and third use
// programmatic dependent launch against the one before them only (KVPACK_PDL=0 turns it off), so work the caller
// enqueued before or after run_decode is ordered as with plain launches. One workspace must not be shared by
// run_decode calls that may overlap (two streams).
void run_decode(const DecodePlan& plan, const DecodeArgs& args, void* stream = nullptr);

// One layer's decode step as a server runs it: write_kv(layout, write) (the new tokens: one per sequence, or any),
// then run_decode(plan, attn). The same cache bytes and the same output bits as those two calls, and the same
// checks, plus: layout must match plan.shape, and the write's pools must be the attention's. attn.q must be ready
// when this is called, as write.k and write.v are. q4 / q3.5 / q3 on sm_90: the query preparation is launched with
// programmatic dependent launch behind the write and runs beside it (it reads only attn.q and the calibration), then
// waits for the write's grid before the lean kernel, which reads the new tokens' pages, may start. Launches only
// (capturable in a CUDA graph). KVPACK_STEP_PDL=0 keeps the two calls' order (measurement).
void decode_step(const PagedLayout& layout, const WriteArgs& write, const DecodePlan& plan, const DecodeArgs& attn,
                 void* stream = nullptr);

std::string library_version();

}  // namespace kvpack
