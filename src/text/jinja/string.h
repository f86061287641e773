// Python's str semantics for the renderer: strings are UTF-8 indexed by code point; strip,
// split and replace behave as CPython's; case changes touch ASCII letters only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace sieve::text::jinja {

// Code points of a UTF-8 string (Python indexes strings by code point).
std::vector<std::string> chars_of(const std::string& s);
// len() of a str: its number of code points.
size_t str_len(const std::string& s);
// str.isspace() of one code point.
bool py_space(uint32_t cp);
// str.strip/lstrip/rstrip: `chars` null (or None) strips whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
// str.split(sep, maxsplit): `sep` null (or None) splits on runs of whitespace; maxsplit < 0: all.
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit);
// str.replace(from, to, count); count < 0: all.
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string py_title(const std::string& s);

}  // namespace sieve::text::jinja
