// The HTTP request parser: whole requests in one piece and byte by byte, and every malformed
// input refused with its status from the bytes in hand (never by waiting for more).
#include "server/http_parser.h"

#include <gtest/gtest.h>

#include <string>

namespace sieve::server {
namespace {

// Feeds `in` at once (or byte by byte), re-checking after the head as the server does.
RequestParser::State feed_all(RequestParser& p, const std::string& in, bool bytewise,
                              size_t* pos_out = nullptr) {
  size_t pos = 0;
  RequestParser::State st = RequestParser::State::Head;
  std::string buf;
  const size_t step = bytewise ? 1 : in.size();
  for (size_t i = 0; i < in.size(); i += step) {
    buf += in.substr(i, step);
    do {
      const size_t before = pos;
      st = p.feed(buf, &pos);
      if (st == RequestParser::State::Error || st == RequestParser::State::Done) break;
      if (pos == before) break;
    } while (true);
    if (st == RequestParser::State::Error || st == RequestParser::State::Done) break;
  }
  if (pos_out) *pos_out = pos;
  return st;
}

HttpLimits small() {
  HttpLimits l;
  l.max_body_bytes = 1000;
  return l;
}

TEST(HttpParser, ParsesRequestsWholeAndByteByByte) {
  const std::string req =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: "
      "application/json\r\nContent-Length: 11\r\n\r\n"
      "{\"a\":12345}";
  for (bool bytewise : {false, true}) {
    RequestParser p(small());
    size_t pos = 0;
    ASSERT_EQ(feed_all(p, req, bytewise, &pos), RequestParser::State::Done) << p.error_message();
    EXPECT_EQ(pos, req.size());
    EXPECT_EQ(p.request().method, "POST");
    EXPECT_EQ(p.request().path, "/v1/completions");
    EXPECT_EQ(p.request().query, "x=1");
    EXPECT_EQ(p.request().header("content-type"), "application/json");
    EXPECT_EQ(p.request().body, "{\"a\":12345}");
    EXPECT_TRUE(p.request().keep_alive);
    EXPECT_TRUE(p.request().has_length);
  }
  const std::string chunked =
      "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: "
      "close\r\n\r\n5;ext=1\r\nhello\r\n"
      "A\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n";
  for (bool bytewise : {false, true}) {
    RequestParser p(small());
    ASSERT_EQ(feed_all(p, chunked, bytewise), RequestParser::State::Done) << p.error_message();
    EXPECT_EQ(p.request().body, "hello0123456789");
    EXPECT_FALSE(p.request().keep_alive);
  }
  RequestParser p(small());
  ASSERT_EQ(feed_all(p, "GET /health HTTP/1.0\n\n", false), RequestParser::State::Done);
  EXPECT_FALSE(p.request().keep_alive);
  EXPECT_FALSE(p.request().has_length);
}

TEST(HttpParser, RefusesMalformedInputAtOnce) {
  struct Case {
    std::string in;
    int status;
  } cases[] = {
      {"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413},
      {"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", 400},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-", 400},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n", 413},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff", 413},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX", 400},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400},
      {"GET /x HTTP/2.0\r\n\r\n", 505},
      {"GET /x\r\n\r\n", 400},
      {"\x16\x03\x01\x02\x00", 400},  // a TLS hello
      {"GET x HTTP/1.1\r\n\r\n", 400},
      {"GET /x HTTP/1.1\r\n folded\r\n\r\n", 400},
      {"GET /x HTTP/1.1\r\nNo colon\r\n\r\n", 400},
      {"GET /x HTTP/1.1\r\nBad Name: 1\r\n\r\n", 400},
      {"GET /x HTTP/1.1\r\nExpect: something\r\n\r\n", 417},
  };
  for (const Case& c : cases)
    for (bool bytewise : {false, true}) {
      RequestParser p(small());
      EXPECT_EQ(feed_all(p, c.in, bytewise), RequestParser::State::Error) << c.in;
      EXPECT_EQ(p.error_status(), c.status) << c.in << ": " << p.error_message();
      EXPECT_FALSE(p.error_message().empty());
    }
}

// Head limits are enforced as the head comes, not once it is complete.
TEST(HttpParser, HeadLimitsBeforeTheHeadEnds) {
  std::string many = "GET /x HTTP/1.1\r\n";
  for (int i = 0; i < 201; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  RequestParser p(small());
  EXPECT_EQ(feed_all(p, many, false), RequestParser::State::Error);  // no blank line yet
  EXPECT_EQ(p.error_status(), 431);
  RequestParser q(small());
  std::string big = "GET /x HTTP/1.1\r\nX: " + std::string(70 << 10, 'a');
  EXPECT_EQ(feed_all(q, big, false), RequestParser::State::Error);
  EXPECT_EQ(q.error_status(), 431);
  RequestParser r(small());
  EXPECT_EQ(feed_all(r, "GET /" + std::string(9 << 10, 'a'), false), RequestParser::State::Error);
  EXPECT_EQ(r.error_status(), 414);
  // Exactly 200 fields are fine.
  std::string ok = "GET /x HTTP/1.1\r\n";
  for (int i = 0; i < 200; ++i) ok += "X-" + std::to_string(i) + ": 1\r\n";
  RequestParser s(small());
  EXPECT_EQ(feed_all(s, ok + "\r\n", false), RequestParser::State::Done) << s.error_message();
  EXPECT_EQ(s.request().headers.size(), 200u);
}

TEST(HttpParser, PipelinedRequestsAfterReset) {
  const std::string two = "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.1\r\n\r\n";
  RequestParser p(small());
  size_t pos = 0;
  while (p.feed(two, &pos) == RequestParser::State::Body) {
  }
  ASSERT_EQ(p.state(), RequestParser::State::Done);
  EXPECT_EQ(p.request().body, "hi");
  p.reset();
  RequestParser::State st;
  while ((st = p.feed(two, &pos)) == RequestParser::State::Body) {
  }
  EXPECT_EQ(st, RequestParser::State::Done);
  EXPECT_EQ(p.request().path, "/b");
  EXPECT_EQ(pos, two.size());
}

}  // namespace
}  // namespace sieve::server
