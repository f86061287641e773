#include "text/jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "text/jinja/error.h"
#include "text/unicode.h"

namespace sieve::text::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstrip_ws(const std::string& s) {
  size_t e = s.size();
  while (e > 0 && is_space(s[e - 1])) --e;
  return s.substr(0, e);
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      size_t k = find_tag(pos);
      std::string text = s_.substr(pos, (k == std::string::npos ? s_.size() : k) - pos);
      if (k == std::string::npos) {
        emit_text(text, pos);
        break;
      }
      char kind = s_[k + 1];  // '{', '%' or '#'
      char sign = k + 2 < s_.size() ? s_[k + 2] : 0;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between the start of the line and the tag.
        size_t l = text.rfind('\n');
        l = l == std::string::npos ? 0 : l + 1;
        if (l > 0 || line_starting) {
          bool ws = l < text.size();
          for (size_t q = l; q < text.size() && ws; ++q) ws = is_space(text[q]);
          if (ws) text.resize(l);
        }
      }
      emit_text(text, pos);
      size_t body = k + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        size_t e = s_.find("#}", body);
        if (e == std::string::npos) fail(k, "unterminated comment");
        pos = after_end(e > 0 ? s_[e - 1] : 0, e + 2, true, line_starting);
        continue;
      }
      if (kind == '%' && is_raw(body)) {
        pos = lex_raw(k, body, line_starting);
        continue;
      }
      toks_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", k});
      pos = lex_tag(body, kind == '{' ? '}' : '%', line_starting);
    }
    toks_.push_back({Tok::kEof, "", s_.size()});
    return std::move(toks_);
  }

 private:
  const std::string& s_;
  std::vector<Token> toks_;

  size_t find_tag(size_t from) const {
    for (size_t p = s_.find('{', from); p != std::string::npos; p = s_.find('{', p + 1))
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) return p;
    return std::string::npos;
  }

  void emit_text(const std::string& t, size_t pos) {
    if (!t.empty()) toks_.push_back({Tok::kText, t, pos});
  }

  // `e` is where the closing delimiter starts (its '-' or '+' is just before), `after` just past
  // it. Applies '-' (strip following whitespace) or trim_blocks (drop one newline).
  size_t after_end(char sign, size_t after, bool block_like, bool& line_starting) {
    if (sign == '-') {
      while (after < s_.size() && is_space(s_[after])) ++after;
    } else if (block_like && sign != '+' && after < s_.size() && s_[after] == '\n') {
      ++after;
    }
    line_starting = after > 0 && s_[after - 1] == '\n';
    return after;
  }

  bool is_raw(size_t p) const {
    while (p < s_.size() && is_space(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && is_space(s_[p])) ++p;
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0 ||
           s_.compare(p, 3, "+%}") == 0;
  }

  size_t lex_raw(size_t k, size_t body, bool& line_starting) {
    size_t e = s_.find("%}", body);
    if (e == std::string::npos) fail(k, "unterminated {% raw %}");
    size_t pos = after_end(s_[e - 1], e + 2, true, line_starting);
    for (size_t p = s_.find("{%", pos); p != std::string::npos; p = s_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = q < s_.size() ? s_[q] : 0;
      if (sign == '-' || sign == '+') ++q;
      while (q < s_.size() && is_space(s_[q])) ++q;
      if (s_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < s_.size() && is_space(s_[q])) ++q;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ++q;
      if (s_.compare(q, 2, "%}") != 0) continue;
      std::string text = s_.substr(pos, p - pos);
      if (sign == '-') text = rstrip_ws(text);
      emit_text(text, pos);
      return after_end(s_[q - 1], q + 2, true, line_starting);
    }
    fail(k, "missing {% endraw %}");
  }

  size_t lex_tag(size_t p, char close, bool& line_starting) {
    const size_t start = p;
    int depth = 0;  // open brackets: "}}" inside a dict literal does not end the tag
    while (true) {
      while (p < s_.size() && is_space(s_[p])) ++p;
      if (p >= s_.size())
        fail(start - 2, std::string("unterminated ") + (close == '}' ? "{{" : "{%"));
      // End delimiter, optionally with '-' (strip what follows) or '+' (keep the newline).
      char sign = 0;
      size_t q = p;
      if ((s_[p] == '-' || (s_[p] == '+' && close == '%')) && p + 2 < s_.size() &&
          s_[p + 1] == close && s_[p + 2] == '}') {
        sign = s_[p];
        q = p + 1;
      }
      if (depth == 0 && s_[q] == close && q + 1 < s_.size() && s_[q + 1] == '}') {
        toks_.push_back({close == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", p});
        return after_end(sign, q + 2, close == '%', line_starting);
      }
      char c = s_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
        toks_.push_back({Tok::kName, s_.substr(p, e - p), p});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
        bool is_float = false;
        if (e + 1 < s_.size() && s_[e] == '.' &&
            std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
        }
        if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
          size_t x = e + 1;
          if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
          if (x < s_.size() && std::isdigit(static_cast<unsigned char>(s_[x]))) {
            is_float = true;
            e = x;
            while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = p; k < e; ++k)
          if (s_[k] != '_') num += s_[k];
        Token t{is_float ? Tok::kFloat : Tok::kInt, num, p};
        if (is_float)
          t.f = std::strtod(num.c_str(), nullptr);  // 1e999 is inf, as in Python
        else
          errno = 0;
        t.i = std::strtoll(num.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(p, "integer literal " + num + " is too large");
        toks_.push_back(t);
        p = e;
      } else if (c == '\'' || c == '"') {
        toks_.push_back({Tok::kString, lex_string(p), p});
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                    "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                    "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        bool found = false;
        for (const char* op : ops) {
          size_t n = std::char_traits<char>::length(op);
          if (s_.compare(p, n, op) == 0) {
            toks_.push_back({Tok::kOp, op, p});
            if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++depth;
            if (n == 1 && (*op == ')' || *op == ']' || *op == '}') && depth > 0) --depth;
            p += n;
            found = true;
            break;
          }
        }
        if (!found) fail(p, std::string("unexpected character '") + c + "'");
      }
    }
  }

  // Python string-literal escapes, as Jinja2 decodes its string tokens.
  std::string lex_string(size_t& p) {
    char q = s_[p];
    size_t start = p++;
    std::string out;
    while (true) {
      if (p >= s_.size()) fail(start, "unterminated string");
      char c = s_[p++];
      if (c == q) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p >= s_.size()) fail(start, "unterminated string");
      char e = s_[p++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '0':
          out += '\0';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + n > s_.size()) fail(p, "bad escape in string");
          uint32_t cp = 0;
          for (size_t d = 0; d < n; ++d) {
            char h = s_[p + d];
            int v = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                    : (h >= 'a' && h <= 'f')                    ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F')                    ? h - 'A' + 10
                                                                : -1;
            if (v < 0) fail(p - 2, "bad \\" + std::string(1, e) + " escape in string");
            cp = cp * 16 + static_cast<uint32_t>(v);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            fail(p - 2, "escape names no Unicode scalar value");
          p += n;
          append_utf8(out, cp);
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
  }
};

}  // namespace

std::vector<Token> lex(const std::string& src) {
  return Lexer(src).run();
}

}  // namespace sieve::text::jinja
