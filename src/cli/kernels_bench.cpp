// `sieve bench kernels`: times the CUDA kernels against measured memory/matrix floors and prints
// a table; --json writes every row, --md a Markdown table (scripts/gpu-check uses both).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#ifdef SIEVE_HAVE_CUDA
#include "kernels/bench/bench.h"
#include "kernels/cuda/tuning.h"
#include "kernels/memory.h"
#endif

#ifdef SIEVE_HAVE_CUDA
namespace sieve::cli {
void apply_tune_flag(const std::string& value) {
  cuda::Tuning t = cuda::tuning();
  std::stringstream items(value);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw Error("--tune: \"" + item + "\" is not FIELD=VALUE");
    cuda::set_tuning_field(t, item.substr(0, eq), item.substr(eq + 1));
  }
  cuda::set_tuning(t);
  std::fprintf(stderr, "tuning changed: %s\n", value.c_str());
}
}  // namespace sieve::cli
#endif

namespace {

#ifdef SIEVE_HAVE_CUDA
std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

std::string fmt(double v, int prec = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

std::string verdict(const sieve::kernels_bench::Row& r) {
  if (r.target_us <= 0) return "";
  return r.us <= r.target_us ? "meets" : "misses";
}
#endif

int run_bench_kernels(const std::vector<std::string>& argv) {
  sieve::cli::Args args("bench kernels", argv);
  args.opt({"--json"}, "PATH", "write all rows as JSON")
      .opt({"--md"}, "PATH", "write a Markdown table")
      .opt({"--iters"}, "N", "timed runs per row (median; at least 50)", "100")
      .opt({"--filter"}, "TEXT", "only cases whose \"phase shape dtype\" contains TEXT")
      .opt({"--rows"}, "TEXT", "only rows whose kernel name contains TEXT (e.g. \"dense\"; for traces and profilers)")
      .opt({"--tune"}, "FIELD=VALUE,...",
           "time the kernels with these tuning fields changed (e.g. indexer.trace=1,indexer.persistent_unit=4; "
           "\"list\" prints every field with its default; docs/kernels.md)");
  if (!args.parse()) return 0;
#ifndef SIEVE_HAVE_CUDA
  throw sieve::Error("bench kernels: this build has no CUDA backend");
#else
  if (auto tune = args.maybe("--tune")) {
    if (*tune == "list") {
      for (const auto& f : sieve::cuda::tuning_field_names()) std::printf("%s\n", f.c_str());
      return 0;
    }
    sieve::cli::apply_tune_flag(*tune);
  }
  if (sieve::cuda_device_count() == 0) throw sieve::Error("bench kernels: no CUDA device");
  namespace kb = sieve::kernels_bench;
  kb::Options opt;
  opt.iters = int(args.get_int("--iters"));
  opt.filter = args.get("--filter");
  opt.rows = args.get("--rows");
  const kb::Env env = kb::measure_env();
  std::printf("GPU %s, %d SMs, L2 %.0f MB; copy %.0f GB/s (read+write); bf16 matrix %.0f TFLOP/s (%s)\n",
              env.gpu.c_str(), env.sms, env.l2_mb, env.copy_gbps, env.bf16_tflops, env.matrix_source.c_str());
  std::printf("%-42s %-22s %-5s %-27s %10s %10s %7s %9s %s\n", "kernel", "shape", "dtype", "mode", "us",
              "floor us", "ratio", "target", "");
  std::vector<kb::Row> rows;
  kb::run_all(opt, env, [&](const kb::Row& r) {
    rows.push_back(r);
    std::printf("%-42s %-22s %-5s %-27s %10.2f %10.2f %7.2f %9s %s\n", r.kernel.c_str(), r.shape.c_str(),
                r.dtype.c_str(), r.mode.c_str(), r.us, r.floor_us, (r.floor_us > 0 ? r.us / r.floor_us : 0.0),
                r.target_us > 0 ? fmt(r.target_us).c_str() : "", verdict(r).c_str());
    std::fflush(stdout);
  });
  // A filter that names no case still times the empty kernel; say so rather than print a table
  // of nothing (--filter takes a case's phase, shape and dtype, not a row's kernel name).
  const bool any = std::any_of(rows.begin(), rows.end(), [](const kb::Row& r) { return r.kernel != kb::kEmptyKernel; });
  if (!any && (!opt.filter.empty() || !opt.rows.empty()))
    throw sieve::Error("bench kernels: no row matched --filter \"" + opt.filter + "\" --rows \"" + opt.rows +
                       "\" (--filter takes a case's \"phase shape dtype\", e.g. \"decode b32 ctx9216 fp8\" or "
                       "\"moe fp8 8192 tokens\"; --rows a kernel name, e.g. \"dense decode attention\")");
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  if (auto path = args.maybe("--json")) {
    std::ofstream f(*path);
    if (!f) throw sieve::Error("bench kernels: cannot write " + *path);
    f << "{\n  \"date\": \"" << date << "\",\n  \"gpu\": \"" << json_escape(env.gpu) << "\",\n  \"sms\": " << env.sms
      << ",\n  \"copy_gbps\": " << env.copy_gbps << ",\n  \"bf16_tflops\": " << env.bf16_tflops
      << ",\n  \"matrix_source\": \"" << json_escape(env.matrix_source) << "\",\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      f << "    {\"kernel\": \"" << json_escape(r.kernel) << "\", \"shape\": \"" << r.shape << "\", \"dtype\": \""
        << r.dtype << "\", \"mode\": \"" << r.mode << "\", \"us\": " << r.us << ", \"floor_us\": " << r.floor_us
        << ", \"floor_kind\": \"" << r.floor_kind << "\", \"ratio\": " << (r.floor_us > 0 ? r.us / r.floor_us : 0.0)
        << ", \"target_us\": " << r.target_us << ", \"target_note\": \"" << r.target_note
        << "\", \"runs\": " << r.runs << ", \"input_sets\": " << r.input_sets << "}"
        << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
  }
  if (auto path = args.maybe("--md")) {
    std::ofstream f(*path);
    if (!f) throw sieve::Error("bench kernels: cannot write " + *path);
    f << "GPU: " << env.gpu << " (" << env.sms << " SMs). Date: " << date << ". Copy bandwidth measured: "
      << fmt(env.copy_gbps, 0) << " GB/s (read + write, 2 GiB device-to-device); bf16 matrix rate: "
      << fmt(env.bf16_tflops, 0) << " TFLOP/s (" << env.matrix_source << "). Median of " << opt.iters
      << " runs after warm-up, inputs rotated over sets totalling > 4x L2.\n\n";
    f << "| kernel | shape | dtype | mode | time (us) | floor (us) | floor from | ratio | target (us) | |\n";
    f << "|---|---|---|---|---:|---:|---|---:|---:|---|\n";
    for (const auto& r : rows)
      f << "| " << r.kernel << " | " << r.shape << " | " << r.dtype << " | " << r.mode << " | " << fmt(r.us) << " | "
        << fmt(r.floor_us) << " | " << r.floor_kind << " | " << (r.floor_us > 0 ? fmt(r.us / r.floor_us) : std::string("-")) << " | "
        << (r.target_us > 0 ? fmt(r.target_us) + " (" + r.target_note + ")" : "") << " | " << verdict(r) << " |\n";
  }
  return 0;
#endif
}

sieve::cli::Register reg{"bench kernels", "time the CUDA kernels against measured floors", &run_bench_kernels};

}  // namespace
