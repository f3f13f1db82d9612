// q4's fixed bit pattern and its lane layout in the paged cache (docs/FORMATS.md, "q4: fixed widths and the lane
// layout"; measured in bench/NOTES.md v31).
//
// Widths: q4 gives every (layer, kv head) slot the same group widths, one pattern per (head_dim, K|V) (kBits below),
// so the decode kernel's masks are compile-time constants. The calibration keeps everything else per slot
// (transform, steps, scale weights); the per-token block of QBlock<D, 8> (63/31 code bytes + the scale byte) is
// unchanged: it is the format's logical block, what the CPU codec and the quality evaluation use.
//
// Lane layout: the paged cache stores q4 not token by token but in units of 16 tokens (one m16n8k16 tile of the
// decode kernel), every lane's share of a unit contiguous, as the A fragments of the kernel's two products:
//   K (scores, tokens x channels): lane (g, q) holds tokens g and g + 8 of the unit, and of every group of 8
//     channels the two members 2q, 2q + 1 (the k-block columns 2q, 2q + 1 / 8 + 2q, 9 + 2q): per token D/32 words
//     of two 16-bit halves, half m = member 2q + m.
//   V (P.V, channels x tokens): lane (g, q) holds member g of every group for the token pairs (2q, 2q + 1) and
//     (8 + 2q, 9 + 2q): per pair D/32 words, lo half = the even token, hi half = the odd one.
// Inside a half, group i's code sits at bits [pos, pos + w) of word `word` (kGroups below), where pos + w <= 10
// (read as the f16 subnormal code * 2^(pos - 24) after one AND) or pos >= 6 (the same after a shift by 6), and the
// widths of a word's half sum to 16, except the last word's: 15, its bit 15 (the f16 sign bit, masked off by every
// code mask) holds one bit of the token's scale byte. A token owns D/4 halves (K: 4 lanes x D/32 words x 2 halves;
// V: 8 lanes x D/32 words x 1 half) = D/2 bytes = exactly 4.0 bits per element with the scale byte, and every half
// holds bits of one token only, so a token is written with 16-bit stores that touch nothing of its neighbours.
// Scale byte bit b: K: half m of lane q's last word, b = 2q + m; V: lane g's last word, b = g.
//
// Byte offsets inside a unit (8 D bytes; a page of P tokens is P / 16 units, unit u at u * 8 D of the (page, kv
// head) block): lane L's share s (0 .. D/4 - 1) is byte ((s / 16) * 32 + L) * 16 + s % 16, i.e. 16-byte piece s / 16
// of every lane stored together (one 512-byte copy per warp instruction). K: L = 4 (t % 8) + q, s = (t / 8) D/8 +
// 4 w + 2 m. V: L = 4 g + (t % 8) / 2, s = (t / 8) D/8 + 4 w + 2 (t % 2).
#pragma once
#include <cstdint>

#include "kvpack/block/common.h"

namespace kvpack::block {

struct LaneGroup {
  int w, word, pos;  // width (bits), word of the lane's share, first bit inside the 16-bit half
};

template <int D, bool V>
struct Q4Lanes {
  static_assert(D == 64 || D == 128, "head_dim must be 64 or 128");
  static constexpr int kGroups = D / 8;
  static constexpr int kWords = D / 32;              // words per token (K) or token pair (V) per lane
  static constexpr int kTokenHalves = D / 4;         // 16-bit halves per token
  static constexpr int kUnitTokens = 16;
  static constexpr int kUnitBytes = 8 * D;           // 16 tokens x D/2 bytes
  static constexpr int kLaneBytes = D / 4;           // one lane's share of a unit
  static constexpr int kSparePos = 15;               // scale bit: bit 15 of the last word's half

  // Group i's width and place. Group order = the calibration's (energy descending, widths non-increasing).
  static KVPACK_HD constexpr LaneGroup group(int i) {
    // D = 64. K [8,5,4,3,3,3,3,2] and V [5,4,4,4,4,4,3,3] (31 bits each: the patterns measured in docs/FORMATS.md).
    constexpr LaneGroup k64[8] = {{8, 0, 0}, {5, 0, 8}, {4, 1, 0}, {3, 1, 4},
                                  {3, 1, 7}, {3, 1, 10}, {3, 0, 13}, {2, 1, 13}};
    constexpr LaneGroup v64[8] = {{5, 0, 0}, {4, 0, 5}, {4, 0, 9}, {4, 1, 0},
                                  {4, 1, 4}, {4, 1, 8}, {3, 0, 13}, {3, 1, 12}};
    // D = 128: the D = 64 patterns with every group split in two (no D = 128 model to calibrate on here), plus one
    // bit: K [8,8,5,5,4,4,3 x 9,2], V [5,5,4 x 11,3,3,3] (63 bits each).
    constexpr LaneGroup k128[16] = {{8, 0, 0},  {8, 0, 8},  {5, 1, 0},  {5, 1, 5},  {4, 2, 0},  {4, 2, 4},
                                    {3, 1, 10}, {3, 1, 13}, {3, 2, 8},  {3, 2, 11}, {3, 3, 0},  {3, 3, 3},
                                    {3, 3, 6},  {3, 3, 9},  {3, 3, 12}, {2, 2, 14}};
    constexpr LaneGroup v128[16] = {{5, 0, 0},  {5, 0, 5},  {4, 1, 0},  {4, 1, 4},  {4, 1, 8},  {4, 1, 12},
                                    {4, 2, 0},  {4, 2, 4},  {4, 2, 8},  {4, 2, 12}, {4, 3, 0},  {4, 3, 4},
                                    {4, 3, 8},  {3, 0, 10}, {3, 0, 13}, {3, 3, 12}};
    if constexpr (D == 64) return V ? v64[i] : k64[i];
    else return V ? v128[i] : k128[i];
  }
  static KVPACK_HD constexpr int bits(int i) { return group(i).w; }
  // Whether group i is read after the shift by 6 (its code does not fit the 10 mantissa bits in place).
  static KVPACK_HD constexpr bool shifted(int i) { return group(i).pos + group(i).w > 10; }

  // The pattern's rules, checked at compile time below.
  static constexpr bool valid() {
    uint32_t used[kWords] = {};
    int sum = 0;
    for (int i = 0; i < kGroups; ++i) {
      const LaneGroup g = group(i);
      if (g.w < 1 || g.w > 8 || g.word < 0 || g.word >= kWords || g.pos < 0 || g.pos + g.w > 16) return false;
      if (g.pos + g.w > 10 && g.pos < 6) return false;  // neither in place nor after the shift by 6
      if (i > 0 && g.w > group(i - 1).w) return false;   // widths non-increasing (the calibration's group order)
      const uint32_t m = ((1u << g.w) - 1u) << g.pos;
      if (used[g.word] & m) return false;
      used[g.word] |= m;
      sum += g.w;
    }
    for (int w = 0; w < kWords; ++w)
      if (used[w] != (w == kWords - 1 ? 0x7fffu : 0xffffu)) return false;  // full, the last one but the scale bit
    return sum == D / 2 - 1;  // = q_code_bytes(8, D): the logical block's code bytes
  }

  // Byte offset, inside its unit, of half j (0 .. kTokenHalves - 1) of the unit's token t (0 .. 15).
  // K: j = (q * kWords + w) * 2 + m; V: j = g * kWords + w.
  static KVPACK_HD constexpr int half_offset(int t, int j) {
    int lane, s;
    if constexpr (V) {
      const int g = j / kWords, w = j % kWords;
      lane = 4 * g + (t % 8) / 2;
      s = (t / 8) * (D / 8) + 4 * w + 2 * (t % 2);
    } else {
      const int m = j % 2, w = (j / 2) % kWords, q = j / 2 / kWords;
      lane = 4 * (t % 8) + q;
      s = (t / 8) * (D / 8) + 4 * w + 2 * m;
    }
    return ((s / 16) * 32 + lane) * 16 + s % 16;
  }
  // Word and channel member of half j, and the scale-byte bit it carries (in its last word).
  static KVPACK_HD constexpr int half_word(int j) { return V ? j % kWords : (j / 2) % kWords; }
  static KVPACK_HD constexpr int half_member(int j) { return V ? j / kWords : 2 * (j / 2 / kWords) + j % 2; }
  static KVPACK_HD constexpr int half_scale_bit(int j) { return half_member(j); }

  // Half j's 16 bits from the token's codes (code_of(c): channel c = 8 i + member of group i) and scale byte e.
  template <class CodeOf>
  static KVPACK_HD uint16_t half_value_of(CodeOf&& code_of, uint8_t e, int j) {
    const int word = half_word(j), mem = half_member(j);
    uint32_t h = 0;
    for (int i = 0; i < kGroups; ++i) {
      const LaneGroup g = group(i);
      if (g.word == word) h |= (static_cast<uint32_t>(code_of(8 * i + mem)) & ((1u << g.w) - 1u)) << g.pos;
    }
    if (word == kWords - 1) h |= ((static_cast<uint32_t>(e) >> half_scale_bit(j)) & 1u) << kSparePos;
    return static_cast<uint16_t>(h);
  }
  static KVPACK_HD uint16_t half_value(const int* k, uint8_t e, int j) {
    return half_value_of([&](int c) { return k[c]; }, e, j);
  }
  // The inverse: half j's codes into k[], its scale bit into e (the caller starts e at 0).
  static KVPACK_HD void half_read(uint16_t h, int j, int* k, uint8_t& e) {
    const int word = half_word(j), mem = half_member(j);
    for (int i = 0; i < kGroups; ++i) {
      const LaneGroup g = group(i);
      if (g.word == word) k[8 * i + mem] = static_cast<int>((static_cast<uint32_t>(h) >> g.pos) & ((1u << g.w) - 1u));
    }
    if (word == kWords - 1) e = static_cast<uint8_t>(e | (((h >> kSparePos) & 1u) << half_scale_bit(j)));
  }

  // Token t (0 .. 15) of a unit, from / to its codes k[D] and scale byte (what the CPU reference and the GPU
  // dequantiser call; the GPU write path stores the same half_value at the same half_offset, one thread per half).
  static KVPACK_HD void store_token(const int* k, uint8_t e, int t, uint8_t* unit) {
    for (int j = 0; j < kTokenHalves; ++j) {
      const uint16_t h = half_value(k, e, j);
      const int o = half_offset(t, j);
      unit[o] = static_cast<uint8_t>(h & 0xffu);
      unit[o + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  static KVPACK_HD void load_token(const uint8_t* unit, int t, int* k, uint8_t& e) {
    e = 0;
    for (int j = 0; j < kTokenHalves; ++j) {
      const int o = half_offset(t, j);
      half_read(static_cast<uint16_t>(unit[o] | (unit[o + 1] << 8)), j, k, e);
    }
  }
};

static_assert(Q4Lanes<64, false>::valid() && Q4Lanes<64, true>::valid(), "q4 lane pattern, head_dim 64");
static_assert(Q4Lanes<128, false>::valid() && Q4Lanes<128, true>::valid(), "q4 lane pattern, head_dim 128");

// q4's width of group g for (head_dim, K|V): the one table the calibration, the loader and the kernels read.
KVPACK_HD constexpr int q4_group_bits(int head_dim, bool is_v, int g) {
  return head_dim == 64 ? (is_v ? Q4Lanes<64, true>::bits(g) : Q4Lanes<64, false>::bits(g))
                        : (is_v ? Q4Lanes<128, true>::bits(g) : Q4Lanes<128, false>::bits(g));
}

}  // namespace kvpack::block
