// `kvpack formats`: list the format registry (names, bits per element, sink tokens).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "kvpack/formats.h"

namespace {
kvpack::cli::Runner setup(CLI::App* app) {
  auto json = std::make_shared<bool>(false);
  app->add_flag("--json", *json, "Print JSON instead of a table");
  return [json] {
    if (*json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& f : kvpack::all_formats())
        out.push_back({{"format", f.name},
                       {"bits_per_element", f.bits_per_element},
                       {"sink_tokens", f.sink_tokens},
                       {"calibrated", f.calibrated},
                       {"baseline", f.baseline},
                       {"summary", f.summary}});
      fmt::print("{}\n", out.dump(2));
      return 0;
    }
    fmt::print("{:<7} {:>9} {:>6}  {}\n", "format", "bits/elem", "sinks", "description");
    for (const auto& f : kvpack::all_formats())
      fmt::print("{:<7} {:>9.4g} {:>6}  {}\n", f.name, f.bits_per_element, f.sink_tokens, f.summary);
    return 0;
  };
}
const bool registered = kvpack::cli::register_command("formats", "List KV-cache formats and their bits per element", setup);
}  // namespace
