// The answer to a generation request, whole (one JSON body) or streamed (server-sent events),
// made a step at a time so that the transport drives it: a step takes what the engine has for
// the request's choices (waiting up to `wait` for the first that is running) and returns what to
// send now.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/output.h"

namespace sieve::server {

class Exchange;
class Http;

// Server-sent event of one JSON object.
std::string sse(const nlohmann::json& j);

class GenerationWriter {
 public:
  GenerationWriter(engine::Engine& engine, const text::Tokenizer& tok, std::string model_name,
                   std::shared_ptr<Generation> gen)
      : engine_(engine), tok_(tok), model_(std::move(model_name)), gen_(std::move(gen)) {}

  // A whole response: its body once every choice has finished, nullopt before. Throws
  // ApiError(500) when the generation failed.
  std::optional<nlohmann::json> full_step(std::chrono::milliseconds wait);
  // A stream: the events to write now (possibly none); the last step's end with [DONE].
  std::string stream_step(std::chrono::milliseconds wait);
  // After a failure once the stream's headers are out: an error event and [DONE].
  std::string stream_error(const std::string& message);
  // The stream has ended (or was given up): nothing more to write.
  bool done() const { return gen_->finished; }
  // The client went away: what still runs is aborted (its blocks are freed).
  void client_gone();
  const Generation& generation() const { return *gen_; }

 private:
  nlohmann::json chunk_base() const;
  nlohmann::json chunk(int index, const std::string& text, const nlohmann::json& lp,
                       const nlohmann::json& finish, const nlohmann::json& stop_reason,
                       bool with_role = false, const std::string& reasoning = {},
                       const nlohmann::json& tool_calls = nullptr) const;

  engine::Engine& engine_;
  const text::Tokenizer& tok_;
  std::string model_;
  std::shared_ptr<Generation> gen_;
};

// Answers a generation over `ex` without holding a thread while it runs: tokens arriving on any of
// its streams wake one step on the HTTP worker pool, which writes what is new (a stream) or, once
// every choice has finished, the whole response. A client that goes away aborts what still runs.
void serve_generation(Http& http, const std::shared_ptr<Exchange>& ex,
                      std::shared_ptr<GenerationWriter> w, bool stream);

}  // namespace sieve::server
