// Progress of a long job (weights loading, a benchmark, an evaluation): on a terminal a bar
// redrawn in place with the amount, rate and time left; elsewhere (a log file, CI) a plain log
// line every few seconds, so logs stay readable. Thread-safe: any thread may add().
//
//   Progress p({.label = "gsm8k", .total = 1319, .unit = "q"});
//   ... p.add(1); p.set_note("acc 0.52"); ...
//   p.finish();
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace sieve {

enum class ProgressStyle {
  Auto,   // Bar when `out` is a terminal, else Lines
  Bar,    // redrawn in place with \r
  Lines,  // a log line every line_interval_s, and one at the end
  Off,
};

struct ProgressOptions {
  std::string label;          // what is progressing: "weights", "bench", "gsm8k"
  uint64_t total = 0;         // 0: unknown (no percentage, no time left)
  bool bytes = false;         // amounts are bytes: shown as KiB / MiB / GiB, rates per second
  std::string unit = "it";    // the unit of a count when not bytes: "req", "q"
  ProgressStyle style = ProgressStyle::Auto;
  FILE* out = stderr;         // where the bar is drawn
  double redraw_interval_s = 0.2;
  double line_interval_s = 10;
  // Where Lines go; default: the log (SIEVE_LOG at Info).
  std::function<void(const std::string&)> line_sink = nullptr;
  int width = 0;              // bar: columns to fill; 0: the terminal's (80 when unknown)
};

class Progress {
 public:
  explicit Progress(ProgressOptions o);
  ~Progress();  // finish()es
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(uint64_t n) { done_.fetch_add(n, std::memory_order_relaxed); }
  void set(uint64_t done) { done_.store(done, std::memory_order_relaxed); }
  void set_total(uint64_t total) { total_.store(total, std::memory_order_relaxed); }
  // Text after the numbers, e.g. "acc 0.52" or "12 failed".
  void set_note(std::string note);
  uint64_t done() const { return done_.load(std::memory_order_relaxed); }

  // Draws the last state (Bar: and ends the line; Lines: a final line) and stops redrawing.
  void finish();

  ProgressStyle style() const { return style_; }
  // The bar (Bar) or the line (Lines) for `elapsed_s` seconds in, as it would be written now.
  std::string render(double elapsed_s) const;

 private:
  void loop();
  void draw(bool last);

  ProgressOptions o_;
  ProgressStyle style_;
  std::atomic<uint64_t> done_{0}, total_{0};
  mutable std::mutex mu_;
  std::string note_;
  std::condition_variable cv_;
  bool stop_ = false, finished_ = false;
  double t0_ = 0;
  std::thread thread_;
};

// "0 B", "512 B", "1.5 KiB", "12.3 MiB", "1.07 GiB".
std::string format_bytes(double bytes);
// "0:07", "2:05", "1:02:03"; "--:--" for an unknown (negative or infinite) time.
std::string format_duration(double seconds);

}  // namespace sieve
