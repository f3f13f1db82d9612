#include <array>
#include <vector>

#include "kvpack/error.h"
#include "kvpack/formats.h"

namespace kvpack {
namespace {
constexpr std::array<FormatInfo, 7> kFormats{{
    {Format::bf16, "bf16", 16.0, 0, false, true, "bf16 reference cache"},
    {Format::fp8, "fp8", 8.0, 0, true, true, "e4m3, static calibrated scale per (layer, kv head, K/V)"},
    {Format::int4, "int4", 4.5, 0, false, true, "4-bit symmetric, fp16 scale per 32 elements"},
    {Format::int4h, "int4h", 4.5, 0, false, true, "int4 after a Hadamard rotation of each head vector"},
    {Format::q4, "q4", 4.0, kSinkTokens, true, false, "kvpack calibrated 4.0-bit"},
    {Format::q3_5, "q3.5", 3.5, kSinkTokens, true, false, "kvpack calibrated 3.5-bit"},
    {Format::q3, "q3", 3.0, kSinkTokens, true, false, "kvpack calibrated 3.0-bit"},
}};
}  // namespace

std::span<const FormatInfo> all_formats() { return kFormats; }

const FormatInfo& format_info(Format f) { return kFormats.at(static_cast<size_t>(f)); }

std::string_view format_name(Format f) { return format_info(f).name; }

std::optional<Format> parse_format(std::string_view name) {
  for (const auto& f : kFormats)
    if (f.name == name) return f.id;
  return std::nullopt;
}

std::vector<Format> parse_format_list(std::string_view list) {
  std::vector<Format> out;
  if (list == "all") {
    for (const auto& f : kFormats) out.push_back(f.id);
    return out;
  }
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    std::string_view item = list.substr(start, end - start);
    if (!item.empty()) {
      auto f = parse_format(item);
      if (!f) {
        std::string known;
        for (const auto& k : kFormats) known += (known.empty() ? "" : ", ") + std::string(k.name);
        fail("unknown format '{}' (known: {})", item, known);
      }
      out.push_back(*f);
    }
    start = end + 1;
  }
  KVPACK_CHECK(!out.empty(), "empty format list '{}'", list);
  return out;
}

}  // namespace kvpack
