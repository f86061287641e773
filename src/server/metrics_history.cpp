#include "server/metrics_history.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace sieve::server {

namespace {

// Removes model_name="..." from a label set "{a="x",model_name="y"}"; "" when nothing is left.
std::string drop_model_label(std::string_view labels) {
  if (labels.size() < 2) return {};
  std::string_view inner = labels.substr(1, labels.size() - 2);
  std::string out;
  size_t pos = 0;
  while (pos < inner.size()) {
    // A label value is a quoted string that may hold escaped quotes and commas.
    size_t q = inner.find('"', pos);
    if (q == std::string_view::npos) break;
    size_t e = q + 1;
    while (e < inner.size() && inner[e] != '"') e += inner[e] == '\\' ? 2 : 1;
    std::string_view pair = inner.substr(pos, std::min(e + 1, inner.size()) - pos);
    if (pair.rfind("model_name=", 0) != 0) {
      if (!out.empty()) out += ',';
      out += pair;
    }
    pos = e + 1;
    if (pos < inner.size() && inner[pos] == ',') ++pos;
  }
  return out.empty() ? std::string() : "{" + out + "}";
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<std::pair<std::string, double>> parse_prometheus(std::string_view text) {
  std::vector<std::pair<std::string, double>> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty() || line.front() == '#') continue;
    size_t name_end = 0;
    while (name_end < line.size() && line[name_end] != '{' && line[name_end] != ' ') ++name_end;
    if (name_end == 0) continue;
    std::string key(line.substr(0, name_end));
    size_t rest = name_end;
    if (rest < line.size() && line[rest] == '{') {
      size_t close = line.find("} ", rest);
      if (close == std::string_view::npos) continue;
      key += drop_model_label(line.substr(rest, close + 1 - rest));
      rest = close + 1;
    }
    while (rest < line.size() && line[rest] == ' ') ++rest;
    std::string_view v = line.substr(rest);
    if (const size_t sp = v.find(' '); sp != std::string_view::npos)
      v = v.substr(0, sp);  // timestamp
    double value = 0;
    if (v == "+Inf") {
      value = std::numeric_limits<double>::infinity();
    } else if (v == "-Inf") {
      value = -std::numeric_limits<double>::infinity();
    } else if (v == "NaN") {
      value = std::numeric_limits<double>::quiet_NaN();
    } else {
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
      if (ec != std::errc() || p != v.data() + v.size()) continue;
    }
    out.emplace_back(std::move(key), value);
  }
  return out;
}

MetricsHistory::MetricsHistory(std::function<std::string()> source, double period_s,
                               size_t capacity)
    : source_(std::move(source)), period_s_(period_s), capacity_(capacity ? capacity : 1) {}

MetricsHistory::~MetricsHistory() {
  stop();
}

void MetricsHistory::start() {
  std::lock_guard lk(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void MetricsHistory::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MetricsHistory::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    lk.unlock();
    sample();
    lk.lock();
    cv_.wait_for(lk, std::chrono::duration<double>(period_s_), [this] { return stop_; });
  }
}

void MetricsHistory::sample() {
  const std::string text = source_();
  const double t = unix_now();
  auto values = parse_prometheus(text);
  std::lock_guard lk(mu_);
  Sample s{t, std::vector<double>(names_.size(), std::numeric_limits<double>::quiet_NaN())};
  for (auto& [name, v] : values) {
    auto [it, added] = column_.try_emplace(name, names_.size());
    if (added) {
      names_.push_back(name);
      s.values.push_back(std::numeric_limits<double>::quiet_NaN());
    }
    s.values[it->second] = v;
  }
  samples_.push_back(std::move(s));
  while (samples_.size() > capacity_) samples_.pop_front();
}

nlohmann::json MetricsHistory::json_since(double after) const {
  std::lock_guard lk(mu_);
  nlohmann::json t = nlohmann::json::array();
  std::vector<nlohmann::json> cols(names_.size(), nlohmann::json::array());
  for (const Sample& s : samples_) {
    if (s.t <= after) continue;
    t.push_back(s.t);
    for (size_t c = 0; c < names_.size(); ++c) {
      const double v = c < s.values.size() ? s.values[c] : std::numeric_limits<double>::quiet_NaN();
      cols[c].push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr));
    }
  }
  nlohmann::json series = nlohmann::json::object();
  for (size_t c = 0; c < names_.size(); ++c) series[names_[c]] = std::move(cols[c]);
  return {{"period_s", period_s_},
          {"now", unix_now()},
          {"t", std::move(t)},
          {"series", std::move(series)}};
}

}  // namespace sieve::server
