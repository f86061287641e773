#include "text/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>

#include "text/jinja/error.h"
#include "text/jinja/string.h"

namespace sieve::text::jinja {

namespace {
// Python methods of str, dict and list that templates call, bound to `obj`.
Value method_or_undefined(const Value& obj, const std::string& name);
}  // namespace

Value get_item(const Value& obj, const Value& idx, size_t pos) {
  switch (obj.type) {
    case Value::kUndefined:
      fail(pos, "'" + obj.s + "' is undefined");
    case Value::kMap: {
      if (idx.is_str()) {
        if (const Value* v = obj.map->find(idx.s)) return *v;
        return method_or_undefined(obj, idx.s);
      }
      return Value::undefined();
    }
    case Value::kList:
    case Value::kStr: {
      if (!idx.is_number()) {
        if (idx.is_str()) return method_or_undefined(obj, idx.s);
        return Value::undefined();
      }
      int64_t k = to_int(idx, pos, "index");
      if (obj.is_list()) {
        int64_t n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined("[" + std::to_string(k) + "]");
        return (*obj.list)[k];
      }
      auto cs = chars_of(obj.s);
      int64_t n = static_cast<int64_t>(cs.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined();
      return Value::string(cs[k]);
    }
    default:
      return Value::undefined();
  }
}

Value get_attr(const Value& obj, const std::string& name, size_t pos) {
  if (obj.is_undefined()) fail(pos, "'" + obj.s + "' is undefined");
  // Jinja2 tries the Python attribute first (so dict.items is the method), then the item.
  Value m = method_or_undefined(obj, name);
  if (!m.is_undefined()) return m;
  if (obj.is_map()) {
    if (const Value* v = obj.map->find(name)) return *v;
  }
  return Value::undefined(name);
}

namespace {

Value method_or_undefined(const Value& obj, const std::string& name) {
  static const char* str_methods[] = {
      "startswith", "endswith", "split",      "rsplit",  "strip",      "lstrip",  "rstrip",
      "replace",    "upper",    "lower",      "title",   "capitalize", "find",    "rfind",
      "count",      "join",     "format",     "isdigit", "isalpha",    "isspace", "isalnum",
      "islower",    "isupper",  "splitlines", "index"};
  static const char* map_methods[] = {"items", "keys", "values", "get"};
  static const char* list_methods[] = {"index", "count"};
  auto has = [&](auto& arr) {
    for (const char* m : arr)
      if (name == m) return true;
    return false;
  };
  if ((obj.is_str() && has(str_methods)) ||
      (obj.is_map() && !obj.map->is_namespace && has(map_methods)) ||
      (obj.is_list() && has(list_methods))) {
    Value bound = obj;
    return Value::function(
        [bound, name](const CallArgs& a) { return call_method(bound, name, a, kHere); });
  }
  return Value::undefined(name);
}

}  // namespace

Value call_method(const Value& obj, const std::string& name, const CallArgs& a, size_t pos) {
  auto arg_str = [&](size_t i, const char* kw) -> const Value* {
    const Value* v = a.get(i, kw);
    if (v && !v->is_str() && !v->is_none())
      fail(pos, name + "() argument must be str, not " + type_name(*v));
    return v;
  };
  if (obj.is_str()) {
    const std::string& s = obj.s;
    if (name == "startswith" || name == "endswith") {
      const Value* p = a.get(0, "prefix");
      if (!p) fail(pos, name + "() takes at least 1 argument");
      List opts = p->is_list() ? *p->list : List{*p};
      for (const auto& o : opts) {
        if (!o.is_str()) fail(pos, name + "() argument must be str or a tuple of str");
        bool hit = name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                        : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(),
                                                                              o.s.size(), o.s) == 0;
        if (hit) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "split" || name == "rsplit") {
      const Value* sep = arg_str(0, "sep");
      const Value* ms = a.get(1, "maxsplit");
      int64_t maxsplit = ms ? to_int(*ms, pos, "maxsplit") : -1;
      if (name == "rsplit" && maxsplit >= 0) {
        // rsplit with a limit: split fully, then join the leading parts back.
        auto parts = py_split(s, sep, -1);
        if (static_cast<int64_t>(parts.size()) > maxsplit + 1 && sep && sep->is_str()) {
          size_t keep = parts.size() - maxsplit;
          std::string head;
          for (size_t k = 0; k < keep; ++k) head += (k ? sep->s : "") + parts[k];
          std::vector<std::string> r{head};
          r.insert(r.end(), parts.begin() + keep, parts.end());
          parts = r;
        }
        List out;
        for (auto& p : parts) out.push_back(Value::string(p));
        return Value::make_list(out);
      }
      List out;
      for (auto& p : py_split(s, sep, maxsplit)) out.push_back(Value::string(p));
      return Value::make_list(out);
    }
    if (name == "splitlines") {
      List out;
      size_t st = 0;
      for (size_t k = 0; k < s.size(); ++k)
        if (s[k] == '\n' || s[k] == '\r') {
          out.push_back(Value::string(s.substr(st, k - st)));
          if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          st = k + 1;
        }
      if (st < s.size()) out.push_back(Value::string(s.substr(st)));
      return Value::make_list(out);
    }
    if (name == "strip") return Value::string(py_strip(s, arg_str(0, "chars"), true, true));
    if (name == "lstrip") return Value::string(py_strip(s, arg_str(0, "chars"), true, false));
    if (name == "rstrip") return Value::string(py_strip(s, arg_str(0, "chars"), false, true));
    if (name == "replace") {
      const Value* from = a.get(0, "old");
      const Value* to = a.get(1, "new");
      if (!from || !to || !from->is_str() || !to->is_str())
        fail(pos, "replace() takes two string arguments");
      const Value* c = a.get(2, "count");
      return Value::string(py_replace(s, from->s, to->s, c ? to_int(*c, pos, "count") : -1));
    }
    if (name == "upper") return Value::string(ascii_upper(s));
    if (name == "lower") return Value::string(ascii_lower(s));
    if (name == "title") return Value::string(py_title(s));
    if (name == "capitalize") {
      std::string r = ascii_lower(s);
      if (!r.empty()) r[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(r[0])));
      return Value::string(r);
    }
    if (name == "find" || name == "rfind" || name == "index") {
      const Value* sub = arg_str(0, "sub");
      if (!sub || !sub->is_str()) fail(pos, name + "() takes a string");
      size_t p = name == "rfind" ? s.rfind(sub->s) : s.find(sub->s);
      if (p == std::string::npos) {
        if (name == "index") fail(pos, "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(str_len(s.substr(0, p))));
    }
    if (name == "count") {
      const Value* sub = arg_str(0, "sub");
      if (!sub || !sub->is_str()) fail(pos, "count() takes a string");
      if (sub->s.empty()) return Value::integer(static_cast<int64_t>(str_len(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub->s); p != std::string::npos; p = s.find(sub->s, p + sub->s.size()))
        ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value* it = a.get(0, "iterable");
      if (!it) fail(pos, "join() takes one argument");
      std::string r;
      bool first = true;
      for (const auto& x : iterate(*it, pos)) {
        if (!x.is_str())
          fail(pos, "sequence item: expected str instance, " + type_name(x) + " found");
        r += (first ? "" : s) + x.s;
        first = false;
      }
      return Value::string(r);
    }
    if (name == "format") {
      // Positional {} and {0} only: enough for the templates that use it.
      std::string r;
      size_t auto_idx = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '{' && k + 1 < s.size() && s[k + 1] == '{') {
          r += '{';
          ++k;
        } else if (s[k] == '}' && k + 1 < s.size() && s[k + 1] == '}') {
          r += '}';
          ++k;
        } else if (s[k] == '{') {
          size_t e = s.find('}', k);
          if (e == std::string::npos) fail(pos, "format(): unmatched '{'");
          std::string field = s.substr(k + 1, e - k - 1);
          const Value* v = nullptr;
          if (field.empty())
            v = a.get(auto_idx++, "");
          else if (std::isdigit(static_cast<unsigned char>(field[0])))
            v = field.size() < 6 && std::all_of(field.begin(), field.end(), ::isdigit)
                    ? a.get(std::stoul(field), "")
                    : nullptr;
          else
            v = a.kwarg(field);
          if (!v) fail(pos, "format(): no value for {" + field + "}");
          r += to_str(*v);
          k = e;
        } else {
          r += s[k];
        }
      }
      return Value::string(r);
    }
    auto all_of = [&](auto pred) {
      if (s.empty()) return Value::boolean(false);
      for (unsigned char c : s)
        if (!pred(c)) return Value::boolean(false);
      return Value::boolean(true);
    };
    if (name == "isdigit") return all_of([](unsigned char c) { return std::isdigit(c) != 0; });
    if (name == "isalpha")
      return all_of([](unsigned char c) { return std::isalpha(c) != 0 || c >= 0x80; });
    if (name == "isalnum")
      return all_of([](unsigned char c) { return std::isalnum(c) != 0 || c >= 0x80; });
    if (name == "isspace") return all_of([](unsigned char c) { return std::isspace(c) != 0; });
    if (name == "islower") return Value::boolean(ascii_lower(s) == s && ascii_upper(s) != s);
    if (name == "isupper") return Value::boolean(ascii_upper(s) == s && ascii_lower(s) != s);
  }
  if (obj.is_map()) {
    const Map& m = *obj.map;
    if (name == "items") {
      List out;
      for (const auto& [k, v] : m.items) out.push_back(Value::make_tuple({Value::string(k), v}));
      return Value::make_list(out);
    }
    if (name == "keys") {
      List out;
      for (const auto& kv : m.items) out.push_back(Value::string(kv.first));
      return Value::make_list(out);
    }
    if (name == "values") {
      List out;
      for (const auto& kv : m.items) out.push_back(kv.second);
      return Value::make_list(out);
    }
    if (name == "get") {
      const Value* k = a.get(0, "key");
      if (!k) fail(pos, "get() takes at least 1 argument");
      if (k->is_str())
        if (const Value* v = m.find(k->s)) return *v;
      const Value* d = a.get(1, "default");
      return d ? *d : Value::none();
    }
  }
  if (obj.is_list()) {
    const Value* x = a.get(0, "value");
    if (!x) fail(pos, name + "() takes one argument");
    int64_t n = 0, k = 0;
    for (const auto& v : *obj.list) {
      if (values_equal(v, *x)) {
        if (name == "index") return Value::integer(k);
        ++n;
      }
      ++k;
    }
    if (name == "index") fail(pos, "value is not in list");
    return Value::integer(n);
  }
  fail(pos, "'" + type_name(obj) + "' object has no attribute '" + name + "'");
}

namespace {

// A dotted attribute path ("a.b.0") of `v`, as filters' attribute= arguments read it.
Value attr_of(const Value& v, const std::string& path, size_t pos) {
  Value cur = v;
  size_t st = 0;
  while (true) {
    size_t d = path.find('.', st);
    std::string part = path.substr(st, d == std::string::npos ? std::string::npos : d - st);
    if (cur.is_undefined()) return cur;
    if (!part.empty() && std::isdigit(static_cast<unsigned char>(part[0])))
      cur = part.size() < 12 && std::all_of(part.begin(), part.end(), ::isdigit)
                ? get_item(cur, Value::integer(std::stoll(part)), pos)
                : Value::undefined(part);
    else
      cur = cur.is_map() ? (cur.map->find(part) ? *cur.map->find(part) : Value::undefined(part))
                         : get_attr(cur, part, pos);
    if (d == std::string::npos) return cur;
    st = d + 1;
  }
}

}  // namespace

Value filter(const std::string& name, const Value& v, const CallArgs& a, size_t pos) {
  if (name == "safe") return v;  // no autoescaping, so nothing to mark
  if (name == "trim") {
    if (!v.is_str()) return Value::string(py_strip(to_str(v), a.get(0, "chars"), true, true));
    return Value::string(py_strip(v.s, a.get(0, "chars"), true, true));
  }
  if (name == "tojson") {
    // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None,
    // sort_keys=False).
    const Value* ascii = a.get(0, "ensure_ascii");
    const Value* ind = a.get(1, "indent");
    int indent = ind && !ind->is_none() ? static_cast<int>(to_int(*ind, pos, "indent")) : -1;
    std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
    if (const Value* sp = a.get(2, "separators")) {
      if (sp->is_list() && sp->list->size() == 2) {
        isep = (*sp->list)[0].s;
        ksep = (*sp->list)[1].s;
      }
    }
    const Value* sk = a.get(3, "sort_keys");
    return Value::string(
        to_json(v, indent, isep, ksep, sk && sk->truthy(), ascii && ascii->truthy()));
  }
  if (name == "length" || name == "count") {
    switch (v.type) {
      case Value::kStr:
        return Value::integer(static_cast<int64_t>(str_len(v.s)));
      case Value::kList:
        return Value::integer(static_cast<int64_t>(v.list->size()));
      case Value::kMap:
        return Value::integer(static_cast<int64_t>(v.map->items.size()));
      case Value::kUndefined:
        return Value::integer(0);
      default:
        fail(pos, "object of type '" + type_name(v) + "' has no len()");
    }
  }
  if (name == "default" || name == "d") {
    const Value* def = a.get(0, "default_value");
    const Value* boolean = a.get(1, "boolean");
    bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    if (use) return def ? *def : Value::string("");
    return v;
  }
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string r;
    bool first = true;
    for (const auto& x : iterate(v, pos)) {
      Value item = attr ? attr_of(x, to_str(*attr), pos) : x;
      r += (first ? "" : (sep ? to_str(*sep) : "")) + to_str(item);
      first = false;
    }
    return Value::string(r);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (!v.is_map()) fail(pos, "items filter expects a mapping, got " + type_name(v));
    return call_method(v, "items", {}, pos);
  }
  if (name == "dictsort") {
    if (!v.is_map()) fail(pos, "dictsort expects a mapping");
    auto items = v.map->items;
    std::stable_sort(items.begin(), items.end(),
                     [](auto& x, auto& y) { return ascii_lower(x.first) < ascii_lower(y.first); });
    List out;
    for (auto& [k, x] : items) out.push_back(Value::make_tuple({Value::string(k), x}));
    return Value::make_list(out);
  }
  if (name == "string") return Value::string(to_str(v));
  if (name == "lower") return Value::string(ascii_lower(to_str(v)));
  if (name == "upper") return Value::string(ascii_upper(to_str(v)));
  if (name == "title") return Value::string(py_title(to_str(v)));
  if (name == "capitalize") return call_method(Value::string(to_str(v)), "capitalize", {}, pos);
  if (name == "replace") {
    const Value* from = a.get(0, "old");
    const Value* to = a.get(1, "new");
    if (!from || !to) fail(pos, "replace needs two arguments");
    const Value* c = a.get(2, "count");
    return Value::string(
        py_replace(to_str(v), to_str(*from), to_str(*to), c ? to_int(*c, pos, "count") : -1));
  }
  if (name == "first" || name == "last") {
    List items = iterate(v, pos);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(v, pos));
  if (name == "reverse") {
    if (v.is_str()) {
      auto cs = chars_of(v.s);
      std::string r;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) r += *it;
      return Value::string(r);
    }
    List items = iterate(v, pos);
    std::reverse(items.begin(), items.end());
    return Value::make_list(items);
  }
  if (name == "unique") {
    List out;
    for (const auto& x : iterate(v, pos)) {
      bool seen = false;
      for (const auto& y : out) seen = seen || values_equal(x, y);
      if (!seen) out.push_back(x);
    }
    return Value::make_list(out);
  }
  if (name == "sort") {
    const Value* rev = a.get(0, "reverse");
    const Value* attr = a.get(2, "attribute");
    List items = iterate(v, pos);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      Value kx = attr ? attr_of(x, to_str(*attr), pos) : x;
      Value ky = attr ? attr_of(y, to_str(*attr), pos) : y;
      if (kx.is_str() && ky.is_str()) {
        kx.s = ascii_lower(kx.s);
        ky.s = ascii_lower(ky.s);
      }
      return compare_values(kx, ky, pos) < 0;
    });
    if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
    return Value::make_list(items);
  }
  if (name == "map") {
    List out;
    const Value* attr = a.kwarg("attribute");
    for (const auto& x : iterate(v, pos)) {
      if (attr) {
        Value r = attr_of(x, to_str(*attr), pos);
        if (r.is_undefined())
          if (const Value* d = a.kwarg("default")) r = *d;
        out.push_back(r);
      } else {
        if (a.pos.empty()) fail(pos, "map needs a filter name or attribute=");
        CallArgs rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(filter(to_str(a.pos[0]), x, rest, pos));
      }
    }
    return Value::make_list(out);
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool keep_if = name == "select" || name == "selectattr";
    size_t k0 = by_attr ? 1 : 0;
    if (by_attr && a.pos.empty()) fail(pos, name + " needs an attribute name");
    List out;
    for (const auto& x : iterate(v, pos)) {
      Value item = by_attr ? attr_of(x, to_str(a.pos[0]), pos) : x;
      bool r;
      if (a.pos.size() > k0) {
        std::vector<Value> targs(a.pos.begin() + k0 + 1, a.pos.end());
        r = test(to_str(a.pos[k0]), item, targs, pos);
      } else {
        r = item.truthy();
      }
      if (r == keep_if) out.push_back(x);
    }
    return Value::make_list(out);
  }
  if (name == "abs") {
    if (v.type == Value::kFloat) return Value::number(std::fabs(v.f));
    int64_t x = to_int(v, pos, "abs");
    if (x == INT64_MIN) fail(pos, "integer overflow");
    return Value::integer(x < 0 ? -x : x);
  }
  if (name == "int") {
    if (v.is_str()) {
      try {
        size_t used = 0;
        std::string t = py_strip(v.s, nullptr, true, true);
        long long x = std::stoll(t, &used);
        if (used == t.size()) return Value::integer(x);
        double d = std::stod(t);
        if (!(std::fabs(d) < 9.2e18)) throw std::out_of_range(t);
        return Value::integer(static_cast<int64_t>(d));
      } catch (...) {
        const Value* d = a.get(0, "default");
        return d ? *d : Value::integer(0);
      }
    }
    if (v.is_number()) return Value::integer(to_int(v, pos, "int"));
    const Value* d = a.get(0, "default");
    return d ? *d : Value::integer(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_str()) {
      try {
        return Value::number(std::stod(v.s));
      } catch (...) {
      }
    }
    const Value* d = a.get(0, "default");
    return d ? *d : Value::number(0);
  }
  if (name == "round") {
    const Value* p = a.get(0, "precision");
    int64_t prec = p ? to_int(*p, pos, "precision") : 0;
    double m = std::pow(10.0, static_cast<double>(prec));
    return Value::number(std::nearbyint(v.as_double() * m) / m);
  }
  if (name == "sum") {
    const Value* attr = a.get(0, "attribute");
    const Value* start = a.get(1, "start");
    Value acc = start ? *start : Value::integer(0);
    for (const auto& x : iterate(v, pos)) {
      Value item = attr ? attr_of(x, to_str(*attr), pos) : x;
      if (acc.type == Value::kFloat || item.type == Value::kFloat)
        acc = Value::number(acc.as_double() + item.as_double());
      else
        acc = Value::integer(to_int(acc, pos, "sum") + to_int(item, pos, "sum"));
    }
    return acc;
  }
  if (name == "min" || name == "max") {
    List items = iterate(v, pos);
    if (items.empty()) return Value::undefined(name);
    Value best = items[0];
    for (const auto& x : items) {
      int c = compare_values(x, best, pos);
      if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = x;
    }
    return best;
  }
  if (name == "indent") {
    const Value* w = a.get(0, "width");
    const Value* first = a.get(1, "first");
    const Value* blank = a.get(2, "blank");
    std::string pad = w && w->is_str() ? w->s : std::string(w ? to_int(*w, pos, "width") : 4, ' ');
    std::string s = to_str(v), out;
    std::vector<std::string> ls;
    size_t st = 0;
    for (size_t k = 0; k <= s.size(); ++k)
      if (k == s.size() || s[k] == '\n') {
        ls.push_back(s.substr(st, k - st));
        st = k + 1;
      }
    for (size_t k = 0; k < ls.size(); ++k) {
      if (k) out += "\n";
      bool do_pad =
          (k > 0 || (first && first->truthy())) && (!ls[k].empty() || (blank && blank->truthy()));
      out += (do_pad ? pad : "") + ls[k];
    }
    return Value::string(out);
  }
  if (name == "wordcount")
    return Value::integer(static_cast<int64_t>(py_split(to_str(v), nullptr, -1).size()));
  if (name == "e" || name == "escape" || name == "forceescape") {
    std::string r;
    for (char c : to_str(v)) {
      switch (c) {
        case '&':
          r += "&amp;";
          break;
        case '<':
          r += "&lt;";
          break;
        case '>':
          r += "&gt;";
          break;
        case '"':
          r += "&#34;";
          break;
        case '\'':
          r += "&#39;";
          break;
        default:
          r += c;
      }
    }
    return Value::string(r);
  }
  if (name == "attr") {
    const Value* n = a.get(0, "name");
    if (!n) fail(pos, "attr needs a name");
    return get_attr(v, to_str(*n), pos);
  }
  if (name == "batch" || name == "slice" || name == "groupby")
    fail(pos, "filter '" + name + "' is not supported");
  fail(pos, "unknown filter '" + name + "'");
}
bool test(const std::string& name, const Value& v, const std::vector<Value>& args, size_t pos) {
  auto arg = [&](size_t k) -> const Value& {
    if (k >= args.size()) fail(pos, "test '" + name + "' needs an argument");
    return args[k];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_str();
  if (name == "mapping") return v.is_map();
  if (name == "boolean") return v.type == Value::kBool;
  if (name == "true") return v.type == Value::kBool && v.b;
  if (name == "false") return v.type == Value::kBool && !v.b;
  if (name == "integer") return v.type == Value::kInt;
  if (name == "float") return v.type == Value::kFloat;
  if (name == "number") return v.is_number();
  if (name == "iterable") return v.is_list() || v.is_map() || v.is_str();
  if (name == "sequence") return v.is_list() || v.is_map() || v.is_str();
  if (name == "callable") return v.type == Value::kFunc;
  if (name == "odd") return to_int(v, pos, "value") % 2 != 0;
  if (name == "even") return to_int(v, pos, "value") % 2 == 0;
  if (name == "divisibleby") return to_int(v, pos, "value") % to_int(arg(0), pos, "divisor") == 0;
  if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg(0));
  if (name == "ne" || name == "!=") return !values_equal(v, arg(0));
  if (name == "lt" || name == "lessthan") return compare_values(v, arg(0), pos) < 0;
  if (name == "le") return compare_values(v, arg(0), pos) <= 0;
  if (name == "gt" || name == "greaterthan") return compare_values(v, arg(0), pos) > 0;
  if (name == "ge") return compare_values(v, arg(0), pos) >= 0;
  if (name == "in") return contains(arg(0), v, pos);
  if (name == "sameas") return values_equal(v, arg(0)) && v.type == arg(0).type;
  if (name == "lower") return v.is_str() && ascii_lower(v.s) == v.s;
  if (name == "upper") return v.is_str() && ascii_upper(v.s) == v.s;
  fail(pos, "unknown test '" + name + "'");
}
void add_globals(std::unordered_map<std::string, Value>& vars) {
  vars["raise_exception"] = Value::function([](const CallArgs& a) -> Value {
    throw RaiseException{a.pos.empty() ? "" : to_str(a.pos[0])};
  });
  vars["range"] = Value::function([](const CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    auto num = [&](size_t k) {
      if (a.pos[k].type == Value::kInt) return a.pos[k].i;
      if (a.pos[k].type == Value::kBool) return static_cast<int64_t>(a.pos[k].b);
      fail_here("range() arguments must be integers");
    };
    if (a.pos.size() == 1)
      stop = num(0);
    else if (a.pos.size() >= 2) {
      start = num(0);
      stop = num(1);
      if (a.pos.size() >= 3) step = num(2);
    }
    if (step == 0) fail_here("range() step must not be zero");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      out.push_back(Value::integer(k));
      if (out.size() > 1000000) fail_here("range() too large");
    }
    return Value::make_list(out);
  });
  vars["namespace"] = Value::function([](const CallArgs& a) {
    Value ns = Value::make_map();
    ns.map->is_namespace = true;
    for (const auto& p : a.pos)
      if (p.is_map())
        for (const auto& [k, v] : p.map->items) ns.map->set(k, v);
    for (const auto& [k, v] : a.kw) ns.map->set(k, v);
    return ns;
  });
  vars["dict"] = Value::function([](const CallArgs& a) {
    Value d = Value::make_map();
    for (const auto& p : a.pos)
      if (p.is_map())
        for (const auto& [k, v] : p.map->items) d.map->set(k, v);
    for (const auto& [k, v] : a.kw) d.map->set(k, v);
    return d;
  });
  vars["strftime_now"] = Value::function([](const CallArgs& a) {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    std::string fmt = a.pos.empty() ? "%Y-%m-%d" : to_str(a.pos[0]);
    size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace sieve::text::jinja
