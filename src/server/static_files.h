// The chat page and the dashboard: the files of src/server/web, built into the binary at build
// time (src/server/embed_files.cmake), looked up by request path. Nothing here knows the HTTP
// library that serves them: a route hands the path in and copies the answer out.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sieve::server {

// One file of src/server/web as the build embedded it (generated source).
struct EmbeddedFile {
  std::string_view path;  // relative to src/server/web, '/' separated
  std::string_view bytes;
  std::string_view sha1;  // hex digest of the bytes
};
const std::vector<EmbeddedFile>& embedded_files();

struct StaticFile {
  std::string_view content_type;
  std::string_view body;
  std::string etag;  // quoted, for ETag / If-None-Match
  // Headers to send with it: revalidation (the binary may change under the same path) and a
  // content security policy that lets the page load nothing but its own files.
  std::vector<std::pair<std::string, std::string>> headers;
};

// "/" and "/dashboard" give index.html (the page picks its view from the path), "/assets/NAME"
// gives web/NAME. Anything else, including paths that try to leave the folder: nullopt.
std::optional<StaticFile> find_static(std::string_view path);

// True when an If-None-Match header value names the file's current version (answer 304).
bool etag_matches(std::string_view if_none_match, const StaticFile& f);

}  // namespace sieve::server
