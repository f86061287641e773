// Minimal leveled logging to stderr. SIEVE_LOG_LEVEL=debug|info|warn|error (default info).
#pragma once

#include <sstream>
#include <string>

namespace sieve {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

LogLevel log_level();
void set_log_level(LogLevel l);
void log_write(LogLevel l, const std::string& msg);

}  // namespace sieve

#define SIEVE_LOG(level, expr)                                         \
  do {                                                                 \
    if (::sieve::LogLevel::level >= ::sieve::log_level()) {            \
      std::ostringstream sieve_log_os_;                                \
      sieve_log_os_ << expr;                                           \
      ::sieve::log_write(::sieve::LogLevel::level, sieve_log_os_.str()); \
    }                                                                  \
  } while (0)
