// The environment variables Sieve reads, all in one table (docs/serving.md lists them). Nothing
// else in src/ calls getenv: development switches of the kernels are fields of
// kernels/cuda/tuning.h, set by the tests and `sieve bench kernels --tune`.
#pragma once

#include <optional>
#include <string>

namespace sieve::env {

struct Variable {
  const char* name;
  const char* alias;          // read when `name` is unset or empty (vLLM's spelling), or nullptr
  const char* default_value;  // what an unset variable means, for the docs
  const char* help;
};

// Every variable, in the order docs/serving.md lists them.
inline constexpr Variable kVariables[] = {
    {"SIEVE_LOG_LEVEL", nullptr, "info", "log level: debug, info, warn or error"},
    {"SIEVE_LOG_STATS_INTERVAL", "VLLM_LOG_STATS_INTERVAL", "10",
     "seconds between the server's periodic stats lines (a positive number)"},
    {"SIEVE_API_KEY", "VLLM_API_KEY", "", "API key of `sieve serve` when --api-key is not given"},
    {"XDG_CACHE_HOME", nullptr, "$HOME/.cache",
     "where `sieve serve` keeps a generated tiny model when none is bundled (under sieve/)"},
};

// The value of a variable of the table (or its alias); nullopt when both are unset or empty.
// Throws Error for a name that is not in the table.
std::optional<std::string> get(const char* name);

// SIEVE_LOG_LEVEL, "info" when unset.
std::string log_level();
// SIEVE_LOG_STATS_INTERVAL (or VLLM_LOG_STATS_INTERVAL) in seconds, 10 when unset; throws Error
// naming the variable when it is not a positive number.
double log_stats_interval_s();
// SIEVE_API_KEY (or VLLM_API_KEY), empty when unset.
std::string api_key();
// The user's cache directory: $XDG_CACHE_HOME, else $HOME/.cache, else /tmp/.cache.
std::string user_cache_dir();

}  // namespace sieve::env
