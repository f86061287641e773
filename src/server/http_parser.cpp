#include "server/http_parser.h"

#include <algorithm>
#include <cctype>

namespace sieve::server {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(uint8_t(a[i])) != std::tolower(uint8_t(b[i]))) return false;
  return true;
}

// RFC 9110 token characters (methods, header names).
bool tchar(char c) {
  return std::isalnum(uint8_t(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = char(std::tolower(uint8_t(c)));
  return o;
}

// Shows a client's bytes in a message: printable ASCII, the rest escaped, at most 40 of them.
std::string shown(std::string_view s) {
  std::string o;
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const uint8_t c = uint8_t(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      o += char(c);
    } else {
      static const char* hex = "0123456789abcdef";
      o += "\\x";
      o += hex[c >> 4];
      o += hex[c & 15];
    }
  }
  if (s.size() > 40) o += "...";
  return o;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

void RequestParser::reset() {
  state_ = State::Head;
  req_ = HttpRequest{};
  scanned_ = 0;
  line_start_ = 0;
  head_lines_ = 0;
  content_length_ = -1;
  chunked_ = false;
  chunk_state_ = 0;
  chunk_left_ = 0;
  error_status_ = 0;
  error_message_.clear();
}

RequestParser::State RequestParser::fail(int status, std::string msg) {
  state_ = State::Error;
  error_status_ = status;
  error_message_ = std::move(msg);
  return state_;
}

RequestParser::State RequestParser::feed(std::string_view in, size_t* pos) {
  if (state_ == State::Head) {
    // Empty lines before a request line are ignored (RFC 9112 2.2).
    if (scanned_ == 0)
      while (*pos < in.size() && (in[*pos] == '\r' || in[*pos] == '\n')) ++*pos;
    const std::string_view rest = in.substr(*pos);
    // The method, as soon as its bytes are here: anything else (TLS, binary) is refused at once.
    for (size_t i = 0; i < rest.size() && rest[i] != ' '; ++i)
      if (!tchar(rest[i]) || i >= 32)
        return fail(400, "malformed request line: \"" + shown(rest.substr(0, i + 1)) + "\"");
    // Find the blank line that ends the head, counting lines as they come so that a head over
    // the limits is refused before it is complete. Bytes already scanned are not scanned again.
    size_t i = scanned_, line_start = line_start_, lines = head_lines_;
    size_t head_end = std::string_view::npos;
    for (; i < rest.size(); ++i) {
      if (rest[i] != '\n') continue;
      const std::string_view line = rest.substr(line_start, i - line_start);
      if (line.empty() || line == "\r") {
        head_end = i + 1;
        break;
      }
      line_start = i + 1;
      if (++lines > limits_.max_headers + 1)
        return fail(431,
                    "too many header fields (at most " + std::to_string(limits_.max_headers) + ")");
    }
    if (head_end == std::string_view::npos) {
      scanned_ = i;
      line_start_ = line_start;
      head_lines_ = lines;
      if (lines == 0 && rest.size() > limits_.max_line_bytes)
        return fail(414, "the request line is longer than " +
                             std::to_string(limits_.max_line_bytes) + " bytes");
      if (rest.size() > limits_.max_head_bytes)
        return fail(431, "the request head is larger than " +
                             std::to_string(limits_.max_head_bytes) + " bytes");
      return state_;
    }
    if (head_end > limits_.max_head_bytes)
      return fail(431, "the request head is larger than " + std::to_string(limits_.max_head_bytes) +
                           " bytes");
    *pos += head_end;
    return parse_head(rest.substr(0, head_end));
  }
  if (state_ == State::Body) {
    if (chunked_) return feed_chunked(in, pos);
    const size_t need = size_t(std::max<int64_t>(content_length_, 0)) - req_.body.size();
    const size_t take = std::min(need, in.size() - *pos);
    req_.body.append(in.substr(*pos, take));
    *pos += take;
    if (int64_t(req_.body.size()) >= std::max<int64_t>(content_length_, 0)) state_ = State::Done;
    return state_;
  }
  return state_;
}

RequestParser::State RequestParser::parse_head(std::string_view head) {
  std::vector<std::string_view> lines;
  for (size_t s = 0; s < head.size();) {
    size_t e = head.find('\n', s);
    if (e == std::string_view::npos) e = head.size();
    std::string_view l = head.substr(s, e - s);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (!l.empty()) lines.push_back(l);
    s = e + 1;
  }
  if (lines.empty()) return fail(400, "empty request");
  // Request line: METHOD SP request-target SP HTTP/1.x
  const std::string_view rl = lines[0];
  const size_t sp1 = rl.find(' '),
               sp2 = sp1 == std::string_view::npos ? sp1 : rl.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string_view::npos || rl.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line: \"" + shown(rl) + "\"");
  req_.method = std::string(rl.substr(0, sp1));
  req_.target = std::string(rl.substr(sp1 + 1, sp2 - sp1 - 1));
  const std::string_view version = rl.substr(sp2 + 1);
  if (version == "HTTP/1.1") {
    req_.minor_version = 1;
  } else if (version == "HTTP/1.0") {
    req_.minor_version = 0;
  } else if (version.substr(0, 5) == "HTTP/") {
    return fail(505,
                "HTTP version " + shown(version.substr(5)) + " is not supported (1.0 and 1.1 are)");
  } else {
    return fail(400, "malformed request line: \"" + shown(rl) + "\"");
  }
  std::string_view target = req_.target;
  for (char c : target)
    if (uint8_t(c) <= 0x20 || c == 0x7f) return fail(400, "malformed request target");
  if (target.substr(0, 7) == "http://" || target.substr(0, 8) == "https://") {
    // Absolute form (proxies): the path is what follows the authority.
    const size_t slash = target.find('/', target.find("//") + 2);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  if (target.empty() || (target[0] != '/' && target != "*"))
    return fail(400, "malformed request target \"" + shown(req_.target) + "\"");
  const size_t q = target.find('?');
  req_.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) req_.query = std::string(target.substr(q + 1));

  std::string_view te, connection;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string_view l = lines[i];
    if (l[0] == ' ' || l[0] == '\t')
      return fail(400, "obsolete header line folding is not accepted");
    const size_t colon = l.find(':');
    if (colon == std::string_view::npos || colon == 0)
      return fail(400, "malformed header line: \"" + shown(l) + "\"");
    const std::string_view name = l.substr(0, colon);
    for (char c : name)
      if (!tchar(c)) return fail(400, "malformed header name: \"" + shown(name) + "\"");
    const std::string_view value = trim(l.substr(colon + 1));
    for (char c : value)
      if ((uint8_t(c) < 0x20 && c != '\t') || c == 0x7f)
        return fail(400, "header " + std::string(name) + ": control characters are not accepted");
    if (iequals(name, "Content-Length")) {
      // Digits only (a list of equal values is one value); a sign or anything else is refused.
      std::string_view v = value;
      while (!v.empty()) {
        const size_t comma = v.find(',');
        const std::string_view one = trim(v.substr(0, comma));
        if (one.empty() ||
            !std::all_of(one.begin(), one.end(), [](char c) { return c >= '0' && c <= '9'; }))
          return fail(
              400, "Content-Length: expected a non-negative integer, got \"" + shown(value) + "\"");
        int64_t n = 0;
        if (one.size() > 18) {
          n = INT64_MAX;
        } else {
          for (char c : one) n = n * 10 + (c - '0');
        }
        if (content_length_ >= 0 && content_length_ != n)
          return fail(400, "Content-Length: conflicting values");
        content_length_ = n;
        v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      }
    } else if (iequals(name, "Transfer-Encoding")) {
      if (!te.empty()) return fail(400, "Transfer-Encoding: given twice");
      te = value;
    } else if (iequals(name, "Connection")) {
      connection = value;
    } else if (iequals(name, "Expect")) {
      if (!iequals(value, "100-continue"))
        return fail(417, "Expect: only 100-continue is understood");
      req_.expect_continue = true;
    }
    req_.headers.emplace_back(std::string(name), std::string(value));
  }
  const std::string conn = lower(connection);
  req_.keep_alive = req_.minor_version == 1 ? conn.find("close") == std::string::npos
                                            : conn.find("keep-alive") != std::string::npos;
  if (!te.empty()) {
    if (content_length_ >= 0)
      return fail(400, "Content-Length and Transfer-Encoding together are not accepted");
    if (req_.minor_version == 0) return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (!iequals(te, "chunked")) return fail(501, "Transfer-Encoding: only chunked is supported");
    chunked_ = true;
  }
  req_.has_length = chunked_ || content_length_ >= 0;
  if (content_length_ > int64_t(limits_.max_body_bytes))
    return fail(413, "the request body (" + std::to_string(content_length_) +
                         " bytes) is larger than the server accepts (" +
                         std::to_string(limits_.max_body_bytes) + " bytes)");
  state_ = State::Body;
  return state_;
}

RequestParser::State RequestParser::feed_chunked(std::string_view in, size_t* pos) {
  while (*pos < in.size()) {
    const std::string_view rest = in.substr(*pos);
    if (chunk_state_ == 0) {
      // chunk-size [; extensions] CRLF: a size that is not hex (a sign, a blank) is refused at
      // its first byte.
      if (hex_value(rest[0]) < 0)
        return fail(400, "chunk size: expected hexadecimal digits, got \"" +
                             shown(rest.substr(0, 8)) + "\"");
      const size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) {
        if (rest.size() > 1024) return fail(400, "chunk size line longer than 1024 bytes");
        for (size_t k = 0; k < rest.size() && hex_value(rest[k]) >= 0; ++k)
          if (k >= 15) return fail(413, "chunk size too large");
        return state_;
      }
      std::string_view line = rest.substr(0, nl);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      uint64_t size = 0;
      size_t k = 0;
      for (; k < line.size() && hex_value(line[k]) >= 0; ++k) {
        if (k >= 15) return fail(413, "chunk size too large");
        size = size * 16 + uint64_t(hex_value(line[k]));
      }
      const std::string_view after = trim(line.substr(k));
      if (!after.empty() && after[0] != ';')
        return fail(400, "chunk size: expected hexadecimal digits, got \"" + shown(line) + "\"");
      if (req_.body.size() + size > limits_.max_body_bytes)
        return fail(413, "the request body is larger than the server accepts (" +
                             std::to_string(limits_.max_body_bytes) + " bytes)");
      *pos += nl + 1;
      chunk_left_ = size;
      chunk_state_ = size == 0 ? 3 : 1;
      scanned_ = 0;
    } else if (chunk_state_ == 1) {
      const size_t take = size_t(std::min<uint64_t>(chunk_left_, rest.size()));
      req_.body.append(rest.substr(0, take));
      *pos += take;
      chunk_left_ -= take;
      if (chunk_left_ == 0) chunk_state_ = 2;
    } else if (chunk_state_ == 2) {
      if (rest[0] == '\n') {
        *pos += 1;
        chunk_state_ = 0;
      } else if (rest[0] == '\r') {
        if (rest.size() < 2) return state_;
        if (rest[1] != '\n') return fail(400, "chunk data not followed by CRLF");
        *pos += 2;
        chunk_state_ = 0;
      } else {
        return fail(400, "chunk data longer than its size");
      }
    } else {
      // Trailer fields, ignored, up to a blank line.
      const size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) {
        if (rest.size() > limits_.max_head_bytes) return fail(431, "chunked trailer too large");
        return state_;
      }
      std::string_view line = rest.substr(0, nl);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      *pos += nl + 1;
      scanned_ += nl + 1;
      if (scanned_ > limits_.max_head_bytes) return fail(431, "chunked trailer too large");
      if (line.empty()) {
        state_ = State::Done;
        return state_;
      }
    }
  }
  return state_;
}

}  // namespace sieve::server
