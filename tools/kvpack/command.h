// Subcommand registry for the kvpack CLI. Each tools/kvpack/cmd_*.cpp registers itself with a static
//   static const bool registered = kvpack::cli::register_command("ppl", "Perplexity of a model over a text", setup);
// where setup(CLI::App*) adds options to the subcommand and returns the function to run (exit code).
// Keep commands thin: parse options, call the library, print a table or JSON.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace kvpack::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App*)>;

bool register_command(std::string name, std::string help, Setup setup);

}  // namespace kvpack::cli
