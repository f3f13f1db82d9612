// Integer options that must be positive (or non-negative) reject bad values with a readable range, before any work
// (CLI::PositiveNumber printed "Value 0 not in range 0.000000 to" a 309-digit number).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cli_run.h"

using kvpack::test::run_cli;

TEST(CliOptions, IntegerBoundsAreReadable) {
  const std::string text = std::string(KVPACK_SOURCE_DIR) + "/README.md";  // --text must exist (checked first)
  const std::string int_max = " to 2147483647", int64_max = " to 9223372036854775807";  // the option's own type
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"eval --model m.gguf --text t.txt --formats q4 --max-positions 0", int64_max},
      {"ruler --model m.gguf --samples 0", int_max},
      {"ppl --model m.gguf --text " + text + " --chunk 0", int_max},
      {"ppl --model m.gguf --text " + text + " --window -1", int_max},
      {"ppl --model m.gguf --text " + text + " --max-tokens -1", int64_max},
      {"generate --model m.gguf --prompt hi --max-new-tokens 0", int_max},
  };
  for (const auto& [args, bound] : cases) {
    const auto r = run_cli(args, true);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_NE(r.out.find(bound), std::string::npos) << args << "\n" << r.out;
    EXPECT_EQ(r.out.find("0.000000"), std::string::npos) << args << "\n" << r.out;
  }
}

TEST(CliOptions, GpuCommandsInACpuBuildSayWhatTheyNeed) {
  if (run_cli("--help").out.find("(CUDA builds only)") == std::string::npos)
    GTEST_SKIP() << "a CUDA build: bench and tune are the real commands";
  for (const std::string cmd : {"bench --formats q4 --batch 8", "tune -o t.json"}) {
    const auto r = run_cli(cmd, true);
    EXPECT_EQ(r.rc, 2) << cmd;
    EXPECT_NE(r.out.find("built without CUDA"), std::string::npos) << cmd << "\n" << r.out;
  }
}
