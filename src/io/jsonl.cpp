#include "io/jsonl.h"

#include <fstream>

#include "core/error.h"

namespace sieve::io {

void for_each_jsonl(const std::string& path, const std::string& what,
                    const std::function<void(const nlohmann::json& value, const std::string& where)>& fn) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + what + " " + path);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line.back() == '\r') line.pop_back();
    const std::string where = path + ":" + std::to_string(n);
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) throw Error(where + ": not JSON");
    fn(j, where);
  }
}

}  // namespace sieve::io
