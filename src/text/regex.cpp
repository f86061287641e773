#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace sieve::text {

namespace {
// Per-thread match state: match data and a JIT stack large enough for long whitespace runs
// (lookahead after \s+ backtracks once per character).
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(32, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};
ThreadMatchState& state() {
  thread_local ThreadMatchState s;
  return s;
}
}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& what) {
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   opts, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(what + ": cannot compile regex /" + pattern + "/ at offset " + std::to_string(off) +
                ": " + reinterpret_cast<char*>(msg));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::for_each_match(std::string_view s,
                           const std::function<void(size_t, size_t)>& fn) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& st = state();
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), pos, 0, st.data, st.ctx)
                  : pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(std::string("regex match failed: ") + reinterpret_cast<char*>(msg));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t a = ov[0], b = ov[1];
    if (b > a) {
      fn(a, b);
      pos = b;
    } else {
      // Empty match: step over one character so the scan moves on (as Rust's regex does).
      if (a >= s.size()) return;
      pos = a + 1;
      while (pos < s.size() && (static_cast<uint8_t>(s[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace sieve::text
