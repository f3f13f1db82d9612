// plan_decode's wave model (src/common/split_model.cpp): the split counts it picks for the benchmark's shapes on a
// 132-SM GPU with two resident CTAs per SM, against the choices `kvpack tune` measured on an H100
// (bench/results/tune_h100_v1.json), and its argument checks.
#include <gtest/gtest.h>

#include <string>

#include "kvpack/decode.h"
#include "kvpack/error.h"

using namespace kvpack;

namespace {
constexpr int64_t kSlots = 132 * 2;
int64_t chunks_of(int64_t context) { return (context + kChunkTokens - 1) / kChunkTokens; }
}  // namespace

// Large batches: one split per (sequence, kv head). The model without a per-CTA cost cut batch 64 x 32k into 64
// one-chunk CTAs (1.25x slower for fp8, 1.66x for q4 on the H100 than the tuned single split).
TEST(WaveModelSplits, LargeBatchesKeepWholeSequences) {
  EXPECT_EQ(wave_model_splits(64 * 8, chunks_of(32768), kSlots), 1);
  EXPECT_EQ(wave_model_splits(64 * 8, chunks_of(131072), kSlots), 1);
  EXPECT_EQ(wave_model_splits(32 * 8, chunks_of(65536), kSlots), 1);
}

// Where `kvpack tune` on the H100 agrees with the model (units = batch x kv heads of the 32q/8kv and 8q/1kv entries).
TEST(WaveModelSplits, MatchesTunedChoices) {
  struct Case {
    int64_t units, context;
    int splits;
  };
  const Case cases[] = {
      {8, 8192, 16},    {8, 32768, 32},    {64, 8192, 4},   {64, 32768, 4},   {64, 131072, 4},
      {128, 8192, 2},   {128, 65536, 2},   {256, 32768, 1}, {1, 8192, 16},    {1, 32768, 64},
      {1, 131072, 256}, {64, 65536, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("units " + std::to_string(c.units) + " context " + std::to_string(c.context));
    EXPECT_EQ(wave_model_splits(c.units, chunks_of(c.context), kSlots), c.splits);
  }
}

TEST(WaveModelSplits, StaysWithinTheChunks) {
  for (int64_t units : {1, 3, 7, 64, 300, 5000})
    for (int64_t chunks : {1, 2, 5, 64, 257, 2048, 10000})
      for (int64_t slots : {1, 80, 264, 1000}) {
        const int s = wave_model_splits(units, chunks, slots);
        EXPECT_GE(s, 1);
        EXPECT_LE(s, std::min<int64_t>(chunks, 4096));
      }
}

// The lean kernel (q4 / q3): warps per (sequence, kv head) in multiples of 4, slots counted in warps (132 SMs x 3
// CTAs x 4 warps). Batch 8 x 32k of 32q/8kv: 24 warps per (sequence, kv head) fill one wave of 1,536 warps; the
// regular table's 4 x 8 = 32 (what the first lean run used) gave 1.3 waves.
TEST(WaveModelSplits, LeanKernelStepsByFourWarps) {
  constexpr int64_t kWarpSlots = 132 * 3 * 4;
  EXPECT_EQ(wave_model_splits(8 * 8, chunks_of(32768), kWarpSlots, 4), 24);
  EXPECT_EQ(wave_model_splits(8 * 8, chunks_of(131072), kWarpSlots, 4), 24);
  for (int64_t units : {1, 8, 64, 512})
    for (int64_t chunks : {1, 3, 64, 256, 2048}) {
      const int s = wave_model_splits(units, chunks, kWarpSlots, 4);
      EXPECT_EQ(s % 4, 0);
      EXPECT_LE(s, (chunks + 3) / 4 * 4);  // at most one warp per chunk, rounded up to the CTA
    }
}

// The lean kernel's default plan (v43), against what kvpack tune --every measured on an H100 (v41: 132 SMs x 3 CTAs
// x 4 warps = 1,584 warp slots): leaf mode where it won (batch 1 x 32k of 32q/8kv: 512 chunk-warps; 8q/1kv batch 1 x
// 128k: 256), one warp per chunk where leaf mode lost (32q/8kv batch 1 x 128k and 8q/1kv batch 8 x 128k: 2,048).
TEST(LeanDefaultPlan, LeafModeOnlyBelowOneWaveOfChunkWarps) {
  constexpr int64_t kWarpSlots = 132 * 3 * 4;
  EXPECT_TRUE(lean_default_leaf(1 * 8, chunks_of(32768), kWarpSlots));
  EXPECT_TRUE(lean_default_leaf(1 * 1, chunks_of(131072), kWarpSlots));
  EXPECT_TRUE(lean_default_leaf(8 * 1, chunks_of(32768), kWarpSlots));
  EXPECT_FALSE(lean_default_leaf(1 * 8, chunks_of(131072), kWarpSlots));
  EXPECT_FALSE(lean_default_leaf(8 * 1, chunks_of(131072), kWarpSlots));
  EXPECT_FALSE(lean_default_leaf(64 * 8, chunks_of(8192), kWarpSlots));
  EXPECT_FALSE(lean_default_leaf(1, kWarpSlots, kWarpSlots));
  EXPECT_TRUE(lean_default_leaf(1, kWarpSlots - 1, kWarpSlots));
  EXPECT_THROW(lean_default_leaf(0, 1, 1), Error);
  EXPECT_THROW(lean_default_leaf(1, 1, 0), Error);
}
TEST(LeanDefaultPlan, OneWarpPerChunkInWholeCtas) {
  EXPECT_EQ(lean_default_splits(chunks_of(131072)), 256);
  EXPECT_EQ(lean_default_splits(chunks_of(32768)), 64);
  EXPECT_EQ(lean_default_splits(1), kLeanCtaWarps);
  EXPECT_EQ(lean_default_splits(5), 8);
  for (int64_t chunks = 1; chunks <= 300; ++chunks) {
    const int s = lean_default_splits(chunks);
    EXPECT_EQ(s % kLeanCtaWarps, 0);
    EXPECT_GE(s, chunks);
    EXPECT_LT(s, chunks + kLeanCtaWarps);
  }
  EXPECT_THROW(lean_default_splits(0), Error);
}

// The group-folding mode (v74): on from 2.5 waves of one-group warps (H100: 3 CTAs x 4 warps x 132 SMs), where it
// measured faster (32q/8kv batch 32-64 x 128k, batch 64 x 64k), off at 1.3 waves and below where it measured slower.
TEST(LeanGroupFold, OnFromTwoAndAHalfWavesOfGroupWarps) {
  constexpr int64_t kWarpSlots = 132 * 3 * 4;
  EXPECT_TRUE(lean_default_group_fold(32 * 8, chunks_of(131072), kWarpSlots));   // 4,096 warps: 2.6 waves
  EXPECT_TRUE(lean_default_group_fold(64 * 8, chunks_of(131072), kWarpSlots));   // 5.2 waves
  EXPECT_TRUE(lean_default_group_fold(64 * 8, chunks_of(65536), kWarpSlots));    // 2.6 waves
  EXPECT_FALSE(lean_default_group_fold(16 * 8, chunks_of(131072), kWarpSlots));  // 1.3 waves
  EXPECT_FALSE(lean_default_group_fold(64 * 8, chunks_of(32768), kWarpSlots));   // 1.3 waves (measured 0.88x)
  EXPECT_FALSE(lean_default_group_fold(64 * 1, chunks_of(131072), kWarpSlots));  // 0.65 waves (measured 0.96x)
  EXPECT_FALSE(lean_default_group_fold(1, 1, kWarpSlots));
  EXPECT_TRUE(lean_default_group_fold(3960, 1, kWarpSlots));  // one chunk, one group per warp: 2.5 waves exactly
  EXPECT_FALSE(lean_default_group_fold(3959, 1, kWarpSlots));
  EXPECT_THROW(lean_default_group_fold(0, 1, kWarpSlots), Error);
  EXPECT_THROW(lean_default_group_fold(1, 0, kWarpSlots), Error);
}

// The mixed grid (v48): where one warp per chunk is 1.x waves of the H100's 1,584 warp slots (2,048 chunk-warps:
// 32q/8kv batch 1 x 128k, 8q/1kv batch 8 x 128k), the model's pick leaves the last wave to leaf CTAs; below one wave
// it stays leaf mode (0), and where the partial wave is a small part of many (batch 64 x 128k) warp mode whole (0).
TEST(LeanMixedChunks, LeafCtasFillThePartialLastWave) {
  constexpr int64_t kWarpSlots = 132 * 3 * 4;
  EXPECT_EQ(lean_mixed_chunks(1 * 8, chunks_of(131072), kWarpSlots), 196);
  EXPECT_EQ(lean_mixed_chunks(8 * 1, chunks_of(131072), kWarpSlots), 196);
  EXPECT_EQ(lean_mixed_chunks(1 * 8, chunks_of(32768), kWarpSlots), 0);   // leaf mode (below one wave)
  EXPECT_EQ(lean_mixed_chunks(64 * 8, chunks_of(131072), kWarpSlots), 0);  // 83 waves: warp mode whole
  EXPECT_EQ(lean_mixed_chunks(64 * 8, chunks_of(32768), kWarpSlots), 0);
  for (int64_t units : {1, 3, 8, 16, 64, 512})
    for (int64_t chunks : {1, 2, 5, 16, 64, 127, 256, 1024}) {
      const int cw = lean_mixed_chunks(units, chunks, kWarpSlots);
      if (cw == 0) continue;
      EXPECT_EQ(cw % kLeanCtaWarps, 0) << units << " x " << chunks;
      EXPECT_GE(cw, kLeanCtaWarps);
      EXPECT_LT(cw, chunks);
      EXPECT_FALSE(lean_default_leaf(units, chunks, kWarpSlots));
    }
  EXPECT_THROW(lean_mixed_chunks(0, 1, 1), Error);
  EXPECT_THROW(lean_mixed_chunks(1, 0, 1), Error);
  EXPECT_THROW(lean_mixed_chunks(1, 1, 0), Error);
}

TEST(WaveModelSplits, RejectsEmptyWork) {
  EXPECT_THROW(wave_model_splits(0, 1, 1), Error);
  EXPECT_THROW(wave_model_splits(1, 0, 1), Error);
  EXPECT_THROW(wave_model_splits(1, 1, 0), Error);
  EXPECT_THROW(wave_model_splits(1, 1, 1, 0), Error);
}

TEST(DecodeKernelName, LaneFormatsRunTheLeanKernel) {
  EXPECT_STREQ(decode_kernel_name(Format::q4), "lean");
  EXPECT_STREQ(decode_kernel_name(Format::q3_5), "lean");
  EXPECT_STREQ(decode_kernel_name(Format::q3), "lean");
  EXPECT_STREQ(decode_kernel_name(Format::fp8), "regular");
  EXPECT_STREQ(decode_kernel_name(Format::int4), "regular");
}

// The lean merge's slice rule with the H100's measured occupancy (80 registers: 6 / 3 / 1 CTAs per SM at 1 / 2 / 4
// slices, D = 128) against the choices v40d measured best (bench/NOTES.md).
TEST(LeanMergeSlices, OneRoundWhileOneWave) {
  const int occ[kMergeSliceCounts] = {22, 11, 6, 3, 1};  // CTAs per SM at 1, 2, 4, 8, 16 slices
  auto ctas = [](int kv, int batch, int group) { return int64_t{kv} * batch * group; };
  EXPECT_EQ(lean_merge_slices(ctas(1, 1, 8), 16, 132, occ), 16);   // 8q/1kv batch 1 x 128k: one round
  EXPECT_EQ(lean_merge_slices(ctas(8, 1, 4), 16, 132, occ), 16);   // 32q/8kv batch 1 x 128k
  EXPECT_EQ(lean_merge_slices(ctas(1, 8, 8), 16, 132, occ), 16);   // 8q/1kv batch 8 x 128k: 64 CTAs
  EXPECT_EQ(lean_merge_slices(ctas(1, 8, 8), 4, 132, occ), 4);     // 8q/1kv batch 8 x 32k: 4 groups
  EXPECT_EQ(lean_merge_slices(ctas(8, 8, 4), 4, 132, occ), 4);     // 32q/8kv batch 8 x 32k: 256 CTAs <= 792
  EXPECT_EQ(lean_merge_slices(ctas(8, 8, 4), 16, 132, occ), 8);    // 32q/8kv batch 8 x 128k: 256 > 132, <= 396
  EXPECT_EQ(lean_merge_slices(ctas(1, 64, 8), 4, 132, occ), 4);    // 8q/1kv batch 64 x 32k: 512 CTAs
  EXPECT_EQ(lean_merge_slices(ctas(8, 64, 4), 16, 132, occ), 1);   // 32q/8kv batch 64: 2048 CTAs
  // One round needs the next power of two of the fold groups (at most 16); 0 or 1 group: one slice.
  EXPECT_EQ(lean_merge_slices(1, 1, 132, occ), 1);
  EXPECT_EQ(lean_merge_slices(1, 3, 132, occ), 4);
  EXPECT_EQ(lean_merge_slices(1, 0, 132, occ), 1);
  EXPECT_EQ(lean_merge_slices(1, 40, 132, occ), 16);
  // Forced counts (KVPACK_LEAN_MERGE_SLICES) override the wave rule, not the fold groups; other values are ignored.
  EXPECT_EQ(lean_merge_slices(ctas(8, 64, 4), 16, 132, occ, 4), 4);
  EXPECT_EQ(lean_merge_slices(ctas(1, 1, 8), 16, 132, occ, 1), 1);
  EXPECT_EQ(lean_merge_slices(ctas(1, 1, 8), 16, 132, occ, 8), 8);
  EXPECT_EQ(lean_merge_slices(1, 2, 132, occ, 16), 2);
  EXPECT_EQ(lean_merge_slices(ctas(1, 1, 8), 16, 132, occ, 3), 16);
  EXPECT_EQ(lean_merge_slices(ctas(1, 1, 8), 16, 132, occ, 32), 16);
  // An occupancy of 0 (no device) counts as 1.
  const int none[kMergeSliceCounts] = {0, 0, 0, 0, 0};
  EXPECT_EQ(lean_merge_slices(100, 16, 132, none), 16);
  EXPECT_EQ(lean_merge_slices(200, 16, 132, none), 1);
}


TEST(Fp8LeanDefault, OneKvHeadAtHeadDim128Only) {
  EXPECT_TRUE(fp8_lean_default(8, 1, 128));    // Llama-3.1-70B per GPU under 8-way tensor parallelism
  EXPECT_TRUE(fp8_lean_default(4, 1, 128));
  EXPECT_TRUE(fp8_lean_default(1, 1, 128));
  EXPECT_FALSE(fp8_lean_default(32, 8, 128));  // Llama-3.1-8B: the regular kernel was faster at batch >= 8
  EXPECT_FALSE(fp8_lean_default(16, 2, 128));
  EXPECT_FALSE(fp8_lean_default(8, 1, 64));    // the lean fp8 kernel exists at head_dim 128 only
  EXPECT_FALSE(fp8_lean_default(16, 1, 128));  // a group beyond the lean kernel's n8 tile
}
