#include "core/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/log.h"

namespace sieve {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

int terminal_columns(FILE* f) {
  winsize ws{};
  if (f && ::ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

}  // namespace

std::string format_bytes(double b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  if (u == 0) return fixed(b, 0) + " B";
  return fixed(b, b >= 100 ? 0 : b >= 10 ? 1 : 2) + " " + units[u];
}

std::string format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s) || s > 360000) return "--:--";
  const long long t = std::llround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

Progress::Progress(ProgressOptions o) : o_(std::move(o)), style_(o_.style) {
  total_ = o_.total;
  if (style_ == ProgressStyle::Auto)
    style_ = o_.out && ::isatty(fileno(o_.out)) ? ProgressStyle::Bar : ProgressStyle::Lines;
  if (!o_.line_sink) o_.line_sink = [](const std::string& line) { log_write(LogLevel::Info, line); };
  t0_ = now_s();
  if (style_ != ProgressStyle::Off) thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() {
  finish();
}

void Progress::set_note(std::string note) {
  std::lock_guard lk(mu_);
  note_ = std::move(note);
}

std::string Progress::render(double elapsed) const {
  const uint64_t done = done_.load(std::memory_order_relaxed);
  const uint64_t total = total_.load(std::memory_order_relaxed);
  const double rate = elapsed > 0 ? double(done) / elapsed : 0;
  auto amount = [&](uint64_t v) { return o_.bytes ? format_bytes(double(v)) : std::to_string(v); };
  std::string count = amount(done);
  if (total) count += "/" + amount(total);
  if (!o_.bytes) count += " " + o_.unit;
  const std::string speed = o_.bytes ? format_bytes(rate) + "/s"
                                     : fixed(rate, rate >= 100 ? 0 : rate >= 10 ? 1 : 2) + " " + o_.unit + "/s";
  const double left = total && rate > 0 && done <= total ? double(total - done) / rate : -1;
  std::string note;
  {
    std::lock_guard lk(mu_);
    note = note_;
  }
  const double frac = total ? std::min(1.0, double(done) / double(total)) : 0;
  const std::string pct = total ? fixed(100 * frac, 0) + "%" : "";
  if (style_ == ProgressStyle::Lines) {
    std::string line = o_.label + ": " + count;
    if (total) line += " (" + pct + ")";
    line += ", " + speed + ", " + format_duration(elapsed) + " elapsed";
    if (total && done < total) line += ", " + format_duration(left) + " left";
    if (!note.empty()) line += ", " + note;
    return line;
  }
  // label  45% [#########...........]  90/200 q  7.31 q/s  0:12<0:15  acc 0.52
  const std::string tail = "  " + count + "  " + speed + "  " + format_duration(elapsed) +
                           (total ? "<" + format_duration(left) : "") + (note.empty() ? "" : "  " + note);
  std::string head = o_.label + (total ? "  " + pct : "");
  const int columns = o_.width > 0 ? o_.width : terminal_columns(o_.out);
  const int bar = std::clamp(columns - 1 - int(head.size()) - int(tail.size()) - 3, 0, 40);
  if (total && bar >= 8) {
    const int fill = int(std::floor(frac * bar));
    head += " [" + std::string(size_t(fill), '#') + std::string(size_t(bar - fill), '.') + "]";
  }
  std::string s = head + tail;
  if (int(s.size()) > columns - 1) s.resize(size_t(std::max(columns - 1, 0)));
  return s;
}

void Progress::draw(bool last) {
  const double elapsed = now_s() - t0_;
  if (style_ == ProgressStyle::Bar) {
    const std::string s = render(elapsed);
    // \r, the line, then clear what a longer earlier line left.
    std::fprintf(o_.out, "\r%s\033[K%s", s.c_str(), last ? "\n" : "");
    std::fflush(o_.out);
  } else if (style_ == ProgressStyle::Lines) {
    o_.line_sink(render(elapsed));
  }
}

void Progress::loop() {
  const double interval = style_ == ProgressStyle::Bar ? o_.redraw_interval_s : o_.line_interval_s;
  std::unique_lock lk(mu_);
  uint64_t last_done = 0;  // no line before the first move, however late the caller's first add
  while (!cv_.wait_for(lk, std::chrono::duration<double>(interval), [this] { return stop_; })) {
    // A log line only when something moved since the last one; the bar keeps its clock running.
    const uint64_t d = done();
    if (style_ == ProgressStyle::Lines && d == last_done) continue;
    last_done = d;
    lk.unlock();
    draw(false);
    lk.lock();
  }
}

void Progress::finish() {
  {
    std::lock_guard lk(mu_);
    if (finished_) return;
    finished_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (style_ != ProgressStyle::Off) draw(true);
}

}  // namespace sieve
