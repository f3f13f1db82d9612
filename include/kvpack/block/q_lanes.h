// The fixed bit patterns of q4, q3.5 and q3 and their lane layout in the paged cache (docs/FORMATS.md, "q4, q3.5 and
// q3: fixed widths and the lane layout"; measured in bench/NOTES.md v31 and v44).
//
// Widths: these formats give every (layer, kv head) slot the same group widths, one pattern per (format, head_dim,
// K|V) (the tables in group() below), so the decode kernel's masks are compile-time constants. The calibration keeps
// everything else per slot (transform, steps, scale weights); the per-token block of QBlock<D, B2> (code bytes + the
// scale byte) is unchanged: it is the format's logical block, what the CPU codec and the quality evaluation use.
// Template parameter B2 = twice the bits per element (with the scale byte): 8 = q4, 7 = q3.5, 6 = q3 (the QPolicy
// and calibration-table convention).
//
// Lane layout: the paged cache stores these formats not token by token but in units of 16 tokens (one m16n8k16 tile
// of the decode kernel), every lane's share of a unit as the A fragments of the kernel's two products:
//   K (scores, tokens x channels): lane (g, q) holds tokens g and g + 8 of the unit (its rows r = 0, 1), and of
//     every group of 8 channels the two members 2q, 2q + 1 (the k-block columns): half m of a word = member 2q + m.
//   V (P.V, channels x tokens): lane (g, q) holds member g of every group for the token pairs (2q, 2q + 1) (row 0)
//     and (8 + 2q, 9 + 2q) (row 1): half m of a word = token 2q + m (+ 8 r).
// Each (token, member) pair owns "slots" (the `word` of the tables): kOwn 16-bit halves, then kByte bytes, then
// (q3.5) kNib nibbles.
//   q4: D/32 halves (2 B bits per member and token, with the scale bit: 32). A lane's words: row r's halves are
//       share words r kOwn + slot.
//   q3, q3.5: D/64 halves and D/64 bytes (24 bits). A lane's words, per set s of 8 groups: 3 s + r = row r's halves
//       of slot s, 3 s + 2 = the bytes of slot kOwn + s: byte r + 2 m (so row 1 reads as row 0 after a shift by 8).
//   q3.5 adds D/64 nibbles (28 bits), after the words above, in a region of 64 bytes per nibble slot n. A byte holds
//       the nibbles of one token (a token is still written with whole-byte stores): K: lane L's byte r (token
//       g + 8 r) at 2 L + r, members 2q (low nibble) and 2q + 1 (high); V: member pair hh = g / 2 of token
//       2 q' + m + 8 r at 4 (4 hh + q') + r + 2 m, members 2 hh (low) and 2 hh + 1 (high). The kernel reads one
//       aligned word per lane and nibble slot (nib_word_offset), shifts it (nib_shift) and spreads it into the rows'
//       halves (nib_row): K: byte r x 0x1001 (member 2q + m's nibble at bit 16 m), V: the bytes as q3's.
// Inside a slot, group i's code sits at bits [pos, pos + w), pos + w <= 10 (read as the f16 subnormal
// code * 2^(pos - 24) after one AND) or pos >= 6 (the same after a shift by 6); the widths fill every slot, except
// the last half (slot kOwn - 1): 15 bits, its bit 15 (the f16 sign bit, masked off by every code mask) holds one
// bit of the token's scale byte, b = member (K: 2q + m; V: g). Every half and byte holds bits of one token only, so
// a token is written with 16- and 8-bit stores that touch nothing of its neighbours.
//
// Byte offsets inside a unit (B2 D bytes; a page of P tokens is P / 16 units, unit u at u * B2 D of the (page,
// kv head) block), lane L's share byte s: q4: ((s / 16) * 32 + L) * 16 + s % 16 (16-byte piece s / 16 of every lane
// together: one 512-byte copy per warp instruction, each lane copying what it reads); q3, q3.5: ((s / 4) * 32 + L) *
// 4 + s % 4 (word-major: the kernel copies the unit whole, then every lane reads its words without bank conflicts).
// K: L = 4 (t % 8) + q, r = t / 8; V: L = 4 g + (t % 8) / 2, r = t / 8, m = t % 2.
#pragma once
#include <cstdint>

#include "kvpack/block/common.h"

namespace kvpack::block {

struct LaneGroup {
  int w, word, pos;  // width (bits), slot of the (token, member) (halves, then bytes), first bit inside the slot
};

template <int B2, int D, bool V>
struct QLanes {
  static_assert(B2 == 8 || B2 == 7 || B2 == 6, "lane layouts exist for q4 (B2 = 8), q3.5 (7) and q3 (6)");
  static_assert(D == 64 || D == 128, "head_dim must be 64 or 128");
  static constexpr int kGroups = D / 8;
  static constexpr bool kWordMajor = B2 != 8;              // q3, q3.5: the unit is read word by word
  static constexpr int kOwn = B2 == 8 ? D / 32 : D / 64;   // 16-bit slots per (token, member)
  static constexpr int kByte = B2 == 8 ? 0 : D / 64;       // 8-bit slots per (token, member)
  static constexpr int kNib = B2 == 7 ? D / 64 : 0;        // 4-bit slots per (token, member)
  static constexpr int kReg = kOwn + kByte;                // halves and bytes: the slots of the share words
  static constexpr int kSlots = kReg + kNib;
  static constexpr int kScaleSlot = kOwn - 1;              // the half whose bit 15 holds a scale-byte bit
  static constexpr int kSparePos = 15;
  static constexpr int kUnitTokens = 16;
  static constexpr int kTokenBytes = B2 * D / 16;          // with the scale byte: exactly B2 / 2 bits per element
  static constexpr int kUnitBytes = 16 * kTokenBytes;
  static constexpr int kShareWords = B2 == 8 ? kUnitBytes / 128 : 3 * (D / 64);  // a lane's words of halves and bytes
  static constexpr int kNibBase = kShareWords * 128;       // q3.5: the nibble region (64 bytes per nibble slot)
  static constexpr int kCodeBits = kTokenBytes - 1;        // per member = the logical block's code bytes
  // A token's pieces (what one 16- or 8-bit store writes): 8 members x kReg slots, then the nibble bytes (two
  // members each: K 4 lanes q, V 4 member pairs hh, per nibble slot).
  static constexpr int kPieces = 8 * kReg + 4 * kNib;

  // Group i's width and place. Group order = the calibration's (energy descending, widths non-increasing).
  static KVPACK_HD constexpr LaneGroup group(int i) {
    if constexpr (B2 == 8) {
      // D = 64. K [8,5,4,3,3,3,3,2] and V [5,4,4,4,4,4,3,3] (31 bits each: the patterns measured in
      // docs/FORMATS.md).
      constexpr LaneGroup k64[8] = {{8, 0, 0}, {5, 0, 8}, {4, 1, 0}, {3, 1, 4},
                                    {3, 1, 7}, {3, 1, 10}, {3, 0, 13}, {2, 1, 13}};
      constexpr LaneGroup v64[8] = {{5, 0, 0}, {4, 0, 5}, {4, 0, 9}, {4, 1, 0},
                                    {4, 1, 4}, {4, 1, 8}, {3, 0, 13}, {3, 1, 12}};
      // D = 128: the D = 64 patterns with every group split in two (no D = 128 model to calibrate on here), plus
      // one bit: K [8,8,5,5,4,4,3 x 9,2], V [5,5,4 x 11,3,3,3] (63 bits each).
      constexpr LaneGroup k128[16] = {{8, 0, 0},  {8, 0, 8},  {5, 1, 0},  {5, 1, 5},  {4, 2, 0},  {4, 2, 4},
                                      {3, 1, 10}, {3, 1, 13}, {3, 2, 8},  {3, 2, 11}, {3, 3, 0},  {3, 3, 3},
                                      {3, 3, 6},  {3, 3, 9},  {3, 3, 12}, {2, 2, 14}};
      constexpr LaneGroup v128[16] = {{5, 0, 0},  {5, 0, 5},  {4, 1, 0},  {4, 1, 4},  {4, 1, 8},  {4, 1, 12},
                                      {4, 2, 0},  {4, 2, 4},  {4, 2, 8},  {4, 2, 12}, {4, 3, 0},  {4, 3, 4},
                                      {4, 3, 8},  {3, 0, 10}, {3, 0, 13}, {3, 3, 12}};
      if constexpr (D == 64) return V ? v64[i] : k64[i];
      else return V ? v128[i] : k128[i];
    } else if constexpr (B2 == 7) {
      // D = 64: slot 0 = the half (15 code bits), 1 = the byte, 2 = the nibble. K [7,4,4,3,3,2,2,2] and V
      // [5,4,4,3,3,3,3,2] (27 bits each: SmolLM2's most common q3.5 allocations, docs/FORMATS.md).
      constexpr LaneGroup k64[8] = {{7, 0, 0}, {4, 0, 7}, {4, 0, 11}, {3, 1, 0},
                                    {3, 1, 3}, {2, 1, 6}, {2, 2, 0},  {2, 2, 2}};
      constexpr LaneGroup v64[8] = {{5, 0, 0}, {4, 0, 5}, {4, 2, 0}, {3, 0, 9},
                                    {3, 0, 12}, {3, 1, 0}, {3, 1, 3}, {2, 1, 6}};
      // D = 128 (slots: halves 0, 1, bytes 2, 3, nibbles 4, 5): the D = 64 patterns with every group split in two,
      // plus one bit: K [7,7,4,4,4,4,3 x 5,2 x 5], V [5,5,4 x 5,3 x 7,2,2] (55 bits each).
      constexpr LaneGroup k128[16] = {{7, 0, 0}, {7, 1, 0}, {4, 0, 10}, {4, 1, 7}, {4, 1, 11}, {4, 4, 0},
                                      {3, 0, 7}, {3, 2, 0}, {3, 2, 3},  {3, 3, 0}, {3, 3, 3},  {2, 0, 14},
                                      {2, 2, 6}, {2, 3, 6}, {2, 5, 0},  {2, 5, 2}};
      constexpr LaneGroup v128[16] = {{5, 0, 0}, {5, 0, 5}, {4, 1, 0},  {4, 1, 4}, {4, 1, 8}, {4, 4, 0},
                                      {4, 5, 0}, {3, 0, 10}, {3, 0, 13}, {3, 1, 12}, {3, 2, 0}, {3, 2, 3},
                                      {3, 3, 0}, {3, 3, 3},  {2, 2, 6},  {2, 3, 6}};
      if constexpr (D == 64) return V ? v64[i] : k64[i];
      else return V ? v128[i] : k128[i];
    } else {
      // D = 64: slot 0 = the half (15 code bits), slot 1 = the byte. K [6,4,3,3,2,2,2,1] and V [4,4,3,3,3,2,2,2]
      // (23 bits each: SmolLM2's most common q3 allocations, docs/FORMATS.md).
      constexpr LaneGroup k64[8] = {{6, 0, 0}, {4, 0, 6}, {3, 0, 10}, {3, 1, 0},
                                    {2, 0, 13}, {2, 1, 3}, {2, 1, 5}, {1, 1, 7}};
      constexpr LaneGroup v64[8] = {{4, 0, 0}, {4, 0, 4}, {3, 0, 8}, {3, 1, 0},
                                    {3, 1, 3}, {2, 0, 11}, {2, 0, 13}, {2, 1, 6}};
      // D = 128 (slots: halves 0, 1, bytes 2, 3): the D = 64 patterns with every group split in two, plus one bit:
      // K [6,6,4,4,3,3,3,3,2 x 7,1], V [4 x 5,3 x 5,2 x 6] (47 bits each).
      constexpr LaneGroup k128[16] = {{6, 0, 0}, {6, 0, 6}, {4, 0, 12}, {4, 1, 0}, {3, 1, 4}, {3, 1, 7},
                                      {3, 1, 10}, {3, 2, 0}, {2, 1, 13}, {2, 2, 3}, {2, 2, 5}, {2, 3, 0},
                                      {2, 3, 2},  {2, 3, 4}, {2, 3, 6},  {1, 2, 7}};
      constexpr LaneGroup v128[16] = {{4, 0, 0}, {4, 0, 4}, {4, 0, 8},  {4, 0, 12}, {4, 1, 0}, {3, 1, 4},
                                      {3, 1, 7}, {3, 1, 10}, {3, 2, 0}, {3, 2, 3},  {2, 1, 13}, {2, 2, 6},
                                      {2, 3, 0}, {2, 3, 2},  {2, 3, 4}, {2, 3, 6}};
      if constexpr (D == 64) return V ? v64[i] : k64[i];
      else return V ? v128[i] : k128[i];
    }
  }
  static KVPACK_HD constexpr int bits(int i) { return group(i).w; }
  // Whether group i is read after the shift by 6 (its code does not fit the 10 mantissa bits in place).
  static KVPACK_HD constexpr bool shifted(int i) { return group(i).pos + group(i).w > 10; }
  static KVPACK_HD constexpr bool is_byte(int slot) { return slot >= kOwn && slot < kReg; }
  static KVPACK_HD constexpr bool is_nib(int slot) { return slot >= kReg; }
  static KVPACK_HD constexpr int slot_bits(int slot) {
    return is_nib(slot) ? 4 : is_byte(slot) ? 8 : slot == kScaleSlot ? 15 : 16;
  }

  // The pattern's rules, checked at compile time below.
  static constexpr bool valid() {
    uint32_t used[kSlots] = {};
    int sum = 0;
    for (int i = 0; i < kGroups; ++i) {
      const LaneGroup g = group(i);
      if (g.w < 1 || g.w > 8 || g.word < 0 || g.word >= kSlots || g.pos < 0 || g.pos + g.w > slot_bits(g.word))
        return false;
      if (g.pos + g.w > 10 && g.pos < 6) return false;  // neither in place nor after the shift by 6
      if (i > 0 && g.w > group(i - 1).w) return false;   // widths non-increasing (the calibration's group order)
      const uint32_t m = ((1u << g.w) - 1u) << g.pos;
      if (used[g.word] & m) return false;
      used[g.word] |= m;
      sum += g.w;
    }
    for (int s = 0; s < kSlots; ++s)
      if (used[s] != (1u << slot_bits(s)) - 1u) return false;  // every slot full
    return sum == kCodeBits && kShareWords * 32 * 4 + kNib * 64 == kUnitBytes;
  }

  // The kernel's view: share word of (slot, row r) (halves and bytes), and the shift that brings row r's bits to
  // the slot's positions.
  static KVPACK_HD constexpr int share_word(int slot, int r) {
    if constexpr (B2 == 8) return r * kOwn + slot;
    else return is_byte(slot) ? 3 * (slot - kOwn) + 2 : 3 * slot + r;
  }
  static KVPACK_HD constexpr int row_shift(int slot, int r) { return is_byte(slot) ? 8 * r : 0; }
  // q3.5's nibble slot kReg + n: the aligned word lane L reads, the shift that brings its nibbles to bit 0 of their
  // bytes, and row r's slot word from it (the code of member / token (r, m) at bit 16 m, bits 4-15 masked off by
  // every code mask).
  static KVPACK_HD constexpr int nib_word_offset(int n, int L) {
    return kNibBase + 64 * n + (V ? 4 * (4 * ((L / 4) / 2) + L % 4) : 4 * (L / 2));
  }
  static KVPACK_HD constexpr int nib_shift(int L) { return V ? 4 * ((L / 4) % 2) : 16 * (L % 2); }
  static KVPACK_HD constexpr uint32_t nib_row(uint32_t w, int r) {
    return V ? w >> (8 * r) : ((w >> (8 * r)) & 0xffu) * 0x1001u;
  }

  // Byte offset, inside its unit, of lane L's share byte s (the halves and bytes).
  static KVPACK_HD constexpr int share_offset(int L, int s) {
    if constexpr (B2 == 8) return ((s / 16) * 32 + L) * 16 + s % 16;
    else return ((s / 4) * 32 + L) * 4 + s % 4;
  }
  // Piece j (0 .. kPieces - 1) of a token. Halves and bytes (j < 8 kReg): K: j = (q kReg + slot) 2 + m; V:
  // j = g kReg + slot; one member. Nibble bytes (j = 8 kReg + 4 n + x): slot kReg + n, members 2x (low nibble) and
  // 2x + 1 (K: x = the lane's q; V: x = the member pair).
  static KVPACK_HD constexpr bool piece_is_nib(int j) { return j >= 8 * kReg; }
  static KVPACK_HD constexpr int piece_slot(int j) {
    return piece_is_nib(j) ? kReg + (j - 8 * kReg) / 4 : V ? j % kReg : (j / 2) % kReg;
  }
  static KVPACK_HD constexpr int piece_member(int j) {  // nibble bytes: the low nibble's member
    return piece_is_nib(j) ? 2 * ((j - 8 * kReg) % 4) : V ? j / kReg : 2 * (j / 2 / kReg) + j % 2;
  }
  static KVPACK_HD constexpr int piece_bytes(int j) { return piece_is_nib(j) || is_byte(piece_slot(j)) ? 1 : 2; }
  // Byte offset, inside its unit, of piece j of the unit's token t (0 .. 15).
  static KVPACK_HD constexpr int piece_offset(int t, int j) {
    const int slot = piece_slot(j), r = t / 8;
    if (piece_is_nib(j)) {
      const int n = slot - kReg, x = (j - 8 * kReg) % 4;
      return V ? kNibBase + 64 * n + 4 * (4 * x + (t % 8) / 2) + r + 2 * (t % 2)
               : kNibBase + 64 * n + 2 * (4 * (t % 8) + x) + r;
    }
    int lane, m;
    if constexpr (V) {
      lane = 4 * (j / kReg) + (t % 8) / 2;
      m = t % 2;
    } else {
      lane = 4 * (t % 8) + j / 2 / kReg;
      m = j % 2;
    }
    const int s = 4 * share_word(slot, r) + (is_byte(slot) ? r + 2 * m : 2 * m);
    return share_offset(lane, s);
  }
  // Piece j's bits (16, 8, or a nibble byte's two members) from the token's codes (code_of(c): channel c = 8 i +
  // member of group i) and scale byte e.
  template <class CodeOf>
  static KVPACK_HD uint16_t piece_value_of(CodeOf&& code_of, uint8_t e, int j) {
    const int slot = piece_slot(j), mem = piece_member(j);
    uint32_t h = 0;
    // Unrolled: group(i) is then a constant (a runtime index would copy the table to local memory: v44).
    KVPACK_UNROLL
    for (int i = 0; i < kGroups; ++i) {
      const LaneGroup g = group(i);
      if (g.word != slot) continue;
      const uint32_t mask = (1u << g.w) - 1u;
      h |= (static_cast<uint32_t>(code_of(8 * i + mem)) & mask) << g.pos;
      if (piece_is_nib(j)) h |= (static_cast<uint32_t>(code_of(8 * i + mem + 1)) & mask) << (g.pos + 4);
    }
    if (slot == kScaleSlot) h |= ((static_cast<uint32_t>(e) >> mem) & 1u) << kSparePos;
    return static_cast<uint16_t>(h);
  }
  static KVPACK_HD uint16_t piece_value(const int* k, uint8_t e, int j) {
    return piece_value_of([&](int c) { return k[c]; }, e, j);
  }
  // The inverse: piece j's codes into k[], its scale bit into e (the caller starts e at 0).
  static KVPACK_HD void piece_read(uint16_t h, int j, int* k, uint8_t& e) {
    const int slot = piece_slot(j), mem = piece_member(j);
    KVPACK_UNROLL
    for (int i = 0; i < kGroups; ++i) {
      const LaneGroup g = group(i);
      if (g.word != slot) continue;
      const uint32_t mask = (1u << g.w) - 1u;
      k[8 * i + mem] = static_cast<int>((static_cast<uint32_t>(h) >> g.pos) & mask);
      if (piece_is_nib(j)) k[8 * i + mem + 1] = static_cast<int>((static_cast<uint32_t>(h) >> (g.pos + 4)) & mask);
    }
    if (slot == kScaleSlot) e = static_cast<uint8_t>(e | (((h >> kSparePos) & 1u) << mem));
  }

  // Token t (0 .. 15) of a unit, from / to its codes k[D] and scale byte (what the CPU reference and the GPU
  // dequantiser call; the GPU write path stores the same piece_value at the same piece_offset, one thread per piece).
  static KVPACK_HD void store_token(const int* k, uint8_t e, int t, uint8_t* unit) {
    for (int j = 0; j < kPieces; ++j) {
      const uint16_t h = piece_value(k, e, j);
      const int o = piece_offset(t, j);
      unit[o] = static_cast<uint8_t>(h & 0xffu);
      if (piece_bytes(j) == 2) unit[o + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  static KVPACK_HD void load_token(const uint8_t* unit, int t, int* k, uint8_t& e) {
    e = 0;
    for (int j = 0; j < kPieces; ++j) {
      const int o = piece_offset(t, j);
      const uint16_t h = piece_bytes(j) == 2 ? static_cast<uint16_t>(unit[o] | (unit[o + 1] << 8)) : unit[o];
      piece_read(h, j, k, e);
    }
  }
};

template <int D, bool V>
using Q4Lanes = QLanes<8, D, V>;
template <int D, bool V>
using Q35Lanes = QLanes<7, D, V>;
template <int D, bool V>
using Q3Lanes = QLanes<6, D, V>;

static_assert(Q4Lanes<64, false>::valid() && Q4Lanes<64, true>::valid(), "q4 lane pattern, head_dim 64");
static_assert(Q4Lanes<128, false>::valid() && Q4Lanes<128, true>::valid(), "q4 lane pattern, head_dim 128");
static_assert(Q35Lanes<64, false>::valid() && Q35Lanes<64, true>::valid(), "q3.5 lane pattern, head_dim 64");
static_assert(Q35Lanes<128, false>::valid() && Q35Lanes<128, true>::valid(), "q3.5 lane pattern, head_dim 128");
static_assert(Q3Lanes<64, false>::valid() && Q3Lanes<64, true>::valid(), "q3 lane pattern, head_dim 64");
static_assert(Q3Lanes<128, false>::valid() && Q3Lanes<128, true>::valid(), "q3 lane pattern, head_dim 128");

// The fixed width of group g for a lane format (B2 = twice the bits: 8 q4, 7 q3.5, 6 q3), head_dim and K|V: the one
// table the calibration, the loader, the synthetic parameters and the kernels read.
KVPACK_HD constexpr int lane_group_bits(int B2, int head_dim, bool is_v, int g) {
  if (B2 == 8)
    return head_dim == 64 ? (is_v ? Q4Lanes<64, true>::bits(g) : Q4Lanes<64, false>::bits(g))
                          : (is_v ? Q4Lanes<128, true>::bits(g) : Q4Lanes<128, false>::bits(g));
  if (B2 == 7)
    return head_dim == 64 ? (is_v ? Q35Lanes<64, true>::bits(g) : Q35Lanes<64, false>::bits(g))
                          : (is_v ? Q35Lanes<128, true>::bits(g) : Q35Lanes<128, false>::bits(g));
  return head_dim == 64 ? (is_v ? Q3Lanes<64, true>::bits(g) : Q3Lanes<64, false>::bits(g))
                        : (is_v ? Q3Lanes<128, true>::bits(g) : Q3Lanes<128, false>::bits(g));
}

}  // namespace kvpack::block
