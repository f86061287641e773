// The renderer's builtins: attribute and item access, the Python methods of str, dict and list
// that templates call, Jinja2's filters and tests, and the globals transformers provides
// (range, namespace, dict, raise_exception, strftime_now). docs/text.md lists them.
//
// `pos` is where the template called the builtin (for errors); kHere lets the caller fill it in.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/value.h"

namespace sieve::text::jinja {

// obj[idx] as Jinja2 resolves it (item, then method); undefined when absent.
Value get_item(const Value& obj, const Value& idx, size_t pos);
// obj.name as Jinja2 resolves it (Python attribute, i.e. a method, then item).
Value get_attr(const Value& obj, const std::string& name, size_t pos);
// The str, dict or list method `name` called on `obj`.
Value call_method(const Value& obj, const std::string& name, const CallArgs& a, size_t pos);
// The filter `name` applied to `v` (`v | name(a...)`).
Value filter(const std::string& name, const Value& v, const CallArgs& a, size_t pos);
// The test `name` of `v` (`v is name(args...)`).
bool test(const std::string& name, const Value& v, const std::vector<Value>& args, size_t pos);
// Adds the global functions to a template's outermost scope.
void add_globals(std::unordered_map<std::string, Value>& vars);

}  // namespace sieve::text::jinja
