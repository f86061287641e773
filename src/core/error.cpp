#include "core/error.h"

namespace sieve {

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error("internal error: " + msg + " (" + cond + " at " + file + ":" + std::to_string(line) +
              ")");
}

}  // namespace sieve
