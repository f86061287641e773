// Subcommands of `sieve`. Each lives in src/cli/<area>_<name>.cpp and registers itself:
//
//   static sieve::cli::Register reg{"generate", "generate tokens from a prompt", &run_generate};
//
// `Args` parses `--key value`, `--key=value` and bare flags; a key may have aliases
// (`--kv-cache-dtype` / `--kv_cache_dtype`). Unknown or missing-value options are user errors.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sieve::cli {

class Args {
 public:
  Args(std::string command, std::vector<std::string> argv);

  // Declare options before reading them. `names` are the spellings (first is canonical, shown in
  // help); `value_name` empty means a flag without a value.
  Args& opt(std::vector<std::string> names, std::string value_name, std::string help,
            std::string default_value = "");
  Args& flag(std::vector<std::string> names, std::string help);

  // Parses argv against the declared options; throws Error on unknown options, and prints help
  // and returns false when --help was given.
  bool parse();

  bool has(const std::string& name) const;  // given on the command line
  std::string get(const std::string& name) const;  // value or declared default
  std::optional<std::string> maybe(const std::string& name) const;
  long long get_int(const std::string& name) const;
  double get_double(const std::string& name) const;
  bool get_flag(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  std::string help() const;

 private:
  struct Opt {
    std::vector<std::string> names;
    std::string value_name, help, def;
    bool is_flag = false;
  };
  const Opt* find(const std::string& spelled) const;
  const Opt& declared(const std::string& name) const;
  std::string command_;
  std::vector<std::string> argv_;
  std::vector<Opt> opts_;
  std::map<std::string, std::string> values_;  // canonical name -> value ("1" for flags)
  std::vector<std::string> positional_;
};

// --tune FIELD=VALUE,...: changes the CUDA kernels' tuning fields (kernels/cuda/tuning.h) for this
// process, e.g. to A/B a knob in `bench kernels` or `bench step`; Error naming a bad item. Only in
// builds with the CUDA backend (kernels_bench.cpp).
void apply_tune_flag(const std::string& value);

// The value of a --device option: `auto` (the first GPU when the build and the machine have one,
// else the CPU), `cpu`, `cuda` or `cuda:N`. A GPU the machine lacks is a user error.
Device parse_device(const std::string& value, const std::string& flag = "--device");

using CommandFn = std::function<int(const std::vector<std::string>& argv)>;

struct Register {
  Register(std::string name, std::string summary, CommandFn fn);
};

struct CommandInfo {
  std::string name, summary;
  CommandFn fn;
};
std::map<std::string, CommandInfo>& commands();

}  // namespace sieve::cli
