// `sieve bench plot`: TPOT, TTFT and throughput against concurrency (or latency against
// throughput) from saved benchmark results, as SVG or PNG.
#include <fstream>
#include <iostream>

#include "bench/plot.h"
#include "cli/command.h"
#include "core/error.h"

namespace {

int run_bench_plot(const std::vector<std::string>& argv) {
  sieve::cli::Args a("bench plot", argv);
  a.opt({"--out", "-o"}, "FILE", "output picture: .svg or .png", "bench.svg")
      .opt({"--stat"}, "STAT", "which TPOT/TTFT statistic: mean, median or pNN", "mean")
      .opt({"--group-by"}, "KEY",
           "one curve per label (label, else backend + model), model or file", "label")
      .opt({"--x"}, "AXIS",
           "concurrency (TPOT, TTFT and throughput against it) or throughput (TPOT and TTFT against it)",
           "concurrency")
      .opt({"--title"}, "TEXT", "title of the picture");
  if (!a.parse()) return 0;
  if (a.positional().empty())
    throw sieve::Error(
        "sieve bench plot: give result files (RESULT.json ...) from `sieve bench serve "
        "--save-result`");
  std::string out = a.get("--out");
  std::string ext = out.size() >= 4 ? out.substr(out.size() - 4) : "";
  if (ext != ".svg" && ext != ".png")
    throw sieve::Error("sieve bench plot: --out " + out + ": name the picture *.svg or *.png");
  std::vector<std::pair<std::string, nlohmann::json>> files;
  for (const auto& p : a.positional()) {
    std::ifstream f(p);
    if (!f) throw sieve::Error("cannot open result file " + p);
    auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded()) throw sieve::Error(p + ": not JSON");
    files.emplace_back(p, std::move(j));
  }
  sieve::bench::PlotOptions o;
  o.stat = a.get("--stat");
  o.group_by = a.get("--group-by");
  o.title = a.get("--title");
  o.x_axis = a.get("--x");
  auto series = sieve::bench::series_from_results(files, o);
  std::ofstream f(out, std::ios::binary);
  if (!f) throw sieve::Error("cannot write " + out);
  if (ext == ".png") {
    auto png = sieve::bench::render_png(series, o);
    f.write(reinterpret_cast<const char*>(png.data()), std::streamsize(png.size()));
  } else {
    f << sieve::bench::render_svg(series, o);
  }
  size_t points = 0;
  for (const auto& s : series) points += s.points.size();
  std::cout << "wrote " << out << ": " << series.size() << " curve(s), " << points << " point(s)\n";
  return 0;
}

sieve::cli::Register reg{"bench plot",
                         "draw TPOT, TTFT and throughput against concurrency from result JSONs (SVG/PNG)",
                         &run_bench_plot};

}  // namespace
