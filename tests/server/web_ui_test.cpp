// The chat page and dashboard on the server's side: the embedded files and their lookup, the
// Prometheus text parsed back into samples, the metrics history the dashboard draws, and the
// routes on a live server (open without the API key, off with --disable-web-ui).
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <set>
#include <thread>

#include "server/metrics_history.h"
#include "server/server.h"
#include "server/static_files.h"
#include "server/web_ui.h"
#include "server_rig.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace sieve::server {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

TEST(StaticFiles, PagesAndAssetsByPath) {
  auto root = find_static("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->content_type, "text/html; charset=utf-8");
  EXPECT_NE(root->body.find("<!doctype html>"), std::string_view::npos);
  auto dash = find_static("/dashboard");
  ASSERT_TRUE(dash);
  EXPECT_EQ(dash->body, root->body);  // one page, two views
  bool csp = false;
  for (const auto& [k, v] : root->headers)
    if (k == "Content-Security-Policy") csp = v.find("script-src 'self'") != std::string::npos;
  EXPECT_TRUE(csp);

  auto js = find_static("/assets/app.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(find_static("/assets/style.css")->content_type, "text/css; charset=utf-8");
  EXPECT_EQ(find_static("/assets/favicon.svg")->content_type, "image/svg+xml");
  EXPECT_NE(js->etag, root->etag);
  EXPECT_EQ(js->etag.front(), '"');

  for (const char* bad :
       {"/assets/", "/assets/../server.cpp", "/assets/.hidden", "/assets/nope.js", "/assets/a/b.js",
        "/index.html", "/dashboard/", "/v1/models", "", "/assets/index.html"})
    EXPECT_FALSE(find_static(bad)) << bad;
}

TEST(StaticFiles, EtagMatching) {
  StaticFile f;
  f.etag = "\"0123abcd\"";
  EXPECT_TRUE(etag_matches("\"0123abcd\"", f));
  EXPECT_TRUE(etag_matches("W/\"0123abcd\"", f));
  EXPECT_TRUE(etag_matches("\"x\", \"0123abcd\"", f));
  EXPECT_TRUE(etag_matches("*", f));
  EXPECT_FALSE(etag_matches("", f));
  EXPECT_FALSE(etag_matches("\"0123abce\"", f));
  EXPECT_FALSE(etag_matches("0123abcd", f));
}

// Everything the page loads is embedded: its scripts, styles and icons, and every module a
// script imports. A file renamed in one place and not the other fails here, not in a browser.
TEST(StaticFiles, EveryReferenceResolves) {
  std::set<std::string> names;
  for (const auto& f : embedded_files()) names.insert(std::string(f.path));
  ASSERT_TRUE(names.count("index.html"));
  int refs = 0;
  for (const auto& f : embedded_files()) {
    const std::string text(f.bytes);
    static const std::regex asset(R"re((?:src|href)="/assets/([^"]+)")re");
    static const std::regex import(R"re(from '\./([^']+)')re");
    for (const std::regex* re : {&asset, &import})
      for (auto it = std::sregex_iterator(text.begin(), text.end(), *re);
           it != std::sregex_iterator(); ++it) {
        ++refs;
        EXPECT_TRUE(names.count((*it)[1])) << f.path << " refers to " << (*it)[1];
      }
  }
  EXPECT_GE(refs, 6);
}

TEST(Prometheus, ParsedBackIntoSamples) {
  engine::EngineStats s;
  s.num_running = 3;
  s.kv_usage = 0.25;
  s.generation_tokens = 1234;
  s.ttft.observe(0.003);
  s.ttft.observe(7);
  const std::string text = prometheus_text(s, "my \"model\"");
  std::map<std::string, double> m;
  for (auto& [k, v] : parse_prometheus(text)) m[k] = v;
  EXPECT_EQ(m.at("sieve:num_requests_running"), 3);
  EXPECT_EQ(m.at("sieve:kv_cache_usage_perc"), 0.25);
  EXPECT_EQ(m.at("sieve:generation_tokens_total"), 1234);
  EXPECT_EQ(m.at("sieve:request_success_total{finished_reason=\"stop\"}"), 0);
  EXPECT_EQ(m.at("sieve:time_to_first_token_seconds_bucket{le=\"0.005\"}"), 1);
  EXPECT_EQ(m.at("sieve:time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 2);
  EXPECT_DOUBLE_EQ(m.at("sieve:time_to_first_token_seconds_sum"), 7.003);
  for (const auto& [k, v] : m) EXPECT_EQ(k.find("model_name"), std::string::npos) << k;

  auto odd = parse_prometheus(
      "# HELP x y\n\nfoo 1.5\nbar{a=\"x,y\",model_name=\"m\",b=\"q\\\"\"} 2 1700000000\nbaz{broken "
      "3\n"
      "qux NaN\nquux +Inf\nnum notanumber\n");
  ASSERT_EQ(odd.size(), 4u);
  EXPECT_EQ(odd[0], (std::pair<std::string, double>{"foo", 1.5}));
  EXPECT_EQ(odd[1].first, "bar{a=\"x,y\",b=\"q\\\"\"}");
  EXPECT_EQ(odd[1].second, 2);
  EXPECT_TRUE(std::isnan(odd[2].second));
  EXPECT_TRUE(std::isinf(odd[3].second));
}

TEST(MetricsHistory, KeepsTheLastSamplesColumnByColumn) {
  int n = 0;
  MetricsHistory h(
      [&] {
        ++n;
        std::string t = "a " + std::to_string(n) + "\n";
        if (n >= 3) t += "late{x=\"1\"} " + std::to_string(10 * n) + "\n";
        return t;
      },
      1.0, 4);
  for (int i = 0; i < 5; ++i) {
    h.sample();
    std::this_thread::sleep_for(2ms);  // distinct sample times
  }
  json j = h.json_since(0);
  ASSERT_EQ(j["t"].size(), 4u);  // capacity: the oldest sample went
  EXPECT_EQ(j["series"]["a"], json({2, 3, 4, 5}));
  EXPECT_EQ(j["series"]["late{x=\"1\"}"], json({nullptr, 30, 40, 50}));
  EXPECT_EQ(j["period_s"], 1.0);
  const double t2 = j["t"][1];
  json later = h.json_since(t2);
  ASSERT_EQ(later["t"].size(), 2u);
  EXPECT_EQ(later["series"]["a"], json({4, 5}));
  EXPECT_TRUE(h.json_since(j["t"][3].get<double>())["t"].empty());
}

TEST(MetricsHistory, SamplesOnItsOwnThread) {
  std::atomic<int> calls{0};
  {
    MetricsHistory h(
        [&] {
          ++calls;
          return std::string("a 1\n");
        },
        0.01, 100);
    h.start();
    for (int i = 0; i < 500 && calls < 3; ++i) std::this_thread::sleep_for(2ms);
    h.stop();
    EXPECT_GE(h.json_since(0)["t"].size(), 3u);
  }
  EXPECT_GE(calls.load(), 3);
}

// The page is served without the API key (it asks for the key itself); /v1 still needs it.
TEST(WebUiHttp, PageAndDataRoutes) {
  ServerOptions o;
  o.api_key = "sekrit";
  o.served_model_names = {"tiny"};
  o.ui_info = {{"kv_cache_dtype", "fp8"}};
  Rig rig(o, 256, 32, true);
  auto c = rig.client();
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_FALSE(page->get_header_value("Content-Security-Policy").empty());
  const std::string etag = page->get_header_value("ETag");
  ASSERT_FALSE(etag.empty());
  auto again = c.Get("/", {{"If-None-Match", etag}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 304);
  EXPECT_TRUE(again->body.empty());
  EXPECT_EQ(c.Get("/dashboard")->status, 200);
  EXPECT_EQ(c.Get("/assets/chat.js")->status, 200);
  auto missing = c.Get("/assets/nothing.js");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], 404);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);

  auto info = c.Get("/ui/info");
  ASSERT_TRUE(info);
  ASSERT_EQ(info->status, 200);
  json i = json::parse(info->body);
  EXPECT_EQ(i["model"], "tiny");
  EXPECT_EQ(i["api_key_required"], true);
  EXPECT_EQ(i["prefix_caching"], true);
  EXPECT_EQ(i["block_size"], 16);
  EXPECT_EQ(i["num_blocks"], 32);
  EXPECT_EQ(i["kv_cache_dtype"], "fp8");
  EXPECT_EQ(i.dump().find("sekrit"), std::string::npos);

  // A request moves the counters the dashboard reads.
  auto r = c.Post("/v1/completions", {{"Authorization", "Bearer sekrit"}},
                  R"({"prompt":[1,2,3],"max_tokens":4,"temperature":0})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json m;
  for (int k = 0; k < 300; ++k) {
    m = json::parse(c.Get("/ui/metrics")->body);
    const auto& g = m["series"]["sieve:generation_tokens_total"];
    if (!g.empty() && g.back() == 4) break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_FALSE(m["t"].empty());
  EXPECT_EQ(m["series"]["sieve:generation_tokens_total"].back(), 4);
  EXPECT_EQ(m["series"]["sieve:prompt_tokens_total"].back(), 3);
  const double last = m["t"].back();
  json newer = json::parse(c.Get("/ui/metrics?since=" + std::to_string(last + 1e6))->body);
  EXPECT_TRUE(newer["t"].empty());
  auto bad = c.Get("/ui/metrics?since=yesterday");
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "since");
}

TEST(WebUiHttp, DisabledLeavesTheApiAlone) {
  ServerOptions o;
  o.web_ui = false;
  Rig rig(o);
  auto c = rig.client();
  EXPECT_EQ(c.Get("/")->status, 404);
  EXPECT_EQ(c.Get("/ui/info")->status, 404);
  EXPECT_EQ(c.Get("/v1/models")->status, 200);
}

}  // namespace
}  // namespace sieve::server
