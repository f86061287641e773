// The `sieve` binary end to end: `sieve bench serve` parsing and printing against the in-test
// fake server, and against the real `sieve serve` on a tiny model when that command exists.
// Each test skips, saying why, when the binary or a command it needs is not built.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "bench/http_client.h"
#include "bench/serve.h"
#include "fake_openai_server.h"
#include "sieve_cli_util.h"

namespace sieve::bench {
namespace {

const std::string kSieve = SIEVE_BINARY_DIR "/sieve";

// `sieve ARGS`: stdout and stderr; its exit status in *rc.
std::string run_capture(const std::string& args, int* rc = nullptr) {
  sieve::testing::CliResult r = sieve::testing::run_sieve(args, true);
  if (rc) *rc = r.rc;
  return r.out;
}

// `sieve --help` lists commands as "  NAME  summary".
bool has_command(const std::string& name) {
  if (!std::filesystem::exists(kSieve)) return false;
  std::string help = run_capture("--help");
  return std::regex_search(help, std::regex("\n  " + name + " +"));
}

std::string block_line(const std::string& text, const std::string& label) {
  auto at = text.find("Serving Benchmark Result");
  if (at == std::string::npos) return "";
  std::istringstream in(text.substr(at));
  std::string l;
  while (std::getline(in, l))
    if (l.rfind(label, 0) == 0) return l;
  return "";
}

std::string int_line(const std::string& label, long long v) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %-10lld", label.c_str(), v);
  return buf;
}

TEST(BenchCli, ServeCommandAgainstFakeServer) {
  if (!has_command("bench serve")) GTEST_SKIP() << kSieve << " with `bench serve` is not built";
  testing::FakeOpenAIServer s;
  s.tokens_per_chunk = 2;
  std::string dir = ::testing::TempDir() + "/bench_cli_results";
  std::filesystem::remove_all(dir);
  int rc = -1;
  std::string out = run_capture(
      "bench serve --base-url " + s.base_url() +
          " --num-prompts 6 --random-input-len 10 --random-output-len 6"
          " --max-concurrency 2 --request-rate 50 --percentile-metrics ttft,tpot,itl,e2el"
          " --metric-percentiles 50,99 --goodput ttft:60000 tpot:60000 --save-result"
          " --save-detailed --result-dir " +
          dir + " --result-filename r.json",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(block_line(out, "Successful requests:"), int_line("Successful requests:", 6)) << out;
  EXPECT_EQ(block_line(out, "Total input tokens:"), int_line("Total input tokens:", 60));
  EXPECT_EQ(block_line(out, "Total generated tokens:"), int_line("Total generated tokens:", 36));
  EXPECT_EQ(block_line(out, "Request rate configured (RPS):"),
            "Request rate configured (RPS):           50.00     ");
  EXPECT_EQ(block_line(out, "Request goodput (req/s):"),
            block_line(out, "Request goodput (req/s):").substr(0, 41) +
                block_line(out, "Request throughput (req/s):").substr(41));
  EXPECT_NE(block_line(out, "P50 E2EL (ms):"), "");
  EXPECT_NE(block_line(out, "P99 ITL (ms):"), "");
  EXPECT_NE(out.find("==================================================\n"), std::string::npos);
  std::ifstream f(dir + "/r.json");
  ASSERT_TRUE(f.good());
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["total_input_tokens"], 60);
  EXPECT_EQ(j["total_output_tokens"], 36);
  EXPECT_EQ(j["request_rate"], 50.0);
  EXPECT_EQ(j["itls"][0].size(), 2u);  // 6 tokens in 3 chunks
  EXPECT_TRUE(j.contains("p50_e2el_ms"));
  EXPECT_FALSE(j["request_goodput"].is_null());

  // User errors exit 2 with a message naming the option.
  out =
      run_capture("bench serve --base-url " + s.base_url() + " --dataset-name nope", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("--dataset-name"), std::string::npos) << out;
}

TEST(BenchCli, CtrlCPrintsTheResultsSoFar) {
  if (!has_command("bench serve")) GTEST_SKIP() << kSieve << " with `bench serve` is not built";
  testing::FakeOpenAIServer s;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    std::string url = s.base_url();
    execl(kSieve.c_str(), kSieve.c_str(), "bench", "serve", "--base-url", url.c_str(),
          "--num-prompts", "200", "--request-rate", "10", "--random-input-len", "8",
          "--random-output-len", "4", (char*)nullptr);
    _exit(127);
  }
  close(fds[1]);
  // Interrupt once a few requests have reached the server (not after a fixed time: a loaded
  // machine may take longer to start the client), leaving them time to finish.
  for (int i = 0; i < 3000 && s.bodies().size() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGINT);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << out;
  EXPECT_EQ(WEXITSTATUS(st), 130) << out;
  EXPECT_NE(out.find("Interrupted"), std::string::npos) << out;
  std::string ok = block_line(out, "Successful requests:");
  ASSERT_NE(ok, "") << out;
  int done = std::stoi(ok.substr(41));
  EXPECT_GT(done, 0);
  EXPECT_LT(done, 200);
  EXPECT_NE(out.find("=================================================="), std::string::npos);
}

// Starts `sieve serve` on the bundled model and benchmarks it with token-id prompts: every count
// in the block and the JSON is known exactly.
TEST(BenchRealServer, BundledModelOverLoopback) {
  if (!std::filesystem::exists(kSieve)) GTEST_SKIP() << kSieve << " is not built";
  if (!has_command("serve"))
    GTEST_SKIP() << "`sieve --help` lists no `serve` command: this build has no server "
                    "(cpp-httplib or pcre2 missing)";
  std::string model = std::string(SIEVE_SOURCE_DIR) + "/models/minimax-m3-tiny";
  ASSERT_TRUE(std::filesystem::exists(model + "/config.json")) << "bundled model missing: " << model;
  int vocab = 0;
  {
    std::ifstream cf(model + "/config.json");
    auto cfg = nlohmann::json::parse(cf, nullptr, false);
    ASSERT_FALSE(cfg.is_discarded());
    vocab = cfg.contains("text_config") ? cfg["text_config"]["vocab_size"].get<int>()
                                        : cfg["vocab_size"].get<int>();
  }
  ASSERT_GT(vocab, 0);
  // A free port: bind to 0, read it back, release it for the server.
  int port;
  {
    testing::FakeOpenAIServer probe;
    port = probe.port();
  }
  std::string log = ::testing::TempDir() + "/bench_real_server.log";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FILE* lf = std::fopen(log.c_str(), "w");
    if (lf) {
      dup2(fileno(lf), 1);
      dup2(fileno(lf), 2);
    }
    std::string p = std::to_string(port);
    execl(kSieve.c_str(), kSieve.c_str(), "serve", "--device", "cpu", "--model", model.c_str(), "--port",
          p.c_str(), (char*)nullptr);
    _exit(127);
  }
  struct Killer {
    pid_t pid;
    ~Killer() {
      kill(pid, SIGTERM);
      for (int i = 0; i < 50; ++i) {
        if (waitpid(pid, nullptr, WNOHANG) == pid) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } killer{pid};
  std::string url = "http://127.0.0.1:" + std::to_string(port);
  bool up = false;
  for (int i = 0; i < 600 && !up; ++i) {  // up to 60 s to load
    try {
      ClientOptions co;
      co.connect_timeout_s = 1;
      co.read_timeout_s = 5;
      HttpSession s(url, co);
      up = s.get("/v1/models").status == 200;
    } catch (const std::exception&) {
    }
    if (!up) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (!up) {
    std::ifstream lf(log);
    std::stringstream ls;
    ls << lf.rdbuf();
    FAIL() << "sieve serve did not answer /v1/models on " << url << "; its log:\n" << ls.str();
  }

  ServeOptions o;
  o.base_url = url;
  o.random_input_len = 16;
  o.random_output_len = 8;
  o.random_vocab_size = std::min(vocab, 256);
  o.num_prompts = 8;
  o.max_concurrency = 4;
  o.save_detailed = true;
  o.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  o.client.read_timeout_s = 120;
  std::ostringstream text;
  ServeOutcome r = run_serve(o, nullptr, text);
  std::string t = text.str();
  EXPECT_EQ(block_line(t, "Successful requests:"), int_line("Successful requests:", 8)) << t;
  EXPECT_EQ(block_line(t, "Failed requests:"), int_line("Failed requests:", 0)) << t;
  EXPECT_EQ(block_line(t, "Total input tokens:"), int_line("Total input tokens:", 8 * 16));
  EXPECT_EQ(block_line(t, "Total generated tokens:"), int_line("Total generated tokens:", 8 * 8));
  EXPECT_EQ(r.result["completed"], 8);
  EXPECT_EQ(r.result["failed"], 0);
  EXPECT_EQ(r.result["total_input_tokens"], 128);
  EXPECT_EQ(r.result["total_output_tokens"], 64);  // ignore_eos: every request runs to 8 tokens
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(r.result["output_lens"][i], 8);
    EXPECT_EQ(r.result["input_lens"][i], 16);
    EXPECT_GE(r.result["latencies"][i].get<double>(), r.result["ttfts"][i].get<double>());
  }
  EXPECT_LE(r.result["max_concurrent_requests"].get<int>(), 4);
}

}  // namespace
}  // namespace sieve::bench
