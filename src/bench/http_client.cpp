#include "bench/http_client.h"

#include <chrono>
#include <cmath>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sieve::bench {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

namespace {

void split_base_url(const std::string& base_url, std::string& host, std::string& prefix) {
  std::string u = base_url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  size_t scheme = u.find("://");
  size_t path_at = u.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (path_at == std::string::npos) {
    host = u;
    prefix.clear();
  } else {
    host = u.substr(0, path_at);
    prefix = u.substr(path_at);
  }
  if (scheme == std::string::npos) host = "http://" + host;
}

void set_timeout(httplib::Client& c, double s, bool read) {
  time_t sec = time_t(std::floor(s));
  time_t usec = time_t((s - double(sec)) * 1e6);
  if (read)
    c.set_read_timeout(sec, usec);
  else
    c.set_connection_timeout(sec, usec);
}

}  // namespace

struct HttpSession::Impl {
  std::string base, host, prefix;
  ClientOptions opts;
  std::unique_ptr<httplib::Client> cli;

  void reset() {
    cli = std::make_unique<httplib::Client>(host);
    set_timeout(*cli, opts.connect_timeout_s, false);
    set_timeout(*cli, opts.read_timeout_s, true);
    cli->set_write_timeout(time_t(std::ceil(opts.read_timeout_s)), 0);
    cli->set_keep_alive(true);
  }
};

HttpSession::HttpSession(const std::string& base_url, ClientOptions opts) : impl_(new Impl) {
  impl_->base = base_url;
  impl_->opts = opts;
  split_base_url(base_url, impl_->host, impl_->prefix);
  impl_->reset();
}

HttpSession::~HttpSession() = default;

void HttpSession::stream_post(const std::string& path, const std::string& body, StreamState& st,
                              RequestRecord& rec, const std::atomic<bool>* cancel) {
  httplib::Request req;
  req.method = "POST";
  req.path = impl_->prefix + path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  int status = 0;
  std::string error_body;
  SseSplitter splitter;
  double last_byte = 0;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    double t = now_s();
    last_byte = t;
    if (cancel && cancel->load()) return false;
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, n);
      return true;
    }
    splitter.feed(std::string_view(data, n),
                  [&](std::string_view payload) { apply_sse_payload(payload, t, st, rec); });
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  rec.start_time = now_s();
  last_byte = rec.start_time;
  bool ok = impl_->cli->send(req, res, err);
  if (!ok) {
    double silent = now_s() - last_byte;
    std::string what = httplib::to_string(err);
    if (cancel && cancel->load()) {
      what = "interrupted";
    } else if (err == httplib::Error::Read && silent >= impl_->opts.read_timeout_s * 0.95) {
      what = "timed out: no data for " + std::to_string(impl_->opts.read_timeout_s) + " s (Read)";
    } else if (err == httplib::Error::Read && status == 0) {
      what = "connection closed or reset before a response (Read)";
    } else if (err == httplib::Error::Read) {
      what = "connection lost while reading the response (Read)";
    } else if (err == httplib::Error::Connection || err == httplib::Error::ConnectionTimeout) {
      what = "cannot connect to " + impl_->host + " (" + what + ")";
    }
    rec.error = "request failed: " + what;
    // A broken connection cannot be reused.
    impl_->reset();
    return;
  }
  if (status != 200) {
    rec.error = "HTTP " + std::to_string(status) + " " + res.reason + ": " + error_body;
    return;
  }
  if (rec.error.empty() && rec.chunk_times.empty())
    rec.error =
        "Never received a valid chunk to calculate TTFT. This response will be marked as failed!";
}

HttpResponse HttpSession::get(const std::string& path) {
  auto r = impl_->cli->Get((impl_->prefix + path).c_str());
  if (!r) {
    impl_->reset();
    throw Error("GET " + impl_->base + path + " failed: " + httplib::to_string(r.error()));
  }
  return HttpResponse{r->status, r->body};
}

HttpResponse HttpSession::post_json(const std::string& path, const std::string& body) {
  auto r = impl_->cli->Post((impl_->prefix + path).c_str(), body, "application/json");
  if (!r) {
    impl_->reset();
    throw Error("POST " + impl_->base + path + " failed: " + httplib::to_string(r.error()));
  }
  return HttpResponse{r->status, r->body};
}

std::string first_model(const std::string& base_url, ClientOptions opts) {
  HttpSession s(base_url, opts);
  HttpResponse r = s.get("/v1/models");
  if (r.status != 200)
    throw Error("GET " + base_url + "/v1/models answered HTTP " + std::to_string(r.status) + ": " +
                r.body.substr(0, 300));
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id"))
    throw Error("no models found at " + base_url +
                "/v1/models (expected {\"data\": [{\"id\": ...}]})");
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace sieve::bench
