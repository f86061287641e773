#pragma once
// JSON Lines files (one JSON value per line): datasets, GSM8K, tokenizer input.

#include <nlohmann/json.hpp>

#include <functional>
#include <string>

namespace sieve::io {

// Calls fn(value, where) for each non-blank line of `path` in order, `where` being "PATH:LINE"
// for the caller's own messages about the value's shape. Throws Error naming the file
// ("cannot open WHAT PATH") or the line that is not JSON. A trailing \r is tolerated.
void for_each_jsonl(const std::string& path, const std::string& what,
                    const std::function<void(const nlohmann::json& value, const std::string& where)>& fn);

}  // namespace sieve::io
