// Runs the kvpack CLI built next to the tests (KVPACK_CLI_PATH) and returns its exit status and output.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kvpack::test {

struct CliResult {
  int rc;
  std::string out;
};

// stdout only unless `merge_stderr`.
inline CliResult run_cli(const std::string& args, bool merge_stderr = false) {
  const std::string cmd =
      std::string("\"") + KVPACK_CLI_PATH + "\" " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace kvpack::test
