// The model commands of the `sieve` binary: where they run (--device) and what they refuse.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "kernels/memory.h"

namespace sieve {
namespace {

struct Result {
  int rc;
  std::string out;  // stdout and stderr
};

Result run_sieve(const std::string& args) {
  const std::string bin = std::string(SIEVE_BINARY_DIR) + "/sieve";
  if (!std::filesystem::exists(bin)) throw std::runtime_error(bin + " is missing (build sieve)");
  FILE* p = popen((bin + " " + args + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const char* kGenerate = "generate --prompt-ids 5,6,7,8 --max-tokens 3 --json";

TEST(ModelCli, GenerateOnTheCpu) {
  Result r = run_sieve(std::string(kGenerate) + " --device cpu");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\"token_ids\""), std::string::npos) << r.out;
}

TEST(ModelCli, BadDeviceValuesAreUserErrors) {
  for (const char* bad : {"gpu", "cuda:x", "cuda:", "cuda:99999"}) {
    Result r = run_sieve(std::string(kGenerate) + " --device " + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--device"), std::string::npos) << bad << ": " << r.out;
  }
  Result r = run_sieve(std::string(kGenerate) + " --device cuda:64");
  EXPECT_EQ(r.rc, 2) << r.out;
  if (cuda_device_count() == 0) {
    Result c = run_sieve(std::string(kGenerate) + " --device cuda");
    EXPECT_EQ(c.rc, 2) << c.out;
    EXPECT_NE(c.out.find("no CUDA device"), std::string::npos) << c.out;
  }
}

TEST(ModelCli, Fp32CacheOnCudaIsRefused) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Result r = run_sieve(std::string(kGenerate) + " --device cuda --kv-cache-dtype fp32");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("fp32 caches"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace sieve
