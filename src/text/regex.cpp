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

// Oniguruma's \s (what the Rust crate compiles patterns with) is Unicode White_Space. PCRE2's
// \s under UCP (and its \p{Xps}) also takes U+180E, which left White_Space in Unicode 6.3, so
// \s and \S are spelled out as the White_Space list. (\S inside a [...] class is left to PCRE2;
// byte-level patterns do not use it.)
constexpr const char* kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string oniguruma_to_pcre2(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        if (in_class) {
          out += kWhiteSpace;
        } else {
          out += '[';
          out += kWhiteSpace;
          out += ']';
        }
      } else if (n == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpace;
        out += ']';
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      size_t e = p.find(":]", i + 2);  // POSIX class such as [:alpha:]
      if (e != std::string::npos) {
        out.append(p, i, e + 2 - i);
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& source, bool literal, const std::string& what) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string pattern = literal ? source : oniguruma_to_pcre2(source);
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   opts, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(what + ": cannot compile regex /" + source + "/ at offset " + std::to_string(off) +
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
