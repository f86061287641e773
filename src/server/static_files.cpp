#include "server/static_files.h"

namespace sieve::server {

namespace {

std::string_view content_type_of(std::string_view name) {
  const size_t dot = name.rfind('.');
  const std::string_view ext = dot == std::string_view::npos ? "" : name.substr(dot + 1);
  if (ext == "html") return "text/html; charset=utf-8";
  if (ext == "js" || ext == "mjs") return "text/javascript; charset=utf-8";
  if (ext == "css") return "text/css; charset=utf-8";
  if (ext == "svg") return "image/svg+xml";
  if (ext == "png") return "image/png";
  if (ext == "json") return "application/json";
  return "application/octet-stream";
}

bool safe_name(std::string_view name) {
  if (name.empty() || name.front() == '.') return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return true;
}

}  // namespace

std::optional<StaticFile> find_static(std::string_view path) {
  std::string_view name;
  if (path == "/" || path == "/dashboard") {
    name = "index.html";
  } else if (path.rfind("/assets/", 0) == 0) {
    name = path.substr(8);
    if (!safe_name(name) || name == "index.html") return std::nullopt;
  } else {
    return std::nullopt;
  }
  for (const EmbeddedFile& f : embedded_files()) {
    if (f.path != name) continue;
    StaticFile s;
    s.content_type = content_type_of(name);
    s.body = f.bytes;
    s.etag = "\"" + std::string(f.sha1.substr(0, 16)) + "\"";
    s.headers = {{"Cache-Control", "no-cache"},
                 {"X-Content-Type-Options", "nosniff"},
                 {"Referrer-Policy", "no-referrer"}};
    if (name.size() > 5 && name.substr(name.size() - 5) == ".html") {
      // Model output is rendered as markdown on this page; should a bug ever let markup
      // through, the browser still runs and loads only the page's own files.
      s.headers.emplace_back("Content-Security-Policy",
                             "default-src 'none'; script-src 'self'; style-src 'self'; "
                             "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                             "form-action 'none'; frame-ancestors 'none'");
      s.headers.emplace_back("X-Frame-Options", "DENY");
    }
    return s;
  }
  return std::nullopt;
}

bool etag_matches(std::string_view if_none_match, const StaticFile& f) {
  if (if_none_match.empty()) return false;
  if (if_none_match == "*") return true;
  // A list of tags, possibly weak (W/"..."), separated by commas.
  size_t pos = 0;
  while (pos < if_none_match.size()) {
    size_t end = if_none_match.find(',', pos);
    if (end == std::string_view::npos) end = if_none_match.size();
    std::string_view tag = if_none_match.substr(pos, end - pos);
    while (!tag.empty() && tag.front() == ' ') tag.remove_prefix(1);
    while (!tag.empty() && tag.back() == ' ') tag.remove_suffix(1);
    if (tag.rfind("W/", 0) == 0) tag.remove_prefix(2);
    if (tag == f.etag) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace sieve::server
