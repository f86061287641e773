// The model commands of the `sieve` binary: where they run (--device) and what they refuse.
#include <gtest/gtest.h>

#include <string>

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

TEST(ModelCli, Fp32CacheOnCudaIsRefused) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cuda --kv-cache-dtype fp32");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("fp32 caches"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace sieve
