#include <fmt/format.h>

#include <map>
#include <memory>

#include "command.h"
#include "kvpack/error.h"

namespace kvpack::cli {
namespace {
struct Entry {
  std::string help;
  Setup setup;
};
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
}  // namespace

bool register_command(std::string name, std::string help, Setup setup) {
  registry().emplace(std::move(name), Entry{std::move(help), std::move(setup)});
  return true;
}

}  // namespace kvpack::cli

int main(int argc, char** argv) {
  CLI::App app{"kvpack: calibrated 4.0/3.5/3.0-bit KV caches for long-context LLM serving"};
  app.set_version_flag("--version", std::string("kvpack ") + KVPACK_VERSION);
  app.require_subcommand(1);
  std::map<CLI::App*, kvpack::cli::Runner> runners;
  for (auto& [name, entry] : kvpack::cli::registry()) {
    CLI::App* sub = app.add_subcommand(name, entry.help);
    runners[sub] = entry.setup(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const kvpack::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
