#include "bench/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.h"

namespace sieve::bench {

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  double raw = (hi - lo) / std::max(target, 1);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  // The last tick is at or above hi, so that the axis holds every point.
  long long first = (long long)std::floor(lo / step + 1e-9), last = (long long)std::ceil(hi / step - 1e-9);
  for (long long k = first; k <= last; ++k) t.push_back(double(k) * step);
  return t;
}

namespace {

double stat_of(const nlohmann::json& j, const std::string& metric, const std::string& stat,
               const std::string& path) {
  std::string key = stat + "_" + metric + "_ms";
  if (!j.contains(key) || !j[key].is_number())
    throw Error(path + ": no \"" + key + "\" (run `sieve bench serve` with --percentile-metrics including " +
                metric + (stat[0] == 'p' ? " and --metric-percentiles " + stat.substr(1) : "") + ")");
  return j[key].get<double>();
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char buf[64];
  if (v != 0 && (std::abs(v) >= 1e6 || std::abs(v) < 1e-3)) std::snprintf(buf, sizeof buf, "%.3g", v);
  else std::snprintf(buf, sizeof buf, "%.10g", std::round(v * 1000) / 1000);
  return buf;
}

std::string f1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::vector<PlotSeries> series_from_results(const std::vector<std::pair<std::string, nlohmann::json>>& files,
                                            const PlotOptions& o) {
  if (o.stat != "mean" && o.stat != "median" && !(o.stat.size() > 1 && o.stat[0] == 'p'))
    throw Error("--stat must be mean, median or pNN (e.g. p99), got \"" + o.stat + "\"");
  std::map<std::string, PlotSeries> by_name;
  std::vector<std::string> order;
  for (const auto& [path, j] : files) {
    if (!j.is_object() || !j.contains("output_throughput"))
      throw Error(path + ": not a serving-benchmark result (no \"output_throughput\")");
    std::string name;
    if (o.group_by == "file") {
      name = std::filesystem::path(path).stem().string();
    } else if (o.group_by == "model") {
      name = j.value("model_id", std::string("?"));
    } else if (o.group_by == "label") {
      if (j.contains("label") && j["label"].is_string()) name = j["label"].get<std::string>();
      else name = j.value("backend", std::string("openai")) + " " + j.value("model_id", std::string());
    } else {
      throw Error("--group-by must be label, model or file, got \"" + o.group_by + "\"");
    }
    PlotPoint p;
    p.output_throughput = j["output_throughput"].get<double>();
    p.tpot_ms = stat_of(j, "tpot", o.stat, path);
    p.ttft_ms = stat_of(j, "ttft", o.stat, path);
    if (j.contains("max_concurrency") && j["max_concurrency"].is_number_integer())
      p.concurrency = j["max_concurrency"].get<int>();
    if (j.contains("request_rate") && j["request_rate"].is_number()) p.request_rate = j["request_rate"].get<double>();
    if (!by_name.count(name)) {
      order.push_back(name);
      by_name[name].name = name;
    }
    by_name[name].points.push_back(p);
  }
  std::vector<PlotSeries> out;
  for (const auto& n : order) {
    PlotSeries s = by_name[n];
    std::sort(s.points.begin(), s.points.end(), [](const PlotPoint& a, const PlotPoint& b) {
      if (a.concurrency != b.concurrency) return a.concurrency < b.concurrency;
      return a.output_throughput < b.output_throughput;
    });
    out.push_back(std::move(s));
  }
  return out;
}

std::string render_svg(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  const int W = 1120, H = 500, top = 70, bottom = 70, left = 80, gap = 90, right = 30;
  const int pw = (W - left - right - gap) / 2, ph = H - top - bottom;
  double xmax = 0, tpot_max = 0, ttft_max = 0;
  for (const auto& s : series)
    for (const auto& p : s.points) {
      xmax = std::max(xmax, p.output_throughput);
      tpot_max = std::max(tpot_max, p.tpot_ms);
      ttft_max = std::max(ttft_max, p.ttft_ms);
    }
  std::string stat_label = o.stat == "mean" ? "Mean" : o.stat == "median" ? "Median" : "P" + o.stat.substr(1);
  std::string svg;
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) + "\" height=\"" +
         std::to_string(H) + "\" viewBox=\"0 0 " + std::to_string(W) + " " + std::to_string(H) +
         "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string title = o.title.empty() ? "Latency against output throughput" : o.title;
  svg += "<text x=\"" + std::to_string(W / 2) + "\" y=\"30\" text-anchor=\"middle\" font-size=\"18\">" +
         esc(title) + "</text>\n";

  struct Panel {
    int x0;
    double ymax;
    std::string ylabel;
    bool tpot;
  } panels[] = {{left, tpot_max, stat_label + " TPOT (ms)", true},
                {left + pw + gap, ttft_max, stat_label + " TTFT (ms)", false}};
  auto xt = nice_ticks(0, xmax > 0 ? xmax * 1.05 : 1);
  double xhi = xt.back();
  for (const auto& pn : panels) {
    auto yt = nice_ticks(0, pn.ymax > 0 ? pn.ymax * 1.05 : 1);
    double yhi = yt.back();
    auto X = [&](double v) { return pn.x0 + v / xhi * pw; };
    auto Y = [&](double v) { return top + ph - v / yhi * ph; };
    svg += "<g class=\"panel\">\n";
    for (double t : yt) {
      svg += "<line x1=\"" + f1(pn.x0) + "\" x2=\"" + f1(pn.x0 + pw) + "\" y1=\"" + f1(Y(t)) + "\" y2=\"" +
             f1(Y(t)) + "\" stroke=\"#e0e0e0\"/>\n";
      svg += "<text x=\"" + f1(pn.x0 - 8) + "\" y=\"" + f1(Y(t) + 4) +
             "\" text-anchor=\"end\" font-size=\"12\">" + num(t) + "</text>\n";
    }
    for (double t : xt) {
      svg += "<line x1=\"" + f1(X(t)) + "\" x2=\"" + f1(X(t)) + "\" y1=\"" + f1(top) + "\" y2=\"" +
             f1(top + ph) + "\" stroke=\"#f0f0f0\"/>\n";
      svg += "<text x=\"" + f1(X(t)) + "\" y=\"" + f1(top + ph + 18) +
             "\" text-anchor=\"middle\" font-size=\"12\">" + num(t) + "</text>\n";
    }
    svg += "<rect x=\"" + f1(pn.x0) + "\" y=\"" + f1(top) + "\" width=\"" + std::to_string(pw) + "\" height=\"" +
           std::to_string(ph) + "\" fill=\"none\" stroke=\"#333\"/>\n";
    svg += "<text x=\"" + f1(pn.x0 + pw / 2.0) + "\" y=\"" + f1(top + ph + 42) +
           "\" text-anchor=\"middle\" font-size=\"14\">Output token throughput (tok/s)</text>\n";
    svg += "<text transform=\"translate(" + f1(pn.x0 - 55) + "," + f1(top + ph / 2.0) +
           ") rotate(-90)\" text-anchor=\"middle\" font-size=\"14\">" + esc(pn.ylabel) + "</text>\n";
    for (size_t si = 0; si < series.size(); ++si) {
      const auto& s = series[si];
      const char* color = kColors[si % (sizeof kColors / sizeof *kColors)];
      std::string pts;
      for (const auto& p : s.points)
        pts += f1(X(p.output_throughput)) + "," + f1(Y(pn.tpot ? p.tpot_ms : p.ttft_ms)) + " ";
      if (s.points.size() > 1)
        svg += "<polyline class=\"series\" fill=\"none\" stroke=\"" + std::string(color) +
               "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
      for (const auto& p : s.points) {
        double cx = X(p.output_throughput), cy = Y(pn.tpot ? p.tpot_ms : p.ttft_ms);
        svg += "<circle class=\"point\" cx=\"" + f1(cx) + "\" cy=\"" + f1(cy) + "\" r=\"4\" fill=\"" + color +
               "\"><title>" + esc(s.name) + ": " + num(p.output_throughput) + " tok/s, " +
               num(pn.tpot ? p.tpot_ms : p.ttft_ms) + " ms" +
               (p.concurrency > 0 ? ", concurrency " + std::to_string(p.concurrency) : "") + "</title></circle>\n";
        std::string tag = p.concurrency > 0 ? "c=" + std::to_string(p.concurrency)
                          : p.request_rate > 0 ? num(p.request_rate) + " rps" : "";
        if (!tag.empty())
          svg += "<text x=\"" + f1(cx + 6) + "\" y=\"" + f1(cy - 6) + "\" font-size=\"10\" fill=\"" + color +
                 "\">" + esc(tag) + "</text>\n";
      }
    }
    svg += "</g>\n";
  }
  // Legend under the title.
  double lx = left;
  for (size_t si = 0; si < series.size(); ++si) {
    const char* color = kColors[si % (sizeof kColors / sizeof *kColors)];
    svg += "<line x1=\"" + f1(lx) + "\" x2=\"" + f1(lx + 24) + "\" y1=\"52\" y2=\"52\" stroke=\"" + color +
           "\" stroke-width=\"3\"/>\n";
    svg += "<text x=\"" + f1(lx + 30) + "\" y=\"56\" font-size=\"12\">" + esc(series[si].name) + "</text>\n";
    lx += 50 + 7.0 * double(series[si].name.size());
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace sieve::bench
