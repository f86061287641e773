#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"

namespace {
void usage() {
  std::printf("sieve: a serving engine for MiniMax-M3-family models\n\nusage: sieve COMMAND [options]\n\ncommands:\n");
  for (const auto& [name, info] : sieve::cli::commands())
    std::printf("  %-18s %s\n", name.c_str(), info.summary.c_str());
  std::printf("\n`sieve COMMAND --help` lists a command's options.\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  // Two-word commands ("bench kernels", "eval gsm8k") are registered as "bench kernels".
  auto& cmds = sieve::cli::commands();
  if (!rest.empty() && cmds.count(name + " " + rest[0])) {
    name += " " + rest[0];
    rest.erase(rest.begin());
  }
  auto it = cmds.find(name);
  if (it == cmds.end()) {
    std::fprintf(stderr, "error: unknown command \"%s\"\n\n", name.c_str());
    usage();
    return 2;
  }
  try {
    return it->second.fn(rest);
  } catch (const sieve::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
