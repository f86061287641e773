#include "model/locate.h"

#include <algorithm>
#include <filesystem>
#include <vector>

namespace sieve::model {

std::string bundled_model_dir(const std::string& source_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path root = fs::path(source_dir) / "models";
  if (!fs::is_directory(root, ec)) return "";
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && fs::exists(e.path() / "config.json")) dirs.push_back(e.path());
  if (dirs.empty()) return "";
  std::sort(dirs.begin(), dirs.end());
  return dirs.front().string();
}

}  // namespace sieve::model
