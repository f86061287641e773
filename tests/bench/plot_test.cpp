// `sieve bench plot`: series from result JSONs and the SVG drawn from them.
#include <gtest/gtest.h>

#include <regex>

#include "bench/plot.h"

namespace sieve::bench {
namespace {

nlohmann::json result(const std::string& label, int conc, double tput, double tpot, double ttft) {
  nlohmann::json j{{"label", label},          {"model_id", "m"},        {"max_concurrency", conc},
                   {"request_rate", "inf"},   {"output_throughput", tput}, {"mean_tpot_ms", tpot},
                   {"mean_ttft_ms", ttft},    {"p99_tpot_ms", tpot * 2}, {"p99_ttft_ms", ttft * 3}};
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
  EXPECT_THROW(series_from_results({{"x.json", nlohmann::json{{"a", 1}}}}, PlotOptions{}), std::exception);

  o.group_by = "label";
  std::string svg = render_svg(series_from_results(files, o), o);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  auto count = [&](const std::string& pattern) {
    std::regex re(pattern);
    return std::distance(std::sregex_iterator(svg.begin(), svg.end(), re), std::sregex_iterator());
  };
  EXPECT_EQ(count("<circle class=\"point\""), 8);   // 4 runs in 2 panels
  EXPECT_EQ(count("<polyline class=\"series\""), 2);  // the 3-point curve, once per panel
  EXPECT_NE(svg.find("Mean TPOT (ms)"), std::string::npos);
  EXPECT_NE(svg.find("Mean TTFT (ms)"), std::string::npos);
  EXPECT_NE(svg.find("Output token throughput (tok/s)"), std::string::npos);
  EXPECT_NE(svg.find(">c=32<"), std::string::npos);
  EXPECT_NE(svg.find(">3000<"), std::string::npos);  // 2433 tok/s plus a 5% margin: axis to 3000
}

}  // namespace
}  // namespace sieve::bench
