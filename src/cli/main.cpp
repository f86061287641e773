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
  if (argc >= 2 && std::string(argv[1]) == "--version") {
    std::printf("sieve %s\n", SIEVE_VERSION);
    return 0;
  }
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
    // A group word alone ("sieve bench"): list its commands.
    std::vector<std::string> group;
    for (const auto& [n, info] : cmds)
      if (n.rfind(name + " ", 0) == 0) group.push_back(n);
    if (!group.empty()) {
      std::fprintf(stderr, "error: \"%s\" needs a subcommand:\n", name.c_str());
      for (const auto& g : group) std::fprintf(stderr, "  sieve %-18s %s\n", g.c_str(), cmds[g].summary.c_str());
      return 2;
    }
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
