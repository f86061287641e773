#include "cli/model_load_flags.h"

#include <chrono>
#include <memory>

#include "core/error.h"
#include "core/progress.h"

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
    clock::time_point start = clock::now();
    std::unique_ptr<Progress> bar;
  };
  auto st = std::make_shared<State>();
  return [st, what](uint64_t done, uint64_t total) {
    if (!st->bar) {
      // Loads that take under a second show nothing.
      if (done >= total || std::chrono::duration<double>(clock::now() - st->start).count() < 1.0) return;
      st->bar = std::make_unique<Progress>(ProgressOptions{.label = what, .total = total, .bytes = true});
    }
    st->bar->set(done);
    if (done >= total) st->bar->finish();
  };
}

}  // namespace sieve::cli
