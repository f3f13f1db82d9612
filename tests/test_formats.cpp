#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kvpack/bf16.h"
#include "kvpack/error.h"
#include "kvpack/formats.h"

using namespace kvpack;

TEST(FormatRegistry, NamesRoundTrip) {
  for (const auto& f : all_formats()) {
    auto p = parse_format(f.name);
    ASSERT_TRUE(p.has_value()) << f.name;
    EXPECT_EQ(*p, f.id);
    EXPECT_EQ(format_name(f.id), f.name);
  }
  EXPECT_FALSE(parse_format("q5").has_value());
}

TEST(FormatRegistry, BitsPerElement) {
  EXPECT_DOUBLE_EQ(format_info(Format::bf16).bits_per_element, 16.0);
  EXPECT_DOUBLE_EQ(format_info(Format::fp8).bits_per_element, 8.0);
  EXPECT_DOUBLE_EQ(format_info(Format::int4).bits_per_element, 4.5);
  EXPECT_DOUBLE_EQ(format_info(Format::int4h).bits_per_element, 4.5);
  EXPECT_DOUBLE_EQ(format_info(Format::q4).bits_per_element, 4.0);
  EXPECT_DOUBLE_EQ(format_info(Format::q3_5).bits_per_element, 3.5);
  EXPECT_DOUBLE_EQ(format_info(Format::q3).bits_per_element, 3.0);
}

TEST(FormatRegistry, ParseList) {
  auto l = parse_format_list("q4,q3.5,int4");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[1], Format::q3_5);
  EXPECT_EQ(parse_format_list("all").size(), all_formats().size());
  try {
    parse_format_list("q4,q9");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q9"), std::string::npos);
  }
}

TEST(Bf16, RoundTripAndRounding) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 512), 1.0078125f);
  EXPECT_TRUE(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(round_bf16(std::numeric_limits<float>::infinity())));
}

TEST(Fp16, ExhaustiveRoundTrip) {
  // Every finite fp16 value converts to fp32 and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    float f = f16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}
