// Errors a user can cause (bad config, missing tensor, bad request) carry a message that names
// the file, tensor or field and what was expected. `Error` is what every layer throws for them;
// the command line prints `error: <what>` and exits 2, the server answers 4xx.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace sieve {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string what) : std::runtime_error(std::move(what)) {}
};

// Internal invariants: a failed check is a bug in Sieve, not a user mistake.
[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace sieve

#define SIEVE_CHECK(cond, msg)                                                   \
  do {                                                                           \
    if (!(cond)) ::sieve::check_failed(#cond, __FILE__, __LINE__, (msg));        \
  } while (0)
