// Runs the built `sieve` binary from a test (SIEVE_BINARY_DIR/sieve; build sieve first).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace sieve::testing {

struct CliResult {
  int rc;           // exit status, -1 when it did not exit normally
  std::string out;  // stdout (and stderr when asked)
};

// Runs `sieve ARGS`, capturing stdout (stderr too when `with_stderr`).
inline CliResult run_sieve(const std::string& args, bool with_stderr = false) {
  const std::string bin = std::string(SIEVE_BINARY_DIR) + "/sieve";
  if (!std::filesystem::exists(bin)) throw std::runtime_error(bin + " is missing (build sieve)");
  const std::string cmd = bin + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace sieve::testing
