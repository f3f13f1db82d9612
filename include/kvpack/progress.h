// A small progress bar on stderr for long work (ppl, calibrate, eval). Redraws at most ~10 times a second,
// prints a plain line per 10% when stderr is not a terminal (CI logs), and is silent when disabled.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace kvpack {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  ~Progress();
  void update(int64_t done, const std::string& extra = "");
  void finish(const std::string& extra = "");
  double elapsed_s() const;

 private:
  void draw(bool final_line);
  std::string label_, extra_;
  int64_t total_, done_ = 0;
  bool enabled_, tty_, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace kvpack
