// In a build without CUDA, `kvpack bench` and `kvpack tune` still exist and say what they need, instead of CLI11's
// "A subcommand is required" for a name it does not know. The CUDA build registers the real commands
// (cmd_bench.cu, cmd_tune.cu) and compiles nothing from this file.
#ifndef KVPACK_HAVE_CUDA
#include <fmt/format.h>

#include <string>

#include "command.h"

namespace {

kvpack::cli::Setup needs_cuda(std::string name) {
  return [name](CLI::App* app) -> kvpack::cli::Runner {
    app->allow_extras();  // whatever options the GPU build takes: the answer is the same
    return [name] {
      fmt::print(stderr,
                 "error: kvpack {} runs on an NVIDIA GPU, and this kvpack was built without CUDA (configure with "
                 "-DKVPACK_CUDA=ON where nvcc is installed, e.g. /usr/local/cuda; docs/PERFORMANCE.md)\n",
                 name);
      return 2;
    };
  };
}

const bool bench_registered = kvpack::cli::register_command(
    "bench", "Decode attention and write-path timings vs fp8 (CUDA builds only)", needs_cuda("bench"));
const bool tune_registered =
    kvpack::cli::register_command("tune", "Build the tuning table for plan() on this GPU (CUDA builds only)",
                                  needs_cuda("tune"));

}  // namespace
#endif
