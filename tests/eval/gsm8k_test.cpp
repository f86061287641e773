// GSM8K scoring on hand-made answers, prompts, the table, and a run against a loopback server.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include "eval/gsm8k.h"

namespace sieve::eval {
namespace {

TEST(Gsm8kScoring, StrictTakesTheFirstHashAnswer) {
  EXPECT_EQ(extract_strict("She makes 9 * 2 = $18.\n#### 18"), "18");
  EXPECT_EQ(extract_strict("#### 1,000 and later #### 7"), "1,000");
  EXPECT_EQ(extract_strict("#### -3.5"), "-3.5");
  EXPECT_EQ(extract_strict("The answer is 18."), "[invalid]");
  EXPECT_EQ(extract_strict("####18"), "[invalid]");  // the space is part of the pattern
}

TEST(Gsm8kScoring, FlexibleTakesTheLastNumber) {
  EXPECT_EQ(extract_flexible("16 - 3 - 4 = 9 eggs, 9 * 2 = 18"), "18");
  EXPECT_EQ(extract_flexible("It costs $1,250.50 in total."), "$1,250.50");
  EXPECT_EQ(extract_flexible("so 5 apples"), "5");  // one digit: the second alternative
  EXPECT_EQ(extract_flexible("answer: -7"), "-7");
  EXPECT_EQ(extract_flexible("first 12 then 3."), "3.");  // "3." matches the 2+ class
  EXPECT_EQ(extract_flexible("no digits here"), "[invalid]");
}

TEST(Gsm8kScoring, NormalisationAsLmEval) {
  const std::string gold = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 1,018";
  EXPECT_EQ(normalize_answer(gold), "1018");
  EXPECT_TRUE(exact_match("1,018", gold));
  EXPECT_TRUE(exact_match("$1,018", gold));
  EXPECT_TRUE(exact_match("1018.", gold));    // a final period is dropped
  EXPECT_FALSE(exact_match("1018.0", gold));  // no numeric equivalence
  EXPECT_FALSE(exact_match("[invalid]", gold));
  EXPECT_TRUE(exact_match(extract_flexible("So she makes $1,018."), gold));
  EXPECT_TRUE(exact_match(extract_strict("x\n#### $1,018"), gold) ==
              false);  // strict needs digits after "#### "
  EXPECT_TRUE(exact_match(extract_strict("x\n#### 1,018"), gold));
  EXPECT_EQ(normalize_answer("ABC"), "abc");  // ignore_case
}

TEST(Gsm8kScoring, ResponsesScoredBothWays) {
  const std::string gold = "... #### 42";
  struct Case {
    std::string reply;
    bool flex, strict;
  } cases[] = {
      {"6 * 7 = 42\n#### 42", true, true},
      {"6 * 7 = 42. The answer is 42.", true, false},
      {"#### 42\nbut then 43", false, true},
      {"I think 41", false, false},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(exact_match(extract_flexible(c.reply), gold), c.flex) << c.reply;
    EXPECT_EQ(exact_match(extract_strict(c.reply), gold), c.strict) << c.reply;
  }
}

TEST(Gsm8kPrompt, FewShotLayout) {
  std::vector<Gsm8kDoc> shots{{"q1?", "a1\n#### 1"}, {"q2?", "a2\n#### 2"}};
  EXPECT_EQ(completion_prompt(shots, {"q?", "x"}),
            "Question: q1?\nAnswer: a1\n#### 1\n\nQuestion: q2?\nAnswer: a2\n#### 2\n\nQuestion: "
            "q?\nAnswer:");
  EXPECT_EQ(completion_prompt({}, {"q?", "x"}), "Question: q?\nAnswer:");
  auto m = chat_messages(shots, {"q?", "x"});
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["content"], "a1\n#### 1");
  EXPECT_EQ(m[4]["content"], "Question: q?\nAnswer:");
  EXPECT_EQ(cut_at_stop("18\n#### 18\n\nQuestion: next"), "18\n#### 18");
  EXPECT_EQ(cut_at_stop("a<|im_end|>b"), "a");
  auto f = fewshot_indices(100, 5, 1234, 7);
  EXPECT_EQ(f.size(), 5u);
  EXPECT_EQ(f, fewshot_indices(100, 5, 1234, 7));
  EXPECT_NE(f, fewshot_indices(100, 5, 1234, 8));
  std::sort(f.begin(), f.end());
  EXPECT_EQ(std::unique(f.begin(), f.end()), f.end());
}

TEST(Gsm8kTable, StderrAndLayout) {
  Score s = mean_score({1, 1, 1, 0});
  EXPECT_DOUBLE_EQ(s.value, 0.75);
  EXPECT_NEAR(s.stderr_, std::sqrt(0.25) / 2.0, 1e-12);  // sample std 0.5, / sqrt(4)
  EXPECT_TRUE(std::isnan(mean_score({1}).stderr_));
  Score flex{0.9424, 0.0064, 1319}, strict{0.9431, 0.0064, 1319};
  EXPECT_EQ(format_table(flex, strict, 5),
            "|Tasks|Version|     Filter     |n-shot|  Metric   |   |Value |   |Stderr|\n"
            "|-----|------:|----------------|-----:|-----------|---|-----:|---|-----:|\n"
            "|gsm8k|      3|flexible-extract|     5|exact_match|↑  |0.9424|±  |0.0064|\n"
            "|     |       |strict-match    |     5|exact_match|↑  |0.9431|±  |0.0064|\n");
}

// Answers the first `correct` questions of the test split right (gold text, then more text that
// the stop strings must cut), the rest wrong; fails the first attempt of every 5th request.
class FakeGsm8kServer {
 public:
  explicit FakeGsm8kServer(const std::vector<Gsm8kDoc>& test, size_t correct) {
    for (size_t i = 0; i < test.size(); ++i)
      answers_[test[i].question] = {test[i].answer, i < correct};
    svr_.new_task_queue = [] { return new httplib::ThreadPool(16); };
    svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      auto body = nlohmann::json::parse(req.body);
      std::string prompt = body["prompt"];
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (seen_[prompt]++ == 0 && seen_.size() % 5 == 1) {  // every 5th new prompt: once busy
          res.status = 503;
          res.set_content("busy", "text/plain");
          return;
        }
      }
      EXPECT_EQ(body["temperature"], 0);
      EXPECT_EQ(body["stop"], nlohmann::json(gsm8k_stop_strings()));
      auto q0 = prompt.rfind("Question: ") + 10;
      auto q1 = prompt.rfind("\nAnswer:");
      std::string q = prompt.substr(q0, q1 - q0);
      // Five worked examples precede the question.
      size_t shots = 0;
      for (size_t at = prompt.find("\n#### "); at != std::string::npos;
           at = prompt.find("\n#### ", at + 1))
        ++shots;
      EXPECT_EQ(shots, 5u);
      auto it = answers_.find(q);
      std::string reply = it == answers_.end() ? "unknown"
                          : it->second.second  ? " " + it->second.first + "\n\nQuestion: more 99"
                                               : " I do not know, maybe 123456789.";
      nlohmann::json chunk{
          {"choices", {{{"index", 0}, {"text", reply}, {"finish_reason", "stop"}}}}};
      res.set_content("data: " + chunk.dump() + "\n\ndata: [DONE]\n\n", "text/event-stream");
    });
    // Chat: the examples are earlier turns; the reply is right for the first `correct` questions,
    // and comes as deltas split over two chunks.
    svr_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      auto body = nlohmann::json::parse(req.body);
      const auto& msgs = body["messages"];
      EXPECT_EQ(msgs.size(), 11u);  // 5 x (user, assistant) + the question
      EXPECT_EQ(msgs[1]["role"], "assistant");
      std::string last = msgs.back()["content"];
      std::string q = last.substr(10, last.rfind("\nAnswer:") - 10);
      auto it = answers_.find(q);
      std::string reply = it != answers_.end() && it->second.second ? it->second.first : "no idea";
      std::string sse;
      for (const std::string& part : {reply.substr(0, 5), reply.substr(5)}) {
        nlohmann::json chunk{{"choices", {{{"index", 0}, {"delta", {{"content", part}}}}}}};
        sse += "data: " + chunk.dump() + "\n\n";
      }
      res.set_content(sse + "data: [DONE]\n\n", "text/event-stream");
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    th_ = std::thread([this] { svr_.listen_after_bind(); });
    while (!svr_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeGsm8kServer() {
    svr_.stop();
    th_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::map<std::string, std::pair<std::string, bool>> answers_;
  httplib::Server svr_;
  std::thread th_;
  int port_ = 0;
  std::mutex mu_;
  std::map<std::string, int> seen_;
};

TEST(Gsm8kRun, ScoresAgainstALoopbackServer) {
  const std::string dir = SIEVE_SOURCE_DIR "/data/gsm8k";
  auto test = load_gsm8k(dir + "/test.jsonl");
  ASSERT_EQ(test.size(), 1319u);
  ASSERT_EQ(load_gsm8k(dir + "/train.jsonl").size(), 7473u);
  FakeGsm8kServer s(test, 30);
  Gsm8kOptions o;
  o.base_url = s.url();
  o.model = "fake";
  o.data_dir = dir;
  o.limit = 40;
  o.num_concurrent = 4;
  o.output_path = ::testing::TempDir() + "/gsm8k_samples.jsonl";
  std::ostringstream out;
  Gsm8kResult r = run_gsm8k(o, nullptr, out);
  EXPECT_EQ(r.failed_requests, 0);  // the 503s were retried
  EXPECT_EQ(r.flexible.n, 40u);
  EXPECT_DOUBLE_EQ(r.flexible.value, 0.75);
  EXPECT_DOUBLE_EQ(r.strict.value, 0.75);
  EXPECT_NEAR(r.strict.stderr_, std::sqrt(0.75 * 0.25 * 40 / 39) / std::sqrt(40.0), 1e-12);
  EXPECT_NE(out.str().find("|gsm8k|      3|flexible-extract|     5|exact_match|↑  |0.7500|±  |"),
            std::string::npos)
      << out.str();
  EXPECT_EQ(r.responses[0].find("Question:"), std::string::npos);  // cut at the stop string
  std::ifstream f(o.output_path);
  int lines = 0;
  std::string l;
  while (std::getline(f, l)) ++lines;
  EXPECT_EQ(lines, 40);
}

TEST(Gsm8kRun, ChatEndpoint) {
  const std::string dir = SIEVE_SOURCE_DIR "/data/gsm8k";
  auto test = load_gsm8k(dir + "/test.jsonl");
  FakeGsm8kServer s(test, 6);
  Gsm8kOptions o;
  o.base_url = s.url();
  o.model = "fake";
  o.data_dir = dir;
  o.limit = 8;
  o.chat = true;
  o.num_concurrent = 3;
  std::ostringstream out;
  Gsm8kResult r = run_gsm8k(o, nullptr, out);
  EXPECT_DOUBLE_EQ(r.flexible.value, 0.75);
  EXPECT_DOUBLE_EQ(r.strict.value, 0.75);
  EXPECT_EQ(r.responses[0], test[0].answer);  // deltas joined
  EXPECT_NE(out.str().find("local-chat-completions"), std::string::npos);
}

TEST(Gsm8kRun, FailedRequestsCountAsWrong) {
  // A port nobody listens on: bound, read back, closed.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  Gsm8kOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(port);
  o.model = "m";
  o.data_dir = SIEVE_SOURCE_DIR "/data/gsm8k";
  o.limit = 3;
  o.retries = 0;
  o.client.connect_timeout_s = 1;
  o.client.read_timeout_s = 2;
  std::ostringstream out;
  Gsm8kResult r = run_gsm8k(o, nullptr, out);
  EXPECT_EQ(r.failed_requests, 3);
  EXPECT_EQ(r.flexible.value, 0.0);
  EXPECT_NE(out.str().find("requests failed"), std::string::npos);
}

}  // namespace
}  // namespace sieve::eval
