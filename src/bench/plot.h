// `sieve bench plot`: the pictures engines are compared by, one point per result JSON and one
// curve per engine/label: TPOT, TTFT and output throughput against concurrency (side by side),
// or TPOT and TTFT against output throughput. Laid out once as a list of shapes, then written
// as SVG or rasterised to PNG.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sieve::bench {

struct PlotPoint {
  double output_throughput = 0;  // tok/s
  double tpot_ms = 0, ttft_ms = 0;
  int concurrency = -1;      // max_concurrency of the run, -1 when unlimited
  double request_rate = -1;  // -1 for inf
};

struct PlotSeries {
  std::string name;
  std::vector<PlotPoint> points;  // sorted by concurrency, then throughput
};

struct PlotOptions {
  std::string stat = "mean";       // mean, median or pNN: which TPOT/TTFT statistic
  std::string group_by = "label";  // label (label, else backend + model), model, or file
  // concurrency: TPOT, TTFT and throughput against max_concurrency (every run needs one);
  // throughput: TPOT and TTFT against output throughput.
  std::string x_axis = "concurrency";
  std::string title;
};

// `files`: (path, parsed result JSON) pairs as `sieve bench serve --save-result` (or vLLM)
// writes them. Throws Error naming the file when a needed field is missing.
std::vector<PlotSeries> series_from_results(
    const std::vector<std::pair<std::string, nlohmann::json>>& files, const PlotOptions& o);

std::string render_svg(const std::vector<PlotSeries>& series, const PlotOptions& o);

// The same picture as a PNG file's bytes (8-bit RGB; text in a built-in 5x7 bitmap font).
std::vector<uint8_t> render_png(const std::vector<PlotSeries>& series, const PlotOptions& o);

// The rasterised picture: width x height RGB bytes, rows top to bottom.
std::vector<uint8_t> render_rgb(const std::vector<PlotSeries>& series, const PlotOptions& o,
                                int& width, int& height);

// PNG encoding of a W x H RGB buffer (rows top to bottom).
std::vector<uint8_t> encode_png(int width, int height, const std::vector<uint8_t>& rgb);

// Axis ticks at 1, 2 or 5 times a power of ten covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

}  // namespace sieve::bench
