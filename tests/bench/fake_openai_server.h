// An in-test OpenAI-compatible server on 127.0.0.1 that streams SSE like vLLM: one chunk per
// `tokens_per_chunk` tokens, a finish chunk, a usage chunk when asked, then [DONE]. Requests can
// be made to fail by their arrival number.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace sieve::bench::testing {

enum class Fault { none, http_500, disconnect, stall, error_event, no_usage };

class FakeOpenAIServer {
 public:
  int tokens_per_chunk = 1;
  double chunk_delay_s = 0.002;
  double stall_s = 1.5;         // a stalled request waits this long before writing
  std::map<int, Fault> faults;  // by arrival number, from 0
  std::string model = "fake-model";

  FakeOpenAIServer() {
    svr_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json j = {{"object", "list"},
                          {"data", {{{"id", model}, {"object", "model"}, {"root", model}}}}};
      res.set_content(j.dump(), "application/json");
    });
    auto handler = [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res);
    };
    svr_.Post("/v1/completions", handler);
    svr_.Post("/v1/chat/completions", handler);
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    while (!svr_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAIServer() {
    svr_.stop();
    if (thread_.joinable()) thread_.join();
  }

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  std::vector<nlohmann::json> bodies() {
    std::lock_guard<std::mutex> lk(mu_);
    return bodies_;
  }

 private:
  void complete(const httplib::Request& req, httplib::Response& res) {
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    int index;
    {
      std::lock_guard<std::mutex> lk(mu_);
      index = int(bodies_.size());
      bodies_.push_back(body);
    }
    Fault fault = faults.count(index) ? faults.at(index) : Fault::none;
    if (fault == Fault::http_500) {
      res.status = 500;
      res.set_content(R"({"error":{"message":"injected failure","type":"server_error"}})",
                      "application/json");
      return;
    }
    bool chat = req.path.find("chat") != std::string::npos;
    int prompt_tokens = 0;
    if (chat) {
      for (const auto& m : body["messages"])
        prompt_tokens += int(m["content"].get<std::string>().size());
    } else if (body["prompt"].is_array()) {
      prompt_tokens = int(body["prompt"].size());
    } else {
      prompt_tokens = int(body["prompt"].get<std::string>().size());
    }
    int max_tokens = chat ? body.value("max_completion_tokens", 16) : body.value("max_tokens", 16);
    bool usage = body.contains("stream_options") &&
                 body["stream_options"].value("include_usage", false) && fault != Fault::no_usage;
    auto sent = std::make_shared<int>(0);
    int per = tokens_per_chunk;
    double delay = chunk_delay_s, stall = stall_s;
    std::string model_name = model;
    res.set_chunked_content_provider("text/event-stream", [=](size_t, httplib::DataSink& sink) {
      auto send = [&](const nlohmann::json& j) {
        std::string s = "data: " + j.dump() + "\n\n";
        return sink.write(s.data(), s.size());
      };
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      if (fault == Fault::stall) {
        std::this_thread::sleep_for(std::chrono::duration<double>(stall));
        return false;
      }
      if (fault == Fault::disconnect && *sent >= 2) return false;
      if (fault == Fault::error_event && *sent >= 1) {
        send({{"error", {{"message", "injected stream error"}, {"type", "server_error"}}}});
        std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      }
      int n = std::min(per, max_tokens - *sent);
      std::string text;
      for (int i = 0; i < n; ++i) text += " t" + std::to_string(*sent + i);
      *sent += n;
      nlohmann::json finish =
          *sent >= max_tokens ? nlohmann::json("length") : nlohmann::json(nullptr);
      nlohmann::json choice =
          chat ? nlohmann::json{{"index", 0},
                                {"delta", {{"content", text}}},
                                {"finish_reason", finish}}
               : nlohmann::json{{"index", 0}, {"text", text}, {"finish_reason", finish}};
      if (!send({{"id", "cmpl-1"}, {"model", model_name}, {"choices", {choice}}})) return false;
      if (*sent < max_tokens) return true;
      if (usage)
        send({{"id", "cmpl-1"},
              {"choices", nlohmann::json::array()},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", max_tokens},
                {"total_tokens", prompt_tokens + max_tokens}}}});
      std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    });
  }

  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::vector<nlohmann::json> bodies_;
};

}  // namespace sieve::bench::testing
