// kvpack's calibrated formats q4 / q3.5 / q3: one block core, parameterised by head_dim D and the code budget.
//
// Per (layer, kv head, K|V) the calibration file provides a static affine transform and a bit allocation:
//   y = F (x - mu)                      F: D x D (a whitened KLT followed by a Hadamard inside each equal-bit group)
//   channel c of y gets b_c bits, equal for the 8 channels of a group (b in 0..8, sum over groups = code bytes)
// and per token the encoder picks one scale byte e (tau = 2^((e-128)/16), see common.h): the RMS of y weighted by
// calibrated per-channel weights gives e0, and of e0 +- kScaleSearch steps the one with the least reconstruction
// error is kept (scale_byte_of). Each channel is a mid-rise uniform quantizer with calibrated step s_c:
//   k_c = clamp(floor(y_c / tau / s_c + 2^(b-1)), 0, 2^b - 1),   y^_c = (k_c - (2^b - 1)/2) * s_c * tau
//   x^ = mu + G y^                      G = F^-1 (D x D)
// Keys: q . x^ = q . mu + tau * ((G^T q) * s) . (k - o): G, s and the offsets fold into the query once per step,
// q . mu is a per-query constant (it matters only because sink tokens are stored exactly), tau multiplies the score.
// Values: sum_t p_t x^_t = mu * sum p_t + G (s * sum_t (p_t tau_t) (k_t - o)): tau multiplies the probability,
// G and s apply once to the output. So the inner loop only turns small integers into fp16/bf16.
//
// Block layout (kCodeBytes + 1 bytes = bits * D / 8, codes and metadata separable):
//   bytes [0, kCodeBytes)   codes, group after group; group g (channels 8g..8g+7, b_g bits) fills exactly b_g bytes
//                           starting at sum_{h<g} b_h: channel 8g+i is bits [b_g*i, b_g*i + b_g) of that
//                           little-endian b_g-byte integer (0-bit groups take no bytes and decode to 0)
//   byte  kCodeBytes        the scale byte e
#pragma once
#include "kvpack/block/common.h"

namespace kvpack::block {

// One (layer, kv head, K|V)'s calibrated parameters; all arrays live in the calibration (host) or were copied to the
// device by the caller. D = head_dim.
struct QParams {
  const float* mean;          // [D] mu
  const float* fwd;           // [D, D] row-major F: y_r = sum_c F[r][c] (x_c - mu_c)
  const float* inv;           // [D, D] row-major G = F^-1: x^_r = mu_r + sum_c G[r][c] y^_c
  const float* step;          // [D] s_c (transformed domain, at tau = 1); unused for 0-bit channels
  const float* inv_step;      // [D] 1 / s_c (0 for 0-bit channels)
  const float* rms_weight;    // [D] w_c >= 0: the scale byte encodes r = sqrt(sum_c w_c y_c^2)
  const uint8_t* group_bits;  // [D/8] bits per group of 8 channels
};

// One layer's parameters for all kv heads, K or V (host or device arrays): head h's parameters start at slot
// h * head_stride of every array (arrays [num_kv_heads][...]: head_stride 1; the calibration file's interleaved
// (head, K|V) slots: head_stride 2). What the paged cache's FormatParams carry for q4/q3.5/q3.
struct QHeadTable {
  const float* mean = nullptr;          // [heads][D]
  const float* fwd = nullptr;           // [heads][D][D]
  const float* inv = nullptr;           // [heads][D][D]
  const float* step = nullptr;          // [heads][D]
  const float* inv_step = nullptr;      // [heads][D]
  const float* rms_weight = nullptr;    // [heads][D]
  const uint8_t* group_bits = nullptr;  // [heads][D/8]
  int head_stride = 1;
  KVPACK_HD QParams head(int h, int D) const {
    const long s = static_cast<long>(h) * head_stride;
    return QParams{mean + s * D,         fwd + s * D * D,           inv + s * D * D,         step + s * D,
                   inv_step + s * D,     rms_weight + s * D,        group_bits + s * (D / 8)};
  }
  KVPACK_HD bool valid() const { return mean && fwd && inv && step && inv_step && rms_weight && group_bits; }
  // The table whose head 0 is p (the one place that lists the fields; every producer goes through it).
  static QHeadTable from(const QParams& p, int head_stride = 1) {
    QHeadTable t;
    t.mean = p.mean;
    t.fwd = p.fwd;
    t.inv = p.inv;
    t.step = p.step;
    t.inv_step = p.inv_step;
    t.rms_weight = p.rms_weight;
    t.group_bits = p.group_bits;
    t.head_stride = head_stride;
    return t;
  }
};

// Bits of format (x2 so 3.5 is an integer) -> code bytes for head_dim D: bits*D/8 minus the scale byte.
constexpr int q_code_bytes(int bits_x2, int head_dim) { return bits_x2 * head_dim / 16 - 1; }

template <int D, int BitsX2>
struct QBlock {
  static_assert(D == 64 || D == 128, "head_dim must be 64 or 128");
  static constexpr int kGroups = D / 8;
  static constexpr int kCodeBytes = q_code_bytes(BitsX2, D);
  static constexpr int kMetaBytes = 1;
  static constexpr int kBytes = kCodeBytes + kMetaBytes;
  static_assert(kBytes * 16 == BitsX2 * D, "block must cost exactly the format's bits per element");

  // Centred input t_c = sanitize(x_c) - mu_c, and one transformed coefficient y_r = sum_c F[r][c] t_c (fixed order).
  // The GPU write path computes rows in parallel through these same two functions.
  static KVPACK_HD float centre(const QParams& p, float x, int c) { return centre_of(x, p.mean[c]); }
  static KVPACK_HD float centre_of(float x, float mu) { return sanitize(x) - mu; }  // (a mean already loaded)
  // N dot products at once (independent chains, so a GPU thread's loads and FMAs overlap), each summed over c = 0,
  // 1, ... in order, so a coefficient gets the same bits whatever N and the layout: product j is
  // sum_c f[j * rs + c * cs] * t[j * ts + c]. Rows of row-major F (transform_rows): rs = stride * D, cs = 1, ts = 0.
  template <int N>
  static KVPACK_HD void dots(const float* f, int rs, int cs, const float* t, int ts, float* out) {
    float acc[N];
    KVPACK_UNROLL
    for (int j = 0; j < N; ++j) acc[j] = 0.0f;
    for (int c = 0; c < D; ++c) {
      KVPACK_UNROLL
      for (int j = 0; j < N; ++j) acc[j] = fmaf(f[j * rs + c * cs], t[j * ts + c], acc[j]);
    }
    KVPACK_UNROLL
    for (int j = 0; j < N; ++j) out[j] = acc[j];
  }
  // A register tile: R rows x T vectors (R + T loads per R x T FMAs), each coefficient summed over c in order, four c
  // per step: element c of row i is f[i * rs + c], of vector j t[j * ts + c]. The GPU write path keeps f, t, rs and
  // ts 16-byte aligned, so each quad is one 16-byte shared-memory load (load4).
  template <int R, int T>
  static KVPACK_HD void dot_tile(const float* f, int rs, const float* t, int ts, float (&out)[R][T]) {
    static_assert(D % 4 == 0, "quads of c");
    float acc[R][T];
    KVPACK_UNROLL
    for (int i = 0; i < R; ++i)
      KVPACK_UNROLL
      for (int j = 0; j < T; ++j) acc[i][j] = 0.0f;
    for (int c = 0; c < D; c += 4) {
      float fq[R][4], tq[T][4];
      KVPACK_UNROLL
      for (int i = 0; i < R; ++i) load4(f + i * rs + c, fq[i]);
      KVPACK_UNROLL
      for (int j = 0; j < T; ++j) load4(t + j * ts + c, tq[j]);
      KVPACK_UNROLL
      for (int k = 0; k < 4; ++k)
        KVPACK_UNROLL
        for (int i = 0; i < R; ++i)
          KVPACK_UNROLL
          for (int j = 0; j < T; ++j) acc[i][j] = fmaf(fq[i][k], tq[j][k], acc[i][j]);
    }
    KVPACK_UNROLL
    for (int i = 0; i < R; ++i)
      KVPACK_UNROLL
      for (int j = 0; j < T; ++j) out[i][j] = acc[i][j];
  }
  // Rows r0, r0 + stride, ... of the transform of one centred vector t.
  template <int N>
  static KVPACK_HD void transform_rows(const QParams& p, const float* t, int r0, int stride, float* out) {
    dots<N>(p.fwd + r0 * D, stride * D, 1, t, 0, out);
  }
  static KVPACK_HD float transform_row(const QParams& p, const float* t, int r) {
    float y;
    transform_rows<1>(p, t, r, 0, &y);
    return y;
  }
  // Transformed coefficients y = F (sanitize(x) - mu).
  static KVPACK_HD void transform(const QParams& p, const float* x, float* y) {
    float t[D];
    for (int c = 0; c < D; ++c) t[c] = centre(p, x[c], c);
    for (int r = 0; r < D; ++r) y[r] = transform_row(p, t, r);
  }

  // Scale search: the encoder tries the 2 kScaleSearch + 1 scale bytes around the RMS choice e0 (+-4.4% per step)
  // and keeps the one whose reconstruction of the coded coefficients has the least squared error (in the whitened
  // coordinates of y that error is the calibration metric's). Only the encoder searches; the decoder reads e as
  // always. Candidate j: e0, then e0 - 1, e0 + 1, e0 - 2, e0 + 2, ... (bytes outside 0..255 skipped); the first
  // strictly smallest error wins, so ties and the order are fixed and every implementation picks the same byte.
  static constexpr int kScaleSearch = 8;  // +-8 bytes: tau within 2^(+-1/2) of the RMS choice (docs/FORMATS.md)
  static constexpr int kScaleCandidates = 2 * kScaleSearch + 1;
  // The scale byte nearest the weighted RMS of the coded coefficients (tau ~ 1 for a typical token): e0.
  static KVPACK_HD uint8_t scale_byte_rms(const QParams& p, const float* y) {
    float acc = 0.0f;
    for (int c = 0; c < D; ++c) acc = fmaf(rms_term(p.rms_weight[c], y[c]), y[c], acc);
    return encode_scale_byte(sqrtf(acc));
  }
  static KVPACK_HD float rms_term(float w, float yc) { return w * yc; }
  // The same sum from precomputed terms, channel by channel in order: quad(c, wy, y) gives channels c .. c + 3's
  // rms_term and coefficient (the GPU write path's small kernel computes the terms on separate threads and reads them
  // from shared memory). U quads are fetched before their FMAs; the sums are the same for every U and equal
  // scale_byte_rms's (QBlock.SpreadScaleSearchPiecesGiveTheSameBits).
  template <int U, class Quad>
  static KVPACK_HD uint8_t scale_byte_rms_by(Quad&& quad) {
    return encode_scale_byte(sqrtf(ordered_dot_by<U>(quad)));
  }
  // sum_c a_c b_c with explicit FMAs, c = 0, 1, ... in order: quad(c, a, b) gives channels c .. c + 3. U quads are
  // fetched before their FMAs; the sums are the same for every U.
  template <int U, class Quad>
  static KVPACK_HD float ordered_dot_by(Quad&& quad) {
    static_assert(D % (4 * U) == 0, "whole blocks of U quads");
    float acc = 0.0f;
    for (int c0 = 0; c0 < D; c0 += 4 * U) {
      float a[U][4], b[U][4];
      KVPACK_UNROLL
      for (int u = 0; u < U; ++u) quad(c0 + 4 * u, a[u], b[u]);
      KVPACK_UNROLL
      for (int u = 0; u < U; ++u)
        KVPACK_UNROLL
        for (int k = 0; k < 4; ++k) acc = fmaf(a[u][k], b[u][k], acc);
    }
    return acc;
  }
  // Candidate j of the search around e0, or -1 when it falls outside 0..255.
  static KVPACK_HD int scale_candidate(uint8_t e0, int j) {
    const int d = (j + 1) / 2, e = static_cast<int>(e0) + (j % 2 == 1 ? -d : d);
    return e >= 0 && e <= 255 ? e : -1;
  }
  // The inverse: the j of byte e in the search around e0 (|e - e0| <= kScaleSearch).
  static KVPACK_HD int scale_candidate_index(uint8_t e0, uint8_t e) {
    const int d = static_cast<int>(e) - static_cast<int>(e0);
    return d < 0 ? -2 * d - 1 : 2 * d;
  }
  // The search given the candidates' errors (err_of(j) for valid candidates; the GPU write path computes them on
  // separate threads and passes them in, the host calls scale_error directly).
  template <class ErrOf>
  static KVPACK_HD uint8_t scale_pick(uint8_t e0, ErrOf&& err_of) {
    uint8_t best = e0;
    float best_err = err_of(0);
    for (int j = 1; j < kScaleCandidates; ++j) {
      const int e = scale_candidate(e0, j);
      if (e < 0) continue;
      const float err = err_of(j);
      if (err < best_err) best_err = err, best = static_cast<uint8_t>(e);
    }
    return best;
  }
  static KVPACK_HD uint8_t scale_byte_of(const QParams& p, const float* y) {
    const uint8_t e0 = scale_byte_rms(p, y);
    return scale_pick(e0, [&](int j) { return scale_error(p, y, static_cast<uint8_t>(scale_candidate(e0, j))); });
  }
  // The code of one coefficient yc of channel c (b bits, 1..8) at 1/tau = inv_tau: the mid-rise quantiser that
  // quantize_group writes and scale_error measures (code_of_b: with 1/s_c already loaded).
  static KVPACK_HD int code_of_b(float yc, float inv_tau, float inv_step, int b) {
    const int top = (1 << b) - 1;
    const float t = yc * inv_tau;
    const int k = static_cast<int>(floorf(fmaf(t, inv_step, static_cast<float>(1 << (b - 1)))));
    return k < 0 ? 0 : (k > top ? top : k);
  }
  static KVPACK_HD int code_of(const QParams& p, float yc, float inv_tau, int c, int b) {
    return code_of_b(yc, inv_tau, p.inv_step[c], b);
  }
  // One channel's reconstruction difference y_c - y^_c at scale tau (1/tau = inv_tau) for a b-bit channel of step s
  // (1/s = inv_step); 0 for uncoded channels (b outside 1..8), which adds exactly nothing to the error below.
  static KVPACK_HD float scale_diff(float yc, float inv_tau, float tau, float step, float inv_step, int b) {
    if (b <= 0 || b > 8) return 0.0f;
    const float o = 0.5f * static_cast<float>((1 << b) - 1);
    const float yh = (static_cast<float>(code_of_b(yc, inv_tau, inv_step, b)) - o) * step;
    return fmaf(-yh, tau, yc);
  }
  // Squared reconstruction error of the coded channels of y at scale byte e: the quantiser of quantize_group and
  // the reconstruction of decode_transformed, summed channel by channel in order with explicit FMAs (no
  // contraction choices left to the compiler, so host and device get the same bits).
  static KVPACK_HD float scale_error(const QParams& p, const float* y, uint8_t e) {
    const float inv_tau = decode_scale_byte_inv(e), tau = decode_scale_byte(e);
    float err = 0.0f;
    for (int g = 0; g < kGroups; ++g) {
      const int b = p.group_bits[g];
      if (b <= 0 || b > 8) continue;  // scale_diff's 0: nothing added
      for (int i = 0; i < 8; ++i) {
        const int c = 8 * g + i;
        const float d = scale_diff(y[c], inv_tau, tau, p.step[c], p.inv_step[c], b);
        err = fmaf(d, d, err);
      }
    }
    return err;
  }
  // The error's ordered sum given the differences: quad(c, d) gives channels c .. c + 3's scale_diff (the GPU write
  // path's small kernel computes them on separate threads first). U quads are fetched before their FMAs; the sums
  // are the same for every U and equal scale_error's (uncoded channels add exactly 0).
  template <int U, class Quad>
  static KVPACK_HD float scale_error_by(Quad&& quad) {
    return ordered_dot_by<U>([&](int c, float (&d)[4], float (&d2)[4]) {
      quad(c, d);
      KVPACK_UNROLL
      for (int k = 0; k < 4; ++k) d2[k] = d[k];
    });
  }

  // One group's codes: group g (b_g bits, its first code byte at `off` = sum of the earlier groups' bits) of already-
  // transformed coefficients at 1/tau = inv_tau, written to codes[off, off + b_g). The GPU write path runs one
  // thread per (token, group) through this function; quantize() runs it for every group in order.
  static KVPACK_HD void quantize_group(const QParams& p, const float* y, float inv_tau, int g, int off, uint8_t* codes) {
    // Params are validated on load; the guard only keeps a bad table from writing past the block.
    if (!group_coded(p, g, off)) return;
    const int b = p.group_bits[g];
    uint64_t acc = 0;
    for (int i = 0; i < 8; ++i) {
      const int c = 8 * g + i;
      acc |= static_cast<uint64_t>(code_of(p, y[c], inv_tau, c, b)) << (b * i);
    }
    for (int j = 0; j < b; ++j) codes[off + j] = static_cast<uint8_t>(acc >> (8 * j));
  }
  // Whether group g, starting at code byte `off`, has codes (a bad table's oversized groups are skipped, as unpack does).
  static KVPACK_HD bool group_coded(const QParams& p, int g, int off) {
    const int b = p.group_bits[g];
    return b > 0 && b <= 8 && off + b <= kCodeBytes;
  }
  // First code byte of group g: the bits of the coded groups before it.
  static KVPACK_HD int group_offset(const QParams& p, int g) {
    int off = 0;
    for (int h = 0; h < g; ++h)
      if (group_coded(p, h, off)) off += p.group_bits[h];
    return off;
  }

  // Quantise already-transformed coefficients with a given scale byte (also used by calibration to fit steps).
  static KVPACK_HD void quantize(const QParams& p, const float* y, uint8_t e, uint8_t* codes) {
    const float inv_tau = decode_scale_byte_inv(e);
    int off = 0;
    for (int g = 0; g < kGroups; ++g) {
      if (!group_coded(p, g, off)) continue;
      quantize_group(p, y, inv_tau, g, off, codes);
      off += p.group_bits[g];
    }
  }

  // codes: kCodeBytes, meta: 1 byte (may be codes + kCodeBytes).
  static KVPACK_HD void encode(const QParams& p, const float* x, uint8_t* codes, uint8_t* meta) {
    float y[D];
    transform(p, x, y);
    const uint8_t e = scale_byte_of(p, y);
    quantize(p, y, e, codes);
    meta[0] = e;
  }

  // Member i (0..7) of a b-bit group whose b bytes start at gbytes: bits [b i, b i + b) of the little-endian
  // b-byte integer (the layout quantize_group writes).
  static KVPACK_HD int group_code(const uint8_t* gbytes, int b, int i) {
    uint32_t acc = 0;
    const int lo = b * i, first = lo / 8, last = (lo + b - 1) / 8;
    for (int j = first; j <= last; ++j) acc |= static_cast<uint32_t>(gbytes[j]) << (8 * (j - first));
    return static_cast<int>((acc >> (lo - 8 * first)) & ((1u << b) - 1u));
  }
  // Integer code of channel c (0 for 0-bit channels); what the kernel turns into fp16.
  static KVPACK_HD void unpack(const QParams& p, const uint8_t* codes, int* k) {
    int off = 0;
    for (int c = 0; c < D; ++c) k[c] = 0;
    for (int g = 0; g < kGroups; ++g) {
      const int b = p.group_bits[g];
      if (b == 0 || b > 8 || off + b > kCodeBytes) continue;
      for (int i = 0; i < 8; ++i) k[8 * g + i] = group_code(codes + off, b, i);
      off += b;
    }
  }

  // The inverse of unpack: codes k[D] (each below 2^b of its group; 0-bit groups ignored) into the block's code bytes.
  static KVPACK_HD void pack(const QParams& p, const int* k, uint8_t* codes) {
    int off = 0;
    for (int g = 0; g < kGroups; ++g) {
      if (!group_coded(p, g, off)) continue;
      const int b = p.group_bits[g];
      uint64_t acc = 0;
      for (int i = 0; i < 8; ++i) acc |= static_cast<uint64_t>(static_cast<uint32_t>(k[8 * g + i]) & ((1u << b) - 1u)) << (b * i);
      for (int j = 0; j < b; ++j) codes[off + j] = static_cast<uint8_t>(acc >> (8 * j));
      off += b;
    }
  }

  // y^ (transformed domain, tau applied): y^_c = ((k_c - o_b) * s_c) * tau; 0 for 0-bit channels.
  static KVPACK_HD void decode_transformed(const QParams& p, const uint8_t* codes, const uint8_t* meta, float* y) {
    int k[D];
    unpack(p, codes, k);
    const float tau = decode_scale_byte(meta[0]);
    for (int g = 0; g < kGroups; ++g) {
      const int b = p.group_bits[g] <= 8 ? p.group_bits[g] : 0;
      const float o = b == 0 ? 0.0f : 0.5f * static_cast<float>((1 << b) - 1);
      for (int i = 0; i < 8; ++i) {
        const int c = 8 * g + i;
        y[c] = b == 0 ? 0.0f : (static_cast<float>(k[c]) - o) * p.step[c] * tau;
      }
    }
  }

  // x^ = mu + G y^ in the model's basis.
  static KVPACK_HD void decode(const QParams& p, const uint8_t* codes, const uint8_t* meta, float* out) {
    float y[D];
    decode_transformed(p, codes, meta, y);
    for (int r = 0; r < D; ++r) {
      const float* g = p.inv + r * D;
      float acc = p.mean[r];
      for (int c = 0; c < D; ++c) acc = fmaf(g[c], y[c], acc);
      out[r] = acc;
    }
  }
};

template <int D> using Q4Block = QBlock<D, 8>;
template <int D> using Q35Block = QBlock<D, 7>;
template <int D> using Q3Block = QBlock<D, 6>;
static_assert(Q4Block<64>::kBytes == 32 && Q35Block<64>::kBytes == 28 && Q3Block<64>::kBytes == 24);
static_assert(Q4Block<128>::kBytes == 64 && Q35Block<128>::kBytes == 56 && Q3Block<128>::kBytes == 48);

}  // namespace kvpack::block
