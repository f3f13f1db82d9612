// The format registry: the ONE source of truth for format names and bits per element.
// Everything that needs "how many bits does q3.5 cost" (planner, bench, eval JSON, docs) asks here.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvpack {

enum class Format : int { bf16 = 0, fp8, int4, int4h, q4, q3_5, q3 };

// First tokens of every sequence that kvpack's own formats keep exactly, in bf16 (attention sinks). The registry's
// FormatInfo::sink_tokens is this or 0; kernels use it as a compile-time bound.
inline constexpr int kSinkTokens = 4;

// Formats with one fixed width pattern per (head_dim, K|V), stored in the paged cache's lane layout
// (include/kvpack/block/q_lanes.h): twice their bits per element (with the scale byte; block::QLanes' B2), else 0.
constexpr int lane_bits_x2(Format f) {
  return f == Format::q4 ? 8 : f == Format::q3_5 ? 7 : f == Format::q3 ? 6 : 0;
}

struct FormatInfo {
  Format id;
  std::string_view name;      // CLI/JSON/docs name: "bf16", "fp8", "int4", "int4h", "q4", "q3.5", "q3"
  double bits_per_element;    // total bits per stored K/V element, ALL per-token metadata included
  int sink_tokens;            // first tokens of each sequence kept in bf16 (per-sequence overhead, not in bits_per_element)
  bool calibrated;            // needs a calibration file (static scales / transforms)
  bool baseline;              // a format users run today (compared against), vs kvpack's own
  std::string_view summary;   // one line for tables and --help
};

// All formats in display order.
std::span<const FormatInfo> all_formats();
const FormatInfo& format_info(Format f);
std::optional<Format> parse_format(std::string_view name);
// Parses "q4,q3.5,int4" (or "all"); throws kvpack::Error naming the unknown entry.
std::vector<Format> parse_format_list(std::string_view list);
std::string_view format_name(Format f);

}  // namespace kvpack
