// An HTTP/1.1 request parser for the server's own event loop: fed the bytes of one connection as
// they come, it yields complete requests or the status that refuses one. Malformed input is
// refused as soon as the bytes in hand show it (a negative or non-numeric length or chunk size, a
// head over its limits, a body longer than allowed), never after waiting for more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sieve::server {

struct HttpLimits {
  size_t max_head_bytes = 64 << 10;   // request line and headers (431 beyond)
  size_t max_headers = 200;           // 431 beyond
  size_t max_line_bytes = 8 << 10;    // the request line (414 beyond)
  size_t max_body_bytes = 32u << 20;  // 413 beyond, refused before the body is read
};

struct HttpRequest {
  std::string method, target, path, query;
  int minor_version = 1;  // HTTP/1.x
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool has_length = false;  // Content-Length or chunked framing was given
  bool expect_continue = false;
  bool keep_alive = true;

  // The first value of header `name` (case-insensitive), or "".
  std::string_view header(std::string_view name) const;
};

class RequestParser {
 public:
  enum class State { Head, Body, Done, Error };
  explicit RequestParser(HttpLimits limits) : limits_(limits) {}

  // Consumes what it can of `in` from `*pos` on (advancing `*pos`). Head: more bytes are needed
  // for the head; Body: the head is complete (see request()) and the body is still coming; Done:
  // request() is complete; Error: error_status() and error_message() say why.
  State feed(std::string_view in, size_t* pos);
  // After the head: the body's framing is checked here, so the caller can refuse a request
  // (auth, routes, lengths) before reading its body.
  State state() const { return state_; }
  HttpRequest& request() { return req_; }
  int64_t content_length() const { return content_length_; }
  bool chunked() const { return chunked_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  // Ready for the next request on the same connection.
  void reset();

 private:
  State fail(int status, std::string msg);
  State parse_head(std::string_view head);
  State feed_chunked(std::string_view in, size_t* pos);

  HttpLimits limits_;
  State state_ = State::Head;
  HttpRequest req_;
  size_t scanned_ = 0;  // head bytes already searched for the blank line (chunked: trailer bytes)
  size_t line_start_ = 0;  // where the head's current line starts
  size_t head_lines_ = 0;  // complete lines of the head so far
  int64_t content_length_ = -1;
  bool chunked_ = false;
  // Chunked body: 0 size line, 1 data, 2 the CRLF after data, 3 trailers.
  int chunk_state_ = 0;
  uint64_t chunk_left_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace sieve::server
