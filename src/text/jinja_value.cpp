#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

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

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
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
               const std::string& ksep, bool sort_keys) {
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
      out += json_string(v.s);
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
        json_into(out, (*v.list)[k], indent, level + 1, isep, ksep, sort_keys);
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
        out += json_string(items[k]->first) + ksep;
        json_into(out, items[k]->second, indent, level + 1, isep, ksep, sort_keys);
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
                    const std::string& key_sep, bool sort_keys) {
  std::string out;
  json_into(out, v, indent, 0, item_sep, key_sep, sort_keys);
  return out;
}

}  // namespace sieve::text::jinja
