#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/jinja/error.h"
#include "text/jinja/string.h"
#include "text/unicode.h"

namespace sieve::text::jinja {

const Value* Map::find(const std::string& k) const {
  for (const auto& [key, v] : items)
    if (key == k) return &v;
  return nullptr;
}

void Map::set(const std::string& k, Value v) {
  for (auto& [key, old] : items)
    if (key == k) {
      old = std::move(v);
      return;
    }
  items.emplace_back(k, std::move(v));
}

const Value* CallArgs::kwarg(const std::string& name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

const Value* CallArgs::get(size_t i, const std::string& name) const {
  if (i < pos.size()) return &pos[i];
  return kwarg(name);
}

bool Value::truthy() const {
  switch (type) {
    case kUndefined:
    case kNone:
      return false;
    case kBool:
      return b;
    case kInt:
      return i != 0;
    case kFloat:
      return f != 0;
    case kStr:
      return !s.empty();
    case kList:
      return !list->empty();
    case kMap:
      return !map->items.empty();
    case kFunc:
      return true;
  }
  return false;
}

namespace {

// Python's repr(float): the shortest digits that round-trip, positional when the decimal
// exponent is in [-4, 16), else scientific with at least two exponent digits.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (size_t k = 0; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  if (neg) out.insert(out.begin(), '-');
  return out;
}

std::string str_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

// `ascii`: json.dumps' ensure_ascii (DEL and non-ASCII as \uXXXX escapes, surrogate pairs above
// U+FFFF).
std::string json_string(const std::string& s, bool ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (ascii && c >= 0x7F) {
      size_t j = i;
      uint32_t cp = next_code_point(s, j);
      i = j - 1;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void json_into(std::string& out, const Value& v, int indent, int level, const std::string& isep,
               const std::string& ksep, bool sort_keys, bool ascii) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.type) {
    case Value::kUndefined:
    case Value::kNone:
      out += "null";
      return;
    case Value::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::kInt:
      out += std::to_string(v.i);
      return;
    case Value::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.f);
      return;
    case Value::kStr:
      out += json_string(v.s, ascii);
      return;
    case Value::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += isep;
        newline(level + 1);
        json_into(out, (*v.list)[k], indent, level + 1, isep, ksep, sort_keys, ascii);
      }
      newline(level);
      out += "]";
      return;
    }
    case Value::kMap: {
      if (v.map->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.map->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += isep;
        newline(level + 1);
        out += json_string(items[k]->first, ascii) + ksep;
        json_into(out, items[k]->second, indent, level + 1, isep, ksep, sort_keys, ascii);
      }
      newline(level);
      out += "}";
      return;
    }
    case Value::kFunc:
      out += "null";
      return;
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.type) {
    case Value::kStr:
      return str_repr(v.s);
    case Value::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + to_repr((*v.list)[k]);
      if (v.tuple) return out + (v.list->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::kMap: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.map->items) {
        out += (first ? "" : ", ") + str_repr(k) + ": " + to_repr(x);
        first = false;
      }
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Value::kUndefined:
      return "";
    case Value::kNone:
      return "None";
    case Value::kBool:
      return v.b ? "True" : "False";
    case Value::kInt:
      return std::to_string(v.i);
    case Value::kFloat:
      return float_repr(v.f);
    case Value::kStr:
      return v.s;
    case Value::kList:
    case Value::kMap:
      return to_repr(v);
    case Value::kFunc:
      return "<function>";
  }
  return "";
}

std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, bool ensure_ascii) {
  std::string out;
  json_into(out, v, indent, 0, item_sep, key_sep, sort_keys, ensure_ascii);
  return out;
}

// ---------------------------------------------------------------- Python semantics of values

std::string type_name(const Value& v) {
  switch (v.type) {
    case Value::kUndefined:
      return "undefined";
    case Value::kNone:
      return "NoneType";
    case Value::kBool:
      return "bool";
    case Value::kInt:
      return "int";
    case Value::kFloat:
      return "float";
    case Value::kStr:
      return "str";
    case Value::kList:
      return "list";
    case Value::kMap:
      return "dict";
    case Value::kFunc:
      return "function";
  }
  return "?";
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Value::kFloat && b.type != Value::kFloat) {
      int64_t x = a.type == Value::kBool ? a.b : a.i, y = b.type == Value::kBool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kStr:
      return a.s == b.s;
    case Value::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::kMap:
      if (a.map->items.size() != b.map->items.size()) return false;
      for (const auto& [k, v] : a.map->items) {
        const Value* o = b.map->find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    case Value::kFunc:
      return a.func == b.func;
    default:
      return false;
  }
}

int compare_values(const Value& a, const Value& b, size_t pos) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_str() && b.is_str()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      if (values_equal((*a.list)[k], (*b.list)[k])) continue;
      return compare_values((*a.list)[k], (*b.list)[k], pos);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(pos, "cannot compare " + type_name(a) + " with " + type_name(b));
}

bool contains(const Value& hay, const Value& needle, size_t pos) {
  switch (hay.type) {
    case Value::kStr:
      if (!needle.is_str()) fail(pos, "'in <string>' requires string as left operand");
      return hay.s.find(needle.s) != std::string::npos;
    case Value::kList:
      for (const auto& x : *hay.list)
        if (values_equal(x, needle)) return true;
      return false;
    case Value::kMap:
      return needle.is_str() && hay.map->find(needle.s) != nullptr;
    case Value::kUndefined:
      fail(pos, "'" + hay.s + "' is undefined");
    default:
      fail(pos, "argument of type '" + type_name(hay) + "' is not iterable");
  }
}

List iterate(const Value& v, size_t pos) {
  switch (v.type) {
    case Value::kList:
      return *v.list;
    case Value::kMap: {
      List out;
      for (const auto& kv : v.map->items) out.push_back(Value::string(kv.first));
      return out;
    }
    case Value::kStr: {
      List out;
      for (auto& c : chars_of(v.s)) out.push_back(Value::string(c));
      return out;
    }
    case Value::kUndefined:
      return {};
    default:
      fail(pos, "'" + type_name(v) + "' object is not iterable");
  }
}

int64_t to_int(const Value& v, size_t pos, const char* what) {
  if (v.type == Value::kInt) return v.i;
  if (v.type == Value::kBool) return v.b;
  if (v.type == Value::kFloat) {
    if (!(std::fabs(v.f) < 9.2e18)) fail(pos, std::string(what) + " is out of range");
    return static_cast<int64_t>(v.f);
  }
  fail(pos, std::string(what) + " must be an integer, got " + type_name(v));
}

}  // namespace sieve::text::jinja
