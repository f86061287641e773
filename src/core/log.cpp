#include "core/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

#include "core/env.h"

namespace sieve {

namespace {
LogLevel initial_level() {
  const std::string e = env::log_level();
  if (e == "debug") return LogLevel::Debug;
  if (e == "warn") return LogLevel::Warn;
  if (e == "error") return LogLevel::Error;
  return LogLevel::Info;
}
LogLevel g_level = initial_level();
std::mutex g_mu;
}  // namespace

LogLevel log_level() { return g_level; }
void set_log_level(LogLevel l) { g_level = l; }

void log_write(LogLevel l, const std::string& msg) {
  static const char* names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%m-%d %H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "%s %s %s\n", names[int(l)], ts, msg.c_str());
}

}  // namespace sieve
