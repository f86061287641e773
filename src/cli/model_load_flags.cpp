#include "cli/model_load_flags.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "core/error.h"

namespace sieve::cli {

void add_model_load_flags(Args& a) {
  a.opt({"--device"}, "DEVICE", "auto (a GPU when there is one and it can run the model), cpu, cuda or cuda:N", "auto")
      .opt({"--hf-overrides"}, "JSON", "JSON object merged over the model config")
      .opt({"--quantization", "-q"}, "METHOD",
           "fp8: quantize a BF16 checkpoint's projections to FP8 at load (128x128 blocks); default: as stored")
      .opt({"--load-format"}, "FORMAT",
           "auto (the directory's safetensors) or dummy (random weights of the config's shapes and formats, "
           "made on the device; no weight file is read)",
           "auto");
}

model::LoadOptions model_load_options(const Args& a) {
  model::LoadOptions lo;
  lo.hf_overrides = a.get("--hf-overrides");
  lo.device = parse_device(a.get("--device"));
  lo.cpu_fallback = a.get("--device") == "auto";
  lo.quantization = a.get("--quantization");
  lo.load_format = a.get("--load-format");
  lo.progress = load_progress_printer("loading weights");
  return lo;
}

std::function<void(uint64_t, uint64_t)> load_progress_printer(const std::string& what) {
  using clock = std::chrono::steady_clock;
  struct State {
    clock::time_point start = clock::now(), last{};
    bool shown = false, finished = false;
    bool tty = ::isatty(STDERR_FILENO) != 0;
  };
  auto st = std::make_shared<State>();
  return [st, what](uint64_t done, uint64_t total) {
    const auto now = clock::now();
    const double secs = std::chrono::duration<double>(now - st->start).count();
    const bool last = done >= total;
    if (st->finished || (secs < 1.0 && !(last && st->shown))) return;
    st->finished = last;
    if (!last && st->shown && now - st->last < (st->tty ? std::chrono::milliseconds(200) : std::chrono::seconds(5)))
      return;
    st->last = now;
    const double gib = double(1ull << 30);
    const double rate = double(done) / std::max(secs, 1e-3);
    const double left = rate > 0 ? double(total > done ? total - done : 0) / rate : 0;
    const double frac = total ? double(done) / double(total) : 1.0;
    char bar[31];
    const int filled = int(frac * 30 + 0.5);
    for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '.';
    bar[30] = 0;
    std::fprintf(stderr, "%s%s [%s] %.2f / %.2f GiB, %.2f GiB/s, %s %.0f s%s", st->tty ? "\r" : "", what.c_str(), bar,
                 double(done) / gib, double(total) / gib, rate / gib, last ? "took" : "ETA", last ? secs : left,
                 st->tty && !last ? "" : "\n");
    std::fflush(stderr);
    st->shown = true;
  };
}

}  // namespace sieve::cli
