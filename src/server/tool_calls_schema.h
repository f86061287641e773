// What the tool-call parsers and grammars read of a request's tools: a function by its name, the
// schema of a parameter, of a nested property, of an array's items, and the JSON types a schema
// allows (its "type", the types of its anyOf / oneOf alternatives, or those of its enum values).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace sieve::server {

// A tools entry's function object ({"type": "function", "function": {...}} or the function
// itself), or null when it has no string name.
inline const nlohmann::ordered_json* function_of(const nlohmann::ordered_json& entry) {
  const nlohmann::ordered_json& fn = entry.is_object() && entry.contains("function") ? entry["function"] : entry;
  if (!fn.is_object()) return nullptr;
  auto name = fn.find("name");
  return name != fn.end() && name->is_string() ? &fn : nullptr;
}

// The function object of the request's first tool named `name`, or null.
inline const nlohmann::ordered_json* find_function(const nlohmann::ordered_json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const nlohmann::ordered_json& t : tools)
    if (const nlohmann::ordered_json* fn = function_of(t); fn && (*fn)["name"].get<std::string>() == name) return fn;
  return nullptr;
}

// A function's parameters schema (an object), or null.
inline const nlohmann::ordered_json* parameters_of(const nlohmann::ordered_json* fn) {
  if (!fn) return nullptr;
  auto p = fn->find("parameters");
  return p != fn->end() && p->is_object() ? &*p : nullptr;
}

struct SchemaTypes {
  bool string = false, integer = false, number = false, boolean = false, null = false, object = false,
       array = false;
  bool none() const { return !(string || integer || number || boolean || null || object || array); }
};

inline void add_types(const nlohmann::ordered_json& schema, SchemaTypes& t, int depth = 0) {
  if (!schema.is_object() || depth > 8) return;
  auto name = [&](const std::string& n) {
    if (n == "string") t.string = true;
    if (n == "integer") t.integer = true;
    if (n == "number") t.number = true;
    if (n == "boolean") t.boolean = true;
    if (n == "null") t.null = true;
    if (n == "object") t.object = true;
    if (n == "array") t.array = true;
  };
  if (auto ty = schema.find("type"); ty != schema.end()) {
    if (ty->is_string()) name(ty->get<std::string>());
    if (ty->is_array())
      for (const auto& x : *ty)
        if (x.is_string()) name(x.get<std::string>());
  } else if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    for (const auto& v : *e) {
      if (v.is_string()) t.string = true;
      if (v.is_number_integer()) t.integer = true;
      if (v.is_number_float()) t.number = true;
      if (v.is_boolean()) t.boolean = true;
      if (v.is_null()) t.null = true;
    }
  } else if (schema.contains("properties")) {
    t.object = true;
  } else if (schema.contains("items")) {
    t.array = true;
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (auto alts = schema.find(key); alts != schema.end() && alts->is_array())
      for (const auto& alt : *alts) add_types(alt, t, depth + 1);
}

// The types `schema` allows (none for a null or empty schema).
inline SchemaTypes types_of(const nlohmann::ordered_json* schema) {
  SchemaTypes t;
  if (schema) add_types(*schema, t);
  return t;
}

// The alternative of `schema` (itself, or one of its anyOf / oneOf) that has `key`, or null.
inline const nlohmann::ordered_json* with_key(const nlohmann::ordered_json* schema, const char* key) {
  if (!schema || !schema->is_object()) return nullptr;
  if (schema->contains(key)) return schema;
  for (const char* alts : {"anyOf", "oneOf"})
    if (auto a = schema->find(alts); a != schema->end() && a->is_array())
      for (const auto& alt : *a)
        if (alt.is_object() && alt.contains(key)) return &alt;
  return nullptr;
}

// The schema of property `key` of an object schema (its properties, else additionalProperties).
inline const nlohmann::ordered_json* property_schema(const nlohmann::ordered_json* schema, const std::string& key) {
  if (const nlohmann::ordered_json* s = with_key(schema, "properties"))
    if (auto p = (*s)["properties"].find(key); (*s)["properties"].is_object() && p != (*s)["properties"].end())
      return p->is_object() ? &*p : nullptr;
  if (const nlohmann::ordered_json* s = with_key(schema, "additionalProperties"))
    if ((*s)["additionalProperties"].is_object()) return &(*s)["additionalProperties"];
  return nullptr;
}

// The schema of an array schema's items.
inline const nlohmann::ordered_json* item_schema(const nlohmann::ordered_json* schema) {
  if (const nlohmann::ordered_json* s = with_key(schema, "items"))
    if ((*s)["items"].is_object()) return &(*s)["items"];
  return nullptr;
}

}  // namespace sieve::server
