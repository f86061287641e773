#include "text/jinja/string.h"

#include <algorithm>
#include <cctype>

#include "text/jinja/error.h"
#include "text/unicode.h"

namespace sieve::text::jinja {

std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    next_code_point(s, j);
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

size_t str_len(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool py_space(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 ||
         cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws)
    for (size_t i = 0; i < chars->s.size();) set.push_back(next_code_point(chars->s, i));
  auto strip_it = [&](uint32_t cp) {
    return ws ? py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::vector<std::pair<size_t, uint32_t>> cps;
  for (size_t i = 0; i < s.size();) {
    size_t st = i;
    cps.emplace_back(st, next_code_point(s, i));
  }
  size_t a = 0, b = cps.size();
  if (left)
    while (a < b && strip_it(cps[a].second)) ++a;
  if (right)
    while (b > a && strip_it(cps[b - 1].second)) --b;
  if (a == b) return "";
  size_t start = cps[a].first, end = b < cps.size() ? cps[b].first : s.size();
  return s.substr(start, end - start);
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    size_t i = 0;
    auto skip_ws = [&] {
      while (i < s.size()) {
        size_t j = i;
        if (!py_space(next_code_point(s, j))) break;
        i = j;
      }
    };
    skip_ws();
    while (i < s.size()) {
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        out.push_back(py_strip(rest, nullptr, false, true));
        return out;
      }
      size_t st = i;
      while (i < s.size()) {
        size_t j = i;
        if (py_space(next_code_point(s, j))) break;
        i = j;
      }
      out.push_back(s.substr(st, i - st));
      skip_ws();
    }
    return out;
  }
  const std::string& d = sep->s;
  if (d.empty()) fail_here("empty separator");
  size_t st = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    size_t p = s.find(d, st);
    if (p == std::string::npos) break;
    out.push_back(s.substr(st, p - st));
    st = p + d.size();
  }
  out.push_back(s.substr(st));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::string out;
    int64_t n = 0;
    auto cs = chars_of(s);
    for (const auto& c : cs) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += c;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  size_t st = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(from, st);
    if (p == std::string::npos) break;
    out += s.substr(st, p - st) + to;
    st = p + from.size();
    ++n;
  }
  return out + s.substr(st);
}

std::string ascii_upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (auto& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    bool alpha = std::isalpha(u) != 0;
    if (alpha) c = static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
    prev_cased = alpha;
  }
  return out;
}

}  // namespace sieve::text::jinja
