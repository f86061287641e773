#include "cli/command.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "kernels/memory.h"

namespace sieve::cli {

std::map<std::string, CommandInfo>& commands() {
  static std::map<std::string, CommandInfo> m;
  return m;
}

Register::Register(std::string name, std::string summary, CommandFn fn) {
  commands()[name] = CommandInfo{name, std::move(summary), std::move(fn)};
}

Args::Args(std::string command, std::vector<std::string> argv)
    : command_(std::move(command)), argv_(std::move(argv)) {}

Args& Args::opt(std::vector<std::string> names, std::string value_name, std::string help,
                std::string def) {
  opts_.push_back(Opt{std::move(names), std::move(value_name), std::move(help), std::move(def)});
  return *this;
}

Args& Args::flag(std::vector<std::string> names, std::string help) {
  Opt o{std::move(names), "", std::move(help), ""};
  o.is_flag = true;
  opts_.push_back(std::move(o));
  return *this;
}

const Args::Opt* Args::find(const std::string& spelled) const {
  for (const auto& o : opts_)
    for (const auto& n : o.names)
      if (n == spelled) return &o;
  return nullptr;
}

const Args::Opt& Args::declared(const std::string& name) const {
  const Opt* o = find(name);
  SIEVE_CHECK(o != nullptr, "option " + name + " was not declared");
  return *o;
}

bool Args::parse() {
  for (size_t i = 0; i < argv_.size(); ++i) {
    std::string a = argv_[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit((unsigned char)a[1]) || a[1] == '.'))) {
      std::string key = a, value;
      bool has_value = false;
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        key = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_value = true;
      }
      const Opt* o = find(key);
      if (!o) throw Error("sieve " + command_ + ": unknown option " + key + " (see --help)");
      if (o->is_flag) {
        if (has_value && value != "true" && value != "1" && value != "false" && value != "0")
          throw Error("sieve " + command_ + ": " + key + " takes no value");
        values_[o->names[0]] = (has_value && (value == "false" || value == "0")) ? "0" : "1";
        continue;
      }
      if (!has_value) {
        if (i + 1 >= argv_.size())
          throw Error("sieve " + command_ + ": " + key + " needs a value (" + o->value_name + ")");
        value = argv_[++i];
      }
      values_[o->names[0]] = value;
    } else {
      positional_.push_back(a);
    }
  }
  return true;
}

bool Args::has(const std::string& name) const { return values_.count(declared(name).names[0]) > 0; }

std::string Args::get(const std::string& name) const {
  const Opt& o = declared(name);
  auto it = values_.find(o.names[0]);
  return it == values_.end() ? o.def : it->second;
}

std::optional<std::string> Args::maybe(const std::string& name) const {
  const Opt& o = declared(name);
  auto it = values_.find(o.names[0]);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

long long Args::get_int(const std::string& name) const {
  std::string v = get(name);
  try {
    size_t pos = 0;
    long long r = std::stoll(v, &pos);
    if (pos != v.size()) throw std::invalid_argument("trailing");
    return r;
  } catch (const std::exception&) {
    throw Error("sieve " + command_ + ": " + declared(name).names[0] + " expects an integer, got \"" +
                v + "\"");
  }
}

double Args::get_double(const std::string& name) const {
  std::string v = get(name);
  try {
    size_t pos = 0;
    double r = std::stod(v, &pos);
    if (pos != v.size()) throw std::invalid_argument("trailing");
    return r;
  } catch (const std::exception&) {
    throw Error("sieve " + command_ + ": " + declared(name).names[0] + " expects a number, got \"" +
                v + "\"");
  }
}

bool Args::get_flag(const std::string& name) const { return get(name) == "1"; }

std::string Args::help() const {
  std::string s = "usage: sieve " + command_ + " [options]\n\noptions:\n";
  for (const auto& o : opts_) {
    std::string names;
    for (size_t i = 0; i < o.names.size(); ++i) names += (i ? ", " : "") + o.names[i];
    if (!o.is_flag) names += " " + o.value_name;
    s += "  " + names;
    if (names.size() < 34) s += std::string(34 - names.size(), ' ');
    else s += "\n" + std::string(36, ' ');
    s += o.help;
    if (!o.def.empty()) s += " (default: " + o.def + ")";
    s += "\n";
  }
  return s;
}

Device parse_device(const std::string& value, const std::string& flag) {
  auto fail = [&](const std::string& why) {
    std::string msg = flag;
    msg.append(" ").append(value).append(": ").append(why);
    throw Error(msg);
  };
  Device d;
  if (value == "cpu" || (value == "auto" && cuda_device_count() == 0)) return d;
  if (value != "auto" && value != "cuda" && value.rfind("cuda:", 0) != 0)
    fail("expected auto, cpu, cuda or cuda:N");
  d.kind = DeviceKind::CUDA;
  if (value.rfind("cuda:", 0) == 0) {
    const std::string n = value.substr(5);
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos)
      fail("N in cuda:N must be a device number");
    d.index = std::atoi(n.c_str());
  }
  const int count = cuda_device_count();
  if (count == 0) fail("no CUDA device in this build or machine");
  if (d.index >= count) {
    std::string why = "this machine has ";
    why.append(std::to_string(count)).append(" CUDA device(s)");
    fail(why);
  }
  return d;
}

}  // namespace sieve::cli
