#include "core/env.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace sieve::env {

namespace {
const char* raw(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
}  // namespace

std::optional<std::string> get(const char* name) {
  for (const Variable& v : kVariables) {
    if (std::strcmp(v.name, name) != 0) continue;
    if (const char* x = raw(v.name)) return std::string(x);
    if (v.alias)
      if (const char* x = raw(v.alias)) return std::string(x);
    return std::nullopt;
  }
  throw Error(std::string("env: ") + name + " is not in the table of core/env.h");
}

std::string log_level() { return get("SIEVE_LOG_LEVEL").value_or("info"); }

double log_stats_interval_s() {
  for (const char* name : {"SIEVE_LOG_STATS_INTERVAL", "VLLM_LOG_STATS_INTERVAL"})
    if (const char* v = raw(name)) {
      char* end = nullptr;
      const double x = std::strtod(v, &end);
      if (end && *end == '\0' && x > 0) return x;
      throw Error(std::string(name) + " must be a positive number of seconds, got \"" + v + "\"");
    }
  return 10.0;
}

std::string api_key() { return get("SIEVE_API_KEY").value_or(""); }

std::string user_cache_dir() {
  if (auto x = get("XDG_CACHE_HOME")) return *x;
  const char* home = std::getenv("HOME");
  const std::string h = home ? home : "/tmp";
  return h.empty() ? ".cache" : h + "/.cache";
}

}  // namespace sieve::env
