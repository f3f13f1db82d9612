// Block cores of the baseline formats (fp8, int4, int4h) and the shared scalar pieces: golden bytes from
// independent implementations (torch float8_e4m3fn, gguf's numpy q4_0), exhaustive and property tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "kvpack/block/layout.h"
#include "kvpack/codec.h"
#include "kvpack/error.h"

using namespace kvpack;
using namespace kvpack::block;

namespace {
std::vector<uint8_t> read_bin(const std::string& name) {
  std::ifstream f(std::string(KVPACK_TEST_DATA) + "/codec/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  return {std::istreambuf_iterator<char>(f), {}};
}
std::vector<float> randn(int n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(Fp8E4m3, GoldenAgainstTorch) {
  auto b = read_bin("fp8_e4m3.bin");
  ASSERT_EQ(b.size(), 4096u * 5);
  std::vector<float> x(4096);
  std::memcpy(x.data(), b.data(), 4096 * 4);
  for (int i = 0; i < 4096; ++i) EXPECT_EQ(f32_to_e4m3(x[i]), b[4096 * 4 + i]) << "x=" << x[i] << " i=" << i;
}

TEST(Fp8E4m3, ExhaustiveRoundTripAndSpecials) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    if (c == 0x80) {  // -0 encodes back to -0
      EXPECT_EQ(f32_to_e4m3(v), 0x80);
      continue;
    }
    EXPECT_EQ(f32_to_e4m3(v), c) << c;
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e9f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // would round to 480 (no such value): saturates
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal rounds to 0
}

TEST(Int4, GoldenAgainstGgmlQ4_0) {
  auto b = read_bin("q4_0.bin");
  ASSERT_EQ(b.size(), 64u * 32 * 4 + 64u * 18);
  std::vector<float> x(64 * 32);
  std::memcpy(x.data(), b.data(), x.size() * 4);
  const uint8_t* ref = b.data() + x.size() * 4;
  int mismatched = 0;
  for (int g = 0; g < 64; ++g) {
    uint8_t codes[16];
    const uint16_t d = q4_0_encode_group(x.data() + 32 * g, codes);
    EXPECT_EQ(d, static_cast<uint16_t>(ref[18 * g] | (ref[18 * g + 1] << 8))) << "group " << g;
    mismatched += std::memcmp(codes, ref + 18 * g + 2, 16) != 0;
    // Decoding agrees with ggml's (code - 8) * fp16(d).
    float out[32];
    q4_0_decode_group(codes, d, out);
    for (int j = 0; j < 32; ++j) {
      const int q = j < 16 ? (codes[j] & 15) : (codes[j - 16] >> 4);
      EXPECT_EQ(out[j], static_cast<float>(q - 8) * f16_to_f32(d));
    }
  }
  // gguf's numpy reference rounds x*id and +8.5 separately while ggml (and kvpack) fuse them; on these inputs no
  // tie falls between the two, so every byte matches.
  EXPECT_EQ(mismatched, 0);
}

// sanitize() and q4_0_encode_group pinned to their definitions (written out below with comparisons), bit for bit on
// the values where another spelling could part from them: NaN, +-inf, the clamp bounds and their neighbours, signed
// zeros, subnormals, and groups whose largest magnitude appears with both signs (the first one wins). Since v64
// (bench/NOTES.md) the code spells them with fminf / fmaxf / fabsf so that the GPU's write kernel folds them; this
// test is what says the spellings agree.
namespace {
float sanitize_def(float x) {
  if (!(x == x)) return 0.0f;
  return x > kMaxInput ? kMaxInput : (x < -kMaxInput ? -kMaxInput : x);
}
uint16_t q4_0_encode_group_def(const float* x, uint8_t* codes) {
  float v[32];
  float amax = 0.0f, m = 0.0f;
  for (int j = 0; j < 32; ++j) {
    float t = x[j];
    if (!(t == t)) t = 0.0f;
    t = t > 524032.0f ? 524032.0f : (t < -524032.0f ? -524032.0f : t);
    v[j] = t;
    float a = t < 0.0f ? -t : t;
    if (a > amax) {
      amax = a;
      m = t;
    }
  }
  const float d = m / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 16; ++j) {
    int q0 = static_cast<int>(std::fma(v[j], id, 8.5f));
    int q1 = static_cast<int>(std::fma(v[j + 16], id, 8.5f));
    q0 = q0 > 15 ? 15 : q0;
    q1 = q1 > 15 ? 15 : q1;
    codes[j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
  return f32_to_f16(d);
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST(Int4, EncodeGroupMatchesItsDefinition) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {nan, -nan, inf, -inf, 0.0f, -0.0f, 524032.0f, -524032.0f,
                            std::nextafter(524032.0f, inf), std::nextafter(-524032.0f, -inf),
                            std::nextafter(524032.0f, 0.0f), kMaxInput, -kMaxInput, std::nextafter(kMaxInput, inf),
                            std::nextafter(-kMaxInput, -inf), 1e30f, -1e30f, std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(), 1e-40f, 3.0f, -3.0f};
  for (float x : specials) EXPECT_EQ(bits_of(sanitize(x)), bits_of(sanitize_def(x))) << x;
  std::mt19937_64 g(64);
  std::uniform_int_distribution<int> pick(0, static_cast<int>(std::size(specials)) - 1), pos(0, 31), coin(0, 3);
  int groups = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    auto x = randn(32, 1000 + trial, std::ldexp(1.0f, trial % 40 - 20));
    const int kind = trial % 5;
    if (kind == 1)  // a few specials anywhere
      for (int s = 0; s <= coin(g); ++s) x[pos(g)] = specials[pick(g)];
    if (kind == 2) {  // the largest magnitude twice, with both signs, in either order
      float a = 0;
      for (float t : x) a = std::max(a, std::abs(t));
      const int i = pos(g), j = pos(g);
      x[i] = coin(g) % 2 ? a : -a;
      x[j] = -x[i];
    }
    if (kind == 3)
      for (auto& t : x) t = coin(g) == 0 ? specials[pick(g)] : t;  // mostly specials
    if (kind == 4)
      for (auto& t : x) t = coin(g) % 2 ? 0.0f : -0.0f;  // all zeros
    uint8_t a[16], b[16];
    const uint16_t da = q4_0_encode_group(x.data(), a), db = q4_0_encode_group_def(x.data(), b);
    EXPECT_EQ(da, db) << "trial " << trial;
    EXPECT_EQ(std::memcmp(a, b, 16), 0) << "trial " << trial;
    for (float t : x) EXPECT_EQ(bits_of(sanitize(t)), bits_of(sanitize_def(t)));
    ++groups;
  }
  EXPECT_EQ(groups, 20000);
}

template <int D, bool R>
void int4_properties(uint64_t seed) {
  using B = Int4Block<D, R>;
  for (int trial = 0; trial < 50; ++trial) {
    auto x = randn(D, seed + trial, std::ldexp(1.0f, trial % 12 - 6));
    if (trial % 5 == 0) x[trial % D] *= 30;  // an outlier channel
    uint8_t blk[B::kBytes];
    B::encode(x.data(), blk, blk + B::kCodeBytes);
    std::vector<float> y(D), xr(x);
    B::decode(blk, blk + B::kCodeBytes, y.data());
    if (R) hadamard<D>(xr.data());
    std::vector<float> yr(D);
    B::decode_rotated(blk, blk + B::kCodeBytes, yr.data());
    for (int g = 0; g < D / 32; ++g) {
      const float d = std::abs(f16_to_f32(static_cast<uint16_t>(blk[B::kCodeBytes + 2 * g] | (blk[B::kCodeBytes + 2 * g + 1] << 8))));
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xr[32 * g + j]));
      for (int j = 0; j < 32; ++j)
        EXPECT_LE(std::abs(yr[32 * g + j] - xr[32 * g + j]), d * 1.0001f + amax * 1e-3f) << D << R << trial;
    }
    // Model-basis error equals the rotated-basis error (orthonormal rotation) up to fp32 rounding.
    double e1 = 0, e2 = 0;
    for (int i = 0; i < D; ++i) {
      e1 += (y[i] - x[i]) * double(y[i] - x[i]);
      e2 += (yr[i] - xr[i]) * double(yr[i] - xr[i]);
    }
    EXPECT_NEAR(e1, e2, 1e-4 * (e2 + 1e-12) + 1e-9);
    // Deterministic: same input, same bytes.
    uint8_t blk2[B::kBytes];
    B::encode(x.data(), blk2, blk2 + B::kCodeBytes);
    EXPECT_EQ(std::memcmp(blk, blk2, B::kBytes), 0);
  }
}

TEST(Int4, PropertiesManyShapes) {
  int4_properties<64, false>(10);
  int4_properties<128, false>(20);
  int4_properties<64, true>(30);
  int4_properties<128, true>(40);
}

TEST(Int4, NonFiniteAndHugeInputsStayFinite) {
  std::vector<float> x = randn(128, 7);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = std::numeric_limits<float>::infinity();
  x[40] = -std::numeric_limits<float>::infinity();
  x[70] = 3e38f;
  for (bool rot : {false, true}) {
    uint8_t blk[72];
    std::vector<float> y(128);
    if (rot) {
      Int4Block<128, true>::encode(x.data(), blk, blk + 64);
      Int4Block<128, true>::decode(blk, blk + 64, y.data());
    } else {
      Int4Block<128, false>::encode(x.data(), blk, blk + 64);
      Int4Block<128, false>::decode(blk, blk + 64, y.data());
    }
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
    if (!rot) {
      EXPECT_GT(y[1], 1e5f);  // +inf saturates to the clamp (8 * 65504), rounded through fp16 d
      EXPECT_LT(y[40], -1e5f);
    }
  }
}

TEST(Hadamard, SelfInverseAndOrthonormal) {
  auto x = randn(128, 3);
  auto y = x;
  hadamard<128>(y.data());
  double n0 = 0, n1 = 0;
  for (int i = 0; i < 128; ++i) {
    n0 += x[i] * double(x[i]);
    n1 += y[i] * double(y[i]);
  }
  EXPECT_NEAR(n0, n1, 1e-4 * n0);
  hadamard<128>(y.data());
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], x[i], 1e-5f);
  float e[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  hadamard<8>(e);
  for (float v : e) EXPECT_FLOAT_EQ(v, 0.35355339f);
}

TEST(ScaleByte, ExactPowersAndMonotone) {
  EXPECT_EQ(encode_scale_byte(1.0f), 128);
  EXPECT_EQ(decode_scale_byte(128), 1.0f);
  EXPECT_EQ(decode_scale_byte(144), 2.0f);
  EXPECT_EQ(decode_scale_byte(0), std::ldexp(1.0f, -8));
  EXPECT_EQ(encode_scale_byte(0.0f), 0);
  EXPECT_EQ(encode_scale_byte(-1.0f), 0);
  EXPECT_EQ(encode_scale_byte(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(encode_scale_byte(std::numeric_limits<float>::infinity()), 255);
  EXPECT_EQ(encode_scale_byte(1e30f), 255);
  EXPECT_EQ(encode_scale_byte(1e-30f), 0);
  for (int e = 0; e < 256; ++e) {
    const float t = decode_scale_byte(static_cast<uint8_t>(e));
    EXPECT_EQ(encode_scale_byte(t), e) << e;  // every step decodes to a value that encodes back to itself
    EXPECT_NEAR(t * decode_scale_byte_inv(static_cast<uint8_t>(e)), 1.0f, 1e-6f);
    if (e) EXPECT_GT(t, decode_scale_byte(static_cast<uint8_t>(e - 1)));
  }
  // Nearest in log2: within half a step (2^(1/32)) of the input across the range.
  std::mt19937_64 g(5);
  std::uniform_real_distribution<float> u(-7.9f, 7.9f);
  for (int i = 0; i < 10000; ++i) {
    const float r = std::exp2(u(g));
    const float t = decode_scale_byte(encode_scale_byte(r));
    EXPECT_LE(std::abs(std::log2(t / r)), 1.0f / 32 + 1e-5f) << r;
  }
}

TEST(BlockLayout, BitsPerElementMatchRegistry) {
  for (const auto& f : all_formats())
    for (int d : {64, 128}) {
      const auto l = block_layout(f.id, d);
      EXPECT_DOUBLE_EQ(8.0 * l.bytes() / d, f.bits_per_element) << f.name << " d=" << d;
    }
  EXPECT_EQ(block_layout(Format::q4, 96).bytes(), 0);
}

TEST(Codec, BaselinesNeedNoCalibrationOthersDo) {
  ModelConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.n_heads = 4;
  c.head_dim = 64;
  for (Format f : {Format::bf16, Format::int4, Format::int4h}) EXPECT_NO_THROW(make_codec(f, c, nullptr));
  for (Format f : {Format::fp8, Format::q4, Format::q3_5, Format::q3}) {
    try {
      make_codec(f, c, nullptr);
      FAIL() << "expected an error for " << format_name(f);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(format_name(f))), std::string::npos) << e.what();
    }
  }
  c.head_dim = 96;
  EXPECT_THROW(make_codec(Format::int4, c, nullptr), Error);
}

TEST(Codec, Int4hStoreMatchesBlockCoreAndKeepsNoSinks) {
  ModelConfig c;
  c.n_layers = 1;
  c.n_kv_heads = 3;
  c.n_heads = 9;
  c.head_dim = 64;
  auto codec = make_codec(Format::int4h, c, nullptr);
  const int n = 5;
  auto x = randn(n * 3 * 64, 99);
  auto y = x;
  std::vector<int> pos = {0, 1, 2, 3, 4};
  codec->store(0, KvKind::K, n, pos.data(), 3, 64, y.data());
  BlockCodec bc(Format::int4h, 64, nullptr);
  std::vector<uint8_t> blk(bc.bytes());
  for (int i = 0; i < n * 3; ++i) {
    float in[64], out[64];
    for (int j = 0; j < 64; ++j) in[j] = round_bf16(x[i * 64 + j]);
    bc.encode(0, i % 3, KvKind::K, in, blk.data());
    bc.decode(0, i % 3, KvKind::K, blk.data(), out);
    for (int j = 0; j < 64; ++j) EXPECT_EQ(out[j], y[i * 64 + j]);
  }
}
