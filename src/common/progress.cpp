#include "kvpack/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

namespace kvpack {

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 1)), enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() {
  if (!finished_) finish();
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t done, const std::string& extra) {
  done_ = std::min(done, total_);
  extra_ = extra;
  auto now = std::chrono::steady_clock::now();
  if (tty_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish(const std::string& extra) {
  if (finished_) return;
  finished_ = true;
  done_ = total_;
  if (!extra.empty()) extra_ = extra;
  draw(true);
}

void Progress::draw(bool final_line) {
  if (!enabled_) return;
  const double frac = static_cast<double>(done_) / static_cast<double>(total_);
  const double t = elapsed_s();
  const double eta = frac > 0 ? t * (1 - frac) / frac : 0;
  if (!tty_) {
    int decile = static_cast<int>(frac * 10);
    if (!final_line && decile == last_decile_) return;
    last_decile_ = decile;
    fmt::print(stderr, "{}: {:3.0f}% ({}/{}) {:.1f}s {}\n", label_, frac * 100, done_, total_, t, extra_);
    return;
  }
  constexpr int kWidth = 30;
  int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  fmt::print(stderr, "\r{} [{}] {:3.0f}% {}/{} {:.1f}s eta {:.0f}s {}\x1b[K", label_, bar, frac * 100, done_, total_, t,
             eta, extra_);
  if (final_line) fmt::print(stderr, "\n");
}

}  // namespace kvpack
