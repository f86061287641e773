#include "bench/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "bench/font5x7.h"
#include "core/error.h"

#ifdef SIEVE_BENCH_HAVE_ZLIB
#include <zlib.h>
#endif

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
  long long first = (long long)std::floor(lo / step + 1e-9),
            last = (long long)std::ceil(hi / step - 1e-9);
  for (long long k = first; k <= last; ++k) t.push_back(double(k) * step);
  return t;
}

namespace {

double stat_of(const nlohmann::json& j, const std::string& metric, const std::string& stat,
               const std::string& path) {
  std::string key = stat + "_" + metric + "_ms";
  if (!j.contains(key) || !j[key].is_number())
    throw Error(path + ": no \"" + key +
                "\" (run `sieve bench serve` with --percentile-metrics including " + metric +
                (stat[0] == 'p' ? " and --metric-percentiles " + stat.substr(1) : "") + ")");
  return j[key].get<double>();
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

std::string num(double v) {
  char buf[64];
  if (v != 0 && (std::abs(v) >= 1e6 || std::abs(v) < 1e-3))
    std::snprintf(buf, sizeof buf, "%.3g", v);
  else
    std::snprintf(buf, sizeof buf, "%.10g", std::round(v * 1000) / 1000);
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

std::vector<PlotSeries> series_from_results(
    const std::vector<std::pair<std::string, nlohmann::json>>& files, const PlotOptions& o) {
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
      if (j.contains("label") && j["label"].is_string())
        name = j["label"].get<std::string>();
      else
        name = j.value("backend", std::string("openai")) + " " + j.value("model_id", std::string());
    } else {
      throw Error("--group-by must be label, model or file, got \"" + o.group_by + "\"");
    }
    PlotPoint p;
    p.output_throughput = j["output_throughput"].get<double>();
    p.tpot_ms = stat_of(j, "tpot", o.stat, path);
    p.ttft_ms = stat_of(j, "ttft", o.stat, path);
    if (j.contains("max_concurrency") && j["max_concurrency"].is_number_integer())
      p.concurrency = j["max_concurrency"].get<int>();
    if (j.contains("request_rate") && j["request_rate"].is_number())
      p.request_rate = j["request_rate"].get<double>();
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

namespace {

struct Shape {
  enum Kind { line, polyline, rect, circle, text };
  Shape(Kind k, std::vector<std::pair<double, double>> p) : kind(k), pts(std::move(p)) {}
  Kind kind;
  std::vector<std::pair<double, double>>
      pts;  // line: 2, polyline: n, rect: corner + size, circle: centre
  uint32_t color = 0x000000;
  double width = 1, radius = 0, size = 12;
  std::string str, title, css;  // text; circle tooltip; class attribute
  char anchor = 's';            // text: 's'tart, 'm'iddle, 'e'nd
  bool vertical = false;        // text rotated by -90 degrees about its anchor point
};

uint32_t parse_color(const char* hex) {
  return uint32_t(std::stoul(std::string(hex + 1), nullptr, 16));
}

std::string color_str(uint32_t c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%06x", c & 0xffffff);
  return buf;
}

struct Layout {
  int W = 1120, H = 500;
  std::vector<Shape> shapes;
  void line(double x1, double y1, double x2, double y2, uint32_t c, double w = 1) {
    Shape s{Shape::line, {{x1, y1}, {x2, y2}}};
    s.color = c;
    s.width = w;
    shapes.push_back(std::move(s));
  }
  void text(double x, double y, std::string str, double size, char anchor = 's', uint32_t c = 0,
            bool vertical = false) {
    Shape s{Shape::text, {{x, y}}};
    s.str = std::move(str);
    s.size = size;
    s.anchor = anchor;
    s.color = c;
    s.vertical = vertical;
    shapes.push_back(std::move(s));
  }
};

// One panel: a frame, grid lines with labelled ticks, axis titles, and each series as a curve
// with its points. `xs` maps a point to its x value; the axis has the given ticks, linear or
// log2 (concurrency doubles from run to run).
struct Axis {
  std::vector<double> ticks;
  bool log2 = false;
  std::string title;
};

void draw_panel(Layout& L, double x0, double y0, double pw, double ph, const Axis& xa, const Axis& ya,
                const std::vector<PlotSeries>& series, double (*xs)(const PlotPoint&),
                double (*ys)(const PlotPoint&), const char* unit) {
  auto pos = [](const Axis& a, double v) {
    const double lo = a.ticks.front(), hi = a.ticks.back();
    if (a.log2) return hi > lo ? (std::log2(v) - std::log2(lo)) / (std::log2(hi) - std::log2(lo)) : 0.5;
    return hi > lo ? (v - lo) / (hi - lo) : 0.5;
  };
  auto X = [&](double v) { return x0 + pos(xa, v) * pw; };
  auto Y = [&](double v) { return y0 + ph - pos(ya, v) * ph; };
  for (double t : ya.ticks) {
    L.line(x0, Y(t), x0 + pw, Y(t), 0xe0e0e0);
    L.text(x0 - 8, Y(t) + 4, num(t), 12, 'e');
  }
  for (double t : xa.ticks) {
    L.line(X(t), y0, X(t), y0 + ph, 0xf0f0f0);
    L.text(X(t), y0 + ph + 18, num(t), 12, 'm');
  }
  Shape frame{Shape::rect, {{x0, y0}, {pw, ph}}};
  frame.color = 0x333333;
  L.shapes.push_back(frame);
  L.text(x0 + pw / 2.0, y0 + ph + 42, xa.title, 14, 'm');
  // The y title stands clear of the widest tick label (12 px a character in the PNG's font).
  size_t widest = 0;
  for (double t : ya.ticks) widest = std::max(widest, num(t).size());
  L.text(x0 - std::max(55.0, 16.0 + 12.0 * double(widest)), y0 + ph / 2.0, ya.title, 14, 'm', 0, true);
  for (size_t si = 0; si < series.size(); ++si) {
    const auto& s = series[si];
    const uint32_t color = parse_color(kColors[si % (sizeof kColors / sizeof *kColors)]);
    if (s.points.size() > 1) {
      Shape pl{Shape::polyline, {}};
      for (const auto& p : s.points) pl.pts.emplace_back(X(xs(p)), Y(ys(p)));
      pl.color = color;
      pl.width = 2;
      pl.css = "series";
      L.shapes.push_back(std::move(pl));
    }
    for (const auto& p : s.points) {
      Shape c{Shape::circle, {{X(xs(p)), Y(ys(p))}}};
      c.radius = 4;
      c.color = color;
      c.css = "point";
      c.title = s.name + ": " + num(ys(p)) + " " + unit +
                (p.concurrency > 0 ? " at concurrency " + std::to_string(p.concurrency) : "") + ", " +
                num(p.output_throughput) + " tok/s";
      L.shapes.push_back(std::move(c));
      // On the throughput axis the concurrency is not on an axis, so each point says it.
      if (!xa.log2) {
        const std::string tag = p.concurrency > 0    ? "c=" + std::to_string(p.concurrency)
                                : p.request_rate > 0 ? num(p.request_rate) + " rps"
                                                     : "";
        if (!tag.empty()) L.text(X(xs(p)) + 6, Y(ys(p)) - 6, tag, 10, 's', color);
      }
    }
  }
}

void legend(Layout& L, const std::vector<PlotSeries>& series, double x) {
  for (size_t si = 0; si < series.size(); ++si) {
    const uint32_t color = parse_color(kColors[si % (sizeof kColors / sizeof *kColors)]);
    L.line(x, 52, x + 24, 52, color, 3);
    L.text(x + 30, 56, series[si].name, 12);
    x += 50 + 12.0 * double(series[si].name.size());  // wide enough for the PNG's bitmap font
  }
}

double tpot_of(const PlotPoint& p) { return p.tpot_ms; }
double ttft_of(const PlotPoint& p) { return p.ttft_ms; }
double throughput_of(const PlotPoint& p) { return p.output_throughput; }
double concurrency_of(const PlotPoint& p) { return double(p.concurrency); }

std::string stat_label(const PlotOptions& o) {
  return o.stat == "mean" ? "Mean" : o.stat == "median" ? "Median" : "P" + o.stat.substr(1);
}

// y ticks from 0 to a little above the largest value of `ys` over all series.
Axis value_axis(const std::vector<PlotSeries>& series, double (*ys)(const PlotPoint&), std::string title) {
  double hi = 0;
  for (const auto& s : series)
    for (const auto& p : s.points) hi = std::max(hi, ys(p));
  return {nice_ticks(0, hi > 0 ? hi * 1.05 : 1), false, std::move(title)};
}

// TPOT and TTFT against output throughput: the trade-off one engine makes as load grows.
Layout layout_throughput(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  Layout L;
  const int top = 70, bottom = 70, left = 80, gap = 90, right = 30;
  const double pw = (L.W - left - right - gap) / 2.0, ph = L.H - top - bottom;
  L.text(L.W / 2.0, 30, o.title.empty() ? "Latency against output throughput" : o.title, 18, 'm');
  const Axis x = value_axis(series, throughput_of, "Output token throughput (tok/s)");
  draw_panel(L, left, top, pw, ph, x, value_axis(series, tpot_of, stat_label(o) + " TPOT (ms)"), series,
             throughput_of, tpot_of, "ms");
  draw_panel(L, left + pw + gap, top, pw, ph, x, value_axis(series, ttft_of, stat_label(o) + " TTFT (ms)"),
             series, throughput_of, ttft_of, "ms");
  legend(L, series, left);
  return L;
}

// TPOT, TTFT and output throughput against concurrency, engines side by side as curves: what
// each engine gives at the same load.
Layout layout_concurrency(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  Layout L;
  L.W = 1500;
  const int top = 70, bottom = 70, left = 90, gap = 105, right = 30;
  const double pw = (L.W - left - right - 2 * gap) / 3.0, ph = L.H - top - bottom;
  L.text(L.W / 2.0, 30, o.title.empty() ? "Latency and throughput against concurrency" : o.title, 18, 'm');
  // One tick per concurrency that was run, on a log2 axis.
  Axis x{{}, true, "Concurrency (requests in flight)"};
  for (const auto& s : series)
    for (const auto& p : s.points) x.ticks.push_back(double(p.concurrency));
  std::sort(x.ticks.begin(), x.ticks.end());
  x.ticks.erase(std::unique(x.ticks.begin(), x.ticks.end()), x.ticks.end());
  if (x.ticks.size() == 1) x.ticks = {x.ticks[0] / 2, x.ticks[0], x.ticks[0] * 2};
  draw_panel(L, left, top, pw, ph, x, value_axis(series, tpot_of, stat_label(o) + " TPOT (ms)"), series,
             concurrency_of, tpot_of, "ms");
  draw_panel(L, left + pw + gap, top, pw, ph, x, value_axis(series, ttft_of, stat_label(o) + " TTFT (ms)"),
             series, concurrency_of, ttft_of, "ms");
  draw_panel(L, left + 2 * (pw + gap), top, pw, ph, x,
             value_axis(series, throughput_of, "Output token throughput (tok/s)"), series, concurrency_of,
             throughput_of, "tok/s");
  legend(L, series, left);
  return L;
}

Layout layout(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  if (o.x_axis == "throughput") return layout_throughput(series, o);
  if (o.x_axis != "concurrency")
    throw Error("--x must be concurrency or throughput, got \"" + o.x_axis + "\"");
  for (const auto& s : series)
    for (const auto& p : s.points)
      if (p.concurrency <= 0)
        throw Error("a run of \"" + s.name +
                    "\" has no max_concurrency (it ran at a request rate): plot it with --x throughput, or "
                    "run `sieve bench serve --max-concurrency N`");
  return layout_concurrency(series, o);
}

// --- raster -----------------------------------------------------------------------------------

struct Raster {
  int W, H;
  std::vector<uint8_t> px;
  Raster(int w, int h) : W(w), H(h), px(size_t(w) * size_t(h) * 3, 255) {}
  void blend(int x, int y, uint32_t c, double a) {
    if (x < 0 || y < 0 || x >= W || y >= H || a <= 0) return;
    a = std::min(a, 1.0);
    uint8_t* p = &px[(size_t(y) * size_t(W) + size_t(x)) * 3];
    const int rgb[3] = {int((c >> 16) & 255), int((c >> 8) & 255), int(c & 255)};
    for (int k = 0; k < 3; ++k) p[k] = uint8_t(std::lround(p[k] * (1 - a) + rgb[k] * a));
  }
  // Anti-aliased by the distance from each pixel centre to the segment.
  void segment(double x1, double y1, double x2, double y2, double w, uint32_t c) {
    double hw = w / 2;
    int xa = int(std::floor(std::min(x1, x2) - hw - 1)),
        xb = int(std::ceil(std::max(x1, x2) + hw + 1));
    int ya = int(std::floor(std::min(y1, y2) - hw - 1)),
        yb = int(std::ceil(std::max(y1, y2) + hw + 1));
    double dx = x2 - x1, dy = y2 - y1, len2 = dx * dx + dy * dy;
    for (int y = std::max(ya, 0); y <= std::min(yb, H - 1); ++y)
      for (int x = std::max(xa, 0); x <= std::min(xb, W - 1); ++x) {
        double px_ = x + 0.5, py = y + 0.5;
        double t = len2 > 0 ? std::clamp(((px_ - x1) * dx + (py - y1) * dy) / len2, 0.0, 1.0) : 0.0;
        double ex = px_ - (x1 + t * dx), ey = py - (y1 + t * dy);
        blend(x, y, c, hw + 0.5 - std::sqrt(ex * ex + ey * ey));
      }
  }
  void disc(double cx, double cy, double r, uint32_t c) {
    for (int y = std::max(int(cy - r - 1), 0); y <= std::min(int(cy + r + 1), H - 1); ++y)
      for (int x = std::max(int(cx - r - 1), 0); x <= std::min(int(cx + r + 1), W - 1); ++x)
        blend(x, y, c, r + 0.5 - std::hypot(x + 0.5 - cx, y + 0.5 - cy));
  }
  void text(const Shape& s) {
    int scale = std::max(1, int(std::lround(s.size / 7.0)));
    std::string chars;  // one byte per code point: non-ASCII becomes '?'
    for (unsigned char ch : s.str)
      if ((ch & 0xC0) != 0x80) chars += ch < 128 ? char(ch) : '?';
    double width = double(chars.size()) * 6 * scale - scale;
    double u0 = s.anchor == 'm' ? -width / 2 : s.anchor == 'e' ? -width : 0;
    for (size_t i = 0; i < chars.size(); ++i) {
      const font::Glyph* g = font::glyph(chars[i]);
      if (!g) g = font::glyph('?');
      for (int row = 0; row < 7; ++row)
        for (int col = 0; col < 5; ++col) {
          if (g->rows[row][col] != '#') continue;
          for (int sy = 0; sy < scale; ++sy)
            for (int sx = 0; sx < scale; ++sx) {
              double u = u0 + double(i) * 6 * scale + col * scale + sx;  // along the text
              double v =
                  -7.0 * scale + (row + font::drop_rows(g->c)) * scale + sy;  // down from the top
              int x = s.vertical ? int(std::floor(s.pts[0].first + v))
                                 : int(std::floor(s.pts[0].first + u));
              int y = s.vertical ? int(std::floor(s.pts[0].second - u))
                                 : int(std::floor(s.pts[0].second + v));
              blend(x, y, s.color, 1.0);
            }
        }
    }
  }
};

uint32_t crc32_of(const uint8_t* d, size_t n, uint32_t crc = 0) {
  static uint32_t table[256];
  static bool init = false;
  if (!init) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    init = true;
  }
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ d[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

void put32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(x >> s));
}

void chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  put32(out, uint32_t(data.size()));
  std::vector<uint8_t> td(type, type + 4);
  td.insert(td.end(), data.begin(), data.end());
  out.insert(out.end(), td.begin(), td.end());
  put32(out, crc32_of(td.data(), td.size()));
}

// A zlib stream of the data (compressed with zlib when this build has it, else stored blocks).
std::vector<uint8_t> zlib_stream(const std::vector<uint8_t>& raw) {
#ifdef SIEVE_BENCH_HAVE_ZLIB
  uLongf n = compressBound(uLong(raw.size()));
  std::vector<uint8_t> packed(n);
  if (compress2(packed.data(), &n, raw.data(), uLong(raw.size()), 9) == Z_OK) {
    packed.resize(n);
    return packed;
  }
#endif
  std::vector<uint8_t> out{0x78, 0x01};
  size_t pos = 0;
  do {
    size_t len = std::min<size_t>(65535, raw.size() - pos);
    bool last = pos + len == raw.size();
    out.push_back(last ? 1 : 0);
    out.push_back(uint8_t(len & 0xff));
    out.push_back(uint8_t(len >> 8));
    out.push_back(uint8_t(~len & 0xff));
    out.push_back(uint8_t((~len >> 8) & 0xff));
    out.insert(out.end(), raw.begin() + long(pos), raw.begin() + long(pos + len));
    pos += len;
  } while (pos < raw.size());
  uint32_t a = 1, b = 0;
  for (uint8_t c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  put32(out, (b << 16) | a);
  return out;
}

}  // namespace

std::string render_svg(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  Layout L = layout(series, o);
  std::string W = std::to_string(L.W), H = std::to_string(L.H);
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + W + "\" height=\"" + H +
                    "\" viewBox=\"0 0 " + W + " " + H +
                    "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (const auto& s : L.shapes) {
    std::string cls = s.css.empty() ? "" : " class=\"" + s.css + "\"";
    switch (s.kind) {
      case Shape::line:
        svg += "<line x1=\"" + f1(s.pts[0].first) + "\" y1=\"" + f1(s.pts[0].second) + "\" x2=\"" +
               f1(s.pts[1].first) + "\" y2=\"" + f1(s.pts[1].second) + "\" stroke=\"" +
               color_str(s.color) + "\"" +
               (s.width != 1 ? " stroke-width=\"" + num(s.width) + "\"" : "") + "/>\n";
        break;
      case Shape::polyline: {
        std::string pts;
        for (const auto& p : s.pts) pts += f1(p.first) + "," + f1(p.second) + " ";
        svg += "<polyline" + cls + " fill=\"none\" stroke=\"" + color_str(s.color) +
               "\" stroke-width=\"" + num(s.width) + "\" points=\"" + pts + "\"/>\n";
        break;
      }
      case Shape::rect:
        svg += "<rect x=\"" + f1(s.pts[0].first) + "\" y=\"" + f1(s.pts[0].second) + "\" width=\"" +
               f1(s.pts[1].first) + "\" height=\"" + f1(s.pts[1].second) +
               "\" fill=\"none\" stroke=\"" + color_str(s.color) + "\"/>\n";
        break;
      case Shape::circle:
        svg += "<circle" + cls + " cx=\"" + f1(s.pts[0].first) + "\" cy=\"" + f1(s.pts[0].second) +
               "\" r=\"" + num(s.radius) + "\" fill=\"" + color_str(s.color) + "\"><title>" +
               esc(s.title) + "</title></circle>\n";
        break;
      case Shape::text: {
        std::string anchor = s.anchor == 'm'   ? " text-anchor=\"middle\""
                             : s.anchor == 'e' ? " text-anchor=\"end\""
                                               : "";
        std::string fill = s.color ? " fill=\"" + color_str(s.color) + "\"" : "";
        std::string pos =
            s.vertical ? " transform=\"translate(" + f1(s.pts[0].first) + "," +
                             f1(s.pts[0].second) + ") rotate(-90)\""
                       : " x=\"" + f1(s.pts[0].first) + "\" y=\"" + f1(s.pts[0].second) + "\"";
        svg += "<text" + pos + anchor + " font-size=\"" + num(s.size) + "\"" + fill + ">" +
               esc(s.str) + "</text>\n";
        break;
      }
    }
  }
  svg += "</svg>\n";
  return svg;
}

std::vector<uint8_t> encode_png(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width <= 0 || height <= 0 || rgb.size() != size_t(width) * size_t(height) * 3)
    throw Error("encode_png: buffer does not match " + std::to_string(width) + "x" +
                std::to_string(height));
  std::vector<uint8_t> out{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put32(ihdr, uint32_t(width));
  put32(ihdr, uint32_t(height));
  for (uint8_t b : {8, 2, 0, 0, 0})
    ihdr.push_back(b);  // 8-bit RGB, deflate, no filter, no interlace
  chunk(out, "IHDR", ihdr);
  std::vector<uint8_t> raw;
  raw.reserve(size_t(height) * (size_t(width) * 3 + 1));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), rgb.begin() + long(size_t(y) * size_t(width) * 3),
               rgb.begin() + long(size_t(y + 1) * size_t(width) * 3));
  }
  chunk(out, "IDAT", zlib_stream(raw));
  chunk(out, "IEND", {});
  return out;
}

std::vector<uint8_t> render_rgb(const std::vector<PlotSeries>& series, const PlotOptions& o,
                                int& width, int& height) {
  Layout L = layout(series, o);
  Raster r(L.W, L.H);
  for (const auto& s : L.shapes) {
    switch (s.kind) {
      case Shape::line:
        r.segment(s.pts[0].first, s.pts[0].second, s.pts[1].first, s.pts[1].second, s.width,
                  s.color);
        break;
      case Shape::polyline:
        for (size_t i = 1; i < s.pts.size(); ++i)
          r.segment(s.pts[i - 1].first, s.pts[i - 1].second, s.pts[i].first, s.pts[i].second,
                    s.width, s.color);
        break;
      case Shape::rect: {
        double x = s.pts[0].first, y = s.pts[0].second, w = s.pts[1].first, h = s.pts[1].second;
        r.segment(x, y, x + w, y, 1, s.color);
        r.segment(x + w, y, x + w, y + h, 1, s.color);
        r.segment(x + w, y + h, x, y + h, 1, s.color);
        r.segment(x, y + h, x, y, 1, s.color);
        break;
      }
      case Shape::circle:
        r.disc(s.pts[0].first, s.pts[0].second, s.radius, s.color);
        break;
      case Shape::text:
        r.text(s);
        break;
    }
  }
  width = L.W;
  height = L.H;
  return std::move(r.px);
}

std::vector<uint8_t> render_png(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  int w = 0, h = 0;
  auto rgb = render_rgb(series, o, w, h);
  return encode_png(w, h, rgb);
}

}  // namespace sieve::bench
