// Values of the Jinja renderer: Python's data model as far as chat templates see it (None,
// bool, int, float, str, list, dict in insertion order, callables) plus Jinja's Undefined.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sieve::text::jinja {

struct Value;
using List = std::vector<Value>;

struct Map {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // attribute assignment ({% set ns.x = ... %}) allowed
  const Value* find(const std::string& k) const;
  void set(const std::string& k, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(const std::string& name) const;
  // Positional `i` or keyword `name`, else nullptr.
  const Value* get(size_t i, const std::string& name) const;
};

using Func = std::function<Value(const CallArgs&)>;

struct Value {
  enum Type : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kStr, kList, kMap, kFunc };
  Type type = kUndefined;
  bool b = false;
  bool tuple = false;  // a kList that prints as a Python tuple
  int64_t i = 0;
  double f = 0;
  std::string s;  // kStr; for kUndefined the name that was looked up
  std::shared_ptr<List> list;
  std::shared_ptr<Map> map;
  std::shared_ptr<Func> func;

  static Value undefined(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.type = kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.type = kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.type = kInt;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.type = kFloat;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.type = kStr;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List x = {}) {
    Value v;
    v.type = kList;
    v.list = std::make_shared<List>(std::move(x));
    return v;
  }
  static Value make_tuple(List x) {
    Value v = make_list(std::move(x));
    v.tuple = true;
    return v;
  }
  static Value make_map() {
    Value v;
    v.type = kMap;
    v.map = std::make_shared<Map>();
    return v;
  }
  static Value function(Func f) {
    Value v;
    v.type = kFunc;
    v.func = std::make_shared<Func>(std::move(f));
    return v;
  }

  bool is_undefined() const { return type == kUndefined; }
  bool is_none() const { return type == kNone; }
  bool is_str() const { return type == kStr; }
  bool is_list() const { return type == kList; }
  bool is_map() const { return type == kMap; }
  bool is_number() const { return type == kInt || type == kFloat || type == kBool; }
  double as_double() const { return type == kFloat ? f : type == kBool ? (b ? 1 : 0) : double(i); }
  bool truthy() const;
};

template <class J>
Value from_json(const J& j, int depth = 0) {
  // Bounded so that hostile request JSON cannot overflow the stack here or in the renderer.
  if (depth > 256) throw sieve::Error("chat template input is nested deeper than 256 levels");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value::integer(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Value v = Value::make_list();
      for (const auto& e : j) v.list->push_back(from_json(e, depth + 1));
      return v;
    }
    case nlohmann::json::value_t::object: {
      Value v = Value::make_map();
      for (auto it = j.begin(); it != j.end(); ++it)
        v.map->items.emplace_back(it.key(), from_json(it.value(), depth + 1));
      return v;
    }
    default:
      return Value::undefined();
  }
}

// Python's str() and repr(), and transformers' tojson (json.dumps, ensure_ascii False unless
// asked).
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, bool ensure_ascii = false);

// Python's type(v).__name__ (for error messages).
std::string type_name(const Value& v);
// Python's ==: numbers across int/float/bool, lists and dicts element-wise.
bool values_equal(const Value& a, const Value& b);
// Python's < for the types templates compare (numbers, strings, lists): -1, 0, 1; other pairs
// fail at `pos`.
int compare_values(const Value& a, const Value& b, size_t pos);
// `needle in hay` for a string, list or dict.
bool contains(const Value& hay, const Value& needle, size_t pos);
// Items a for loop or a filter iterates: list items, dict keys, string characters; undefined
// iterates as empty.
List iterate(const Value& v, size_t pos);
// An int, bool or (truncated) float as an integer; `what` names the value in errors.
int64_t to_int(const Value& v, size_t pos, const char* what);

}  // namespace sieve::text::jinja
