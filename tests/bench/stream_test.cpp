// SSE splitting and chunk interpretation, fed from strings.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/stream.h"

namespace sieve::bench {
namespace {

TEST(BenchSse, SplitsAcrossArbitraryPieces) {
  std::string stream =
      "data: {\"a\":1}\n\n: keep-alive comment\r\nevent: x\ndata:{\"b\":2}\r\n\r\ndata: [DONE]\n\n";
  for (size_t piece : {size_t(1), size_t(3), size_t(7), stream.size()}) {
    SseSplitter sp;
    std::vector<std::string> got;
    for (size_t i = 0; i < stream.size(); i += piece)
      sp.feed(std::string_view(stream).substr(i, piece),
              [&](std::string_view p) { got.emplace_back(p); });
    EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"}))
        << "piece " << piece;
  }
}

TEST(BenchSse, CompletionChunksAndUsage) {
  StreamState st;
  RequestRecord r;
  r.start_time = 1.0;
  apply_sse_payload(R"({"choices":[{"index":0,"text":"Hel"}]})", 1.5, st, r);
  apply_sse_payload(R"({"choices":[{"index":0,"text":"lo","finish_reason":null}]})", 1.7, st, r);
  apply_sse_payload(R"({"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":null})",
                    1.8, st, r);
  apply_sse_payload(
      R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}})", 1.9,
      st, r);
  apply_sse_payload("[DONE]", 2.0, st, r);
  EXPECT_EQ(r.generated_text, "Hello");
  EXPECT_EQ(r.chunk_times, (std::vector<double>{1.5, 1.7, 1.8}));  // the usage chunk is no token
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_EQ(st.usage_prompt_tokens, 12);
  EXPECT_TRUE(st.done);
  EXPECT_TRUE(r.success());
  EXPECT_DOUBLE_EQ(r.latency(), 0.8);
}

TEST(BenchSse, ChatDeltas) {
  StreamState st;
  st.chat = true;
  RequestRecord r;
  apply_sse_payload(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", 1, st,
                    r);
  apply_sse_payload(R"({"choices":[{"index":0,"delta":{"content":"Hi"}}]})", 2, st, r);
  apply_sse_payload(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", 3, st, r);
  EXPECT_EQ(r.generated_text, "Hi");
  EXPECT_EQ(r.chunk_times.size(), 3u);
}

TEST(BenchSse, ErrorsInTheStream) {
  StreamState st;
  RequestRecord r;
  apply_sse_payload(R"({"choices":[{"text":"a"}]})", 1, st, r);
  apply_sse_payload(R"({"error":{"message":"out of blocks","type":"server_error"}})", 2, st, r);
  EXPECT_EQ(r.error, "server error in stream: out of blocks");
  EXPECT_FALSE(r.success());
  RequestRecord r2;
  apply_sse_payload("{not json", 1, st, r2);
  EXPECT_NE(r2.error.find("invalid JSON in SSE chunk"), std::string::npos);
}

}  // namespace
}  // namespace sieve::bench
