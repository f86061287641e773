// The model commands of the `sieve` binary (generate, serve): where they run (--device) and what
// they refuse.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/memory.h"
#include "sieve_cli_util.h"

namespace sieve {
namespace {

// stderr too: the errors are what these tests read.
testing::CliResult run_sieve(const std::string& args) { return testing::run_sieve(args, true); }

const char* kGenerate = "generate --prompt-ids 5,6,7,8 --max-tokens 3 --json";

TEST(ModelCli, GenerateOnTheCpu) {
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cpu");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\"token_ids\""), std::string::npos) << r.out;
}

TEST(ModelCli, BadDeviceValuesAreUserErrors) {
  for (const char* bad : {"gpu", "cuda:x", "cuda:", "cuda:99999"}) {
    testing::CliResult r = run_sieve(std::string(kGenerate) + " --device " + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--device"), std::string::npos) << bad << ": " << r.out;
  }
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cuda:64");
  EXPECT_EQ(r.rc, 2) << r.out;
  if (cuda_device_count() == 0) {
    testing::CliResult c = run_sieve(std::string(kGenerate) + " --device cuda");
    EXPECT_EQ(c.rc, 2) << c.out;
    EXPECT_NE(c.out.find("no CUDA device"), std::string::npos) << c.out;
  }
}

// vLLM's serving flags that Sieve takes: a wrong value is refused at start, before the weights
// load, with a message that names the flag.
TEST(ModelCli, ServeFlagErrorsNameTheFlag) {
#ifndef SIEVE_TEST_HAVE_SERVER
  GTEST_SKIP() << "this build has no server (cpp-httplib or pcre2 missing)";
#endif
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--dtype float16", "--dtype float16 is not supported"},
           {"--max-logprobs -1", "--max-logprobs"},
           {"--seed -3", "--seed"},
           {"--generation-config /no/such/dir", "--generation-config /no/such/dir: no generation_config.json"},
           {"--override-generation-config '{\"top_p\": 0}'", "--override-generation-config top_p"},
           {"--override-generation-config 'nope'", "--override-generation-config: not valid JSON"},
           {"--chat-template /no/such.jinja", "--chat-template"},
           {"--enable-auto-tool-choice", "--enable-auto-tool-choice needs --tool-call-parser"},
           {"--enable-auto-tool-choice --tool-call-parser hermes", "--tool-call-parser hermes is unknown"},
           {"--reasoning-parser nope", "--reasoning-parser nope is unknown"}}) {
    testing::CliResult r = run_sieve("serve --device cpu --port 0 " + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
  }
}

TEST(ModelCli, Fp32CacheOnCudaIsRefused) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cuda --kv-cache-dtype fp32");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("fp32 caches"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace sieve
