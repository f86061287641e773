// `sieve bench plot`: series from result JSONs and the SVG drawn from them.
#include <gtest/gtest.h>

#include <regex>

#include "bench/plot.h"

namespace sieve::bench {
namespace {

nlohmann::json result(const std::string& label, int conc, double tput, double tpot, double ttft) {
  nlohmann::json j{{"label", label},        {"model_id", "m"},           {"max_concurrency", conc},
                   {"request_rate", "inf"}, {"output_throughput", tput}, {"mean_tpot_ms", tpot},
                   {"mean_ttft_ms", ttft},  {"p99_tpot_ms", tpot * 2},   {"p99_ttft_ms", ttft * 3}};
  if (label.empty()) j["label"] = nullptr, j["backend"] = "openai";
  return j;
}

TEST(BenchPlot, Ticks) {
  EXPECT_EQ(nice_ticks(0, 2433), (std::vector<double>{0, 500, 1000, 1500, 2000, 2500}));
  EXPECT_EQ(nice_ticks(0, 8.7), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  auto t = nice_ticks(0, 1);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_NEAR(t[3], 0.6, 1e-12);
  EXPECT_EQ(nice_ticks(3, 3).front(), 3.0);  // an empty range still gets an axis
}

TEST(BenchPlot, SeriesGroupedAndSorted) {
  std::vector<std::pair<std::string, nlohmann::json>> files{
      {"a64.json", result("sieve", 64, 2433, 25.0, 832)},
      {"a4.json", result("sieve", 4, 502, 7.5, 260.8)},
      {"b.json", result("", 32, 1421, 21.4, 565)},
      {"a32.json", result("sieve", 32, 1807, 16.7, 512)}};
  PlotOptions o;
  auto s = series_from_results(files, o);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "sieve");
  EXPECT_EQ(s[1].name, "openai m");
  ASSERT_EQ(s[0].points.size(), 3u);
  EXPECT_EQ(s[0].points[0].concurrency, 4);
  EXPECT_EQ(s[0].points[2].concurrency, 64);
  EXPECT_DOUBLE_EQ(s[0].points[1].tpot_ms, 16.7);
  o.stat = "p99";
  s = series_from_results(files, o);
  EXPECT_DOUBLE_EQ(s[0].points[0].ttft_ms, 260.8 * 3);
  o.stat = "p90";
  EXPECT_THROW(series_from_results(files, o), std::exception);  // not in the results
  o.stat = "mean";
  o.group_by = "file";
  EXPECT_EQ(series_from_results(files, o).size(), 4u);
  EXPECT_THROW(series_from_results({{"x.json", nlohmann::json{{"a", 1}}}}, PlotOptions{}),
               std::exception);

  o.group_by = "label";
  o.x_axis = "throughput";
  std::string svg = render_svg(series_from_results(files, o), o);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  auto count = [&](const std::string& pattern) {
    std::regex re(pattern);
    return std::distance(std::sregex_iterator(svg.begin(), svg.end(), re), std::sregex_iterator());
  };
  EXPECT_EQ(count("<circle class=\"point\""), 8);     // 4 runs in 2 panels
  EXPECT_EQ(count("<polyline class=\"series\""), 2);  // the 3-point curve, once per panel
  EXPECT_NE(svg.find("Mean TPOT (ms)"), std::string::npos);
  EXPECT_NE(svg.find("Mean TTFT (ms)"), std::string::npos);
  EXPECT_NE(svg.find("Output token throughput (tok/s)"), std::string::npos);
  EXPECT_NE(svg.find(">c=32<"), std::string::npos);
  EXPECT_NE(svg.find(">3000<"), std::string::npos);  // 2433 tok/s plus a 5% margin: axis to 3000
}

long count_of(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  return std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator());
}

// The default picture: TPOT, TTFT and throughput against concurrency, one curve per engine in
// each of the three panels, concurrency on a log2 axis with a tick per concurrency that ran.
TEST(BenchPlot, AgainstConcurrencyEnginesSideBySide) {
  std::vector<std::pair<std::string, nlohmann::json>> files{
      {"s1.json", result("sieve", 1, 120, 5.0, 90)},     {"s4.json", result("sieve", 4, 502, 7.5, 260.8)},
      {"s16.json", result("sieve", 16, 1500, 12, 400)},  {"s64.json", result("sieve", 64, 2433, 25.0, 832)},
      {"v4.json", result("vllm", 4, 480, 8.1, 280)},     {"v64.json", result("vllm", 64, 2100, 29.0, 990)},
      {"v16.json", result("vllm", 16, 1400, 13.5, 450)}};
  PlotOptions o;
  EXPECT_EQ(o.x_axis, "concurrency");
  auto s = series_from_results(files, o);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].points[1].concurrency, 16);  // sorted by concurrency
  const std::string svg = render_svg(s, o);
  EXPECT_NE(svg.find("width=\"1500\""), std::string::npos);
  EXPECT_EQ(count_of(svg, "<circle class=\"point\""), 3 * 7);
  EXPECT_EQ(count_of(svg, "<polyline class=\"series\""), 3 * 2);
  EXPECT_EQ(count_of(svg, ">Concurrency \\(requests in flight\\)<"), 3);
  EXPECT_NE(svg.find(">Mean TPOT (ms)<"), std::string::npos);
  EXPECT_NE(svg.find(">Mean TTFT (ms)<"), std::string::npos);
  EXPECT_NE(svg.find(">Output token throughput (tok/s)<"), std::string::npos);
  for (const char* tick : {">1<", ">4<", ">16<", ">64<"}) EXPECT_EQ(count_of(svg, tick), 3) << tick;
  EXPECT_EQ(svg.find(">c=4<"), std::string::npos);  // the axis says it
  EXPECT_NE(svg.find("<title>vllm: 1400 tok/s at concurrency 16, 1400 tok/s</title>"), std::string::npos);
  // log2 spacing: 1, 4, 16, 64 are evenly apart along the x axis.
  std::vector<double> xs;
  std::regex tick_re("<text x=\"([0-9.]+)\" y=\"[0-9.]+\" text-anchor=\"middle\" font-size=\"12\">(1|4|16|64)<");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick_re); it != std::sregex_iterator() && xs.size() < 4; ++it)
    xs.push_back(std::stod((*it)[1]));
  ASSERT_EQ(xs.size(), 4u);
  EXPECT_NEAR(xs[1] - xs[0], xs[2] - xs[1], 0.2);
  EXPECT_NEAR(xs[2] - xs[1], xs[3] - xs[2], 0.2);
  EXPECT_GT(xs[1], xs[0]);

  int w = 0, h = 0;
  auto rgb = render_rgb(s, o, w, h);
  EXPECT_EQ(w, 1500);
  EXPECT_EQ(rgb.size(), size_t(w) * size_t(h) * 3);

  // A run at a request rate has no concurrency to stand on.
  auto rated = files;
  rated[0].second.erase("max_concurrency");
  rated[0].second["request_rate"] = 8;
  EXPECT_THROW(render_svg(series_from_results(rated, o), o), std::exception);
  o.x_axis = "throughput";
  EXPECT_NO_THROW(render_svg(series_from_results(rated, o), o));
  o.x_axis = "latency";
  EXPECT_THROW(render_svg(s, o), std::exception);
}

uint32_t be32(const std::vector<uint8_t>& v, size_t at) {
  return uint32_t(v[at]) << 24 | uint32_t(v[at + 1]) << 16 | uint32_t(v[at + 2]) << 8 | v[at + 3];
}

TEST(BenchPlot, PngFileStructure) {
  std::vector<uint8_t> rgb(3 * 2 * 3, 0);
  auto png = encode_png(3, 2, rgb);
  ASSERT_GT(png.size(), 8u + 25 + 12 + 12);
  EXPECT_EQ(std::vector<uint8_t>(png.begin(), png.begin() + 8),
            (std::vector<uint8_t>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}));
  // Chunks: IHDR (3 x 2, 8-bit RGB), IDAT, IEND; each CRC covers type and data.
  std::vector<std::string> types;
  size_t at = 8;
  while (at + 12 <= png.size()) {
    uint32_t len = be32(png, at);
    std::string type(png.begin() + long(at + 4), png.begin() + long(at + 8));
    types.push_back(type);
    uint32_t crc = 0xffffffffu;
    for (size_t i = at + 4; i < at + 8 + len; ++i) {
      crc ^= png[i];
      for (int k = 0; k < 8; ++k) crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
    }
    EXPECT_EQ(~crc, be32(png, at + 8 + len)) << type;
    if (type == "IHDR") {
      EXPECT_EQ(be32(png, at + 8), 3u);
      EXPECT_EQ(be32(png, at + 12), 2u);
      EXPECT_EQ(png[at + 16], 8);
      EXPECT_EQ(png[at + 17], 2);
    }
    at += 12 + len;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  EXPECT_THROW(encode_png(3, 3, rgb), std::exception);
}

TEST(BenchPlot, RasterDrawsTheCurves) {
  std::vector<std::pair<std::string, nlohmann::json>> files{
      {"a.json", result("x", 4, 500, 7.5, 260)}, {"b.json", result("x", 32, 1800, 16.7, 512)}};
  PlotOptions o;
  int w = 0, h = 0;
  auto rgb = render_rgb(series_from_results(files, o), o, w, h);
  ASSERT_EQ(rgb.size(), size_t(w) * size_t(h) * 3);
  size_t blue = 0, white = 0;
  for (size_t i = 0; i < rgb.size(); i += 3) {
    if (rgb[i] == 0x1f && rgb[i + 1] == 0x77 && rgb[i + 2] == 0xb4)
      ++blue;  // the first series' colour
    if (rgb[i] == 255 && rgb[i + 1] == 255 && rgb[i + 2] == 255) ++white;
  }
  EXPECT_GT(blue, 400u);                 // two curves, four points, the legend
  EXPECT_GT(white, rgb.size() / 3 / 2);  // mostly background
}

}  // namespace
}  // namespace sieve::bench
