// Errors of the Jinja renderer: every stage throws TemplateError with a byte offset into the
// template source; the public entry points turn it into sieve::Error with line and column.
#pragma once

#include <string>
#include <utility>

#include "core/error.h"

namespace sieve::text::jinja {

struct TemplateError {
  size_t pos;
  std::string msg;
};

[[noreturn]] inline void fail(size_t pos, std::string msg) {
  throw TemplateError{pos, std::move(msg)};
}

// For builtins that do not know where they were called: the caller fills in the position.
constexpr size_t kHere = std::string::npos;
[[noreturn]] inline void fail_here(std::string msg) {
  throw TemplateError{kHere, std::move(msg)};
}

// raise_exception(msg) from a template; the call site adds its position.
struct RaiseException {
  std::string msg;
};

// Line and column (1-based, columns in code points) of byte offset `pos` in `src`.
inline std::pair<int, int> line_col(const std::string& src, size_t pos) {
  int line = 1, col = 1;
  for (size_t k = 0; k < pos && k < src.size(); ++k) {
    if (src[k] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(src[k]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return {line, col};
}

// `stage`: "syntax error" or "error".
[[noreturn]] inline void rethrow(const std::string& src, const TemplateError& e,
                                 const char* stage) {
  auto [line, col] = line_col(src, e.pos);
  throw Error(std::string("chat template ") + stage + " at line " + std::to_string(line) +
              ", column " + std::to_string(col) + ": " + e.msg);
}

}  // namespace sieve::text::jinja
