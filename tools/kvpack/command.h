// Subcommand registry for the kvpack CLI. Each tools/kvpack/cmd_*.cpp registers itself with a static
//   static const bool registered = kvpack::cli::register_command("ppl", "Perplexity of a model over a text", setup);
// where setup(CLI::App*) adds options to the subcommand and returns the function to run (exit code).
// Keep commands thin: parse options, call the library, print a table or JSON.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <limits>
#include <string>

namespace kvpack::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App*)>;

bool register_command(std::string name, std::string help, Setup setup);

// Lower bound for an integer option of type T (the upper bound is T's largest value, so no valid value is refused).
// CLI::PositiveNumber / NonNegativeNumber report a rejected 0 as "Value 0 not in range 0.000000 to 1797693134862315708
// ...(309 digits)"; this reports "Value 0 not in range 1 to 2147483647" (T = int).
template <class T = int>
CLI::Range at_least(T lo) {
  return CLI::Range(lo, std::numeric_limits<T>::max());
}

}  // namespace kvpack::cli
