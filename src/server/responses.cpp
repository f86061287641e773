#include "server/responses.h"

#include <mutex>

#include "core/log.h"
#include "server/http.h"

namespace sieve::server {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

void GenerationWriter::client_gone() {
  if (!gen_->finished) {
    gen_->finished = true;
    abort_all(engine_, *gen_);
  }
}

std::optional<json> GenerationWriter::full_step(std::chrono::milliseconds wait) {
  Generation& gen = *gen_;
  const GenerateRequest& g = gen.g;
  // Wait on the first unfinished choice, then take what the others have.
  bool waited = false;
  for (Choice& c : gen.choices) {
    if (c.finished) continue;
    pump(engine_, g, c, waited ? 0ms : wait, nullptr, nullptr);
    waited = true;
  }
  if (!gen.all_finished()) return std::nullopt;
  gen.finished = true;
  for (const Choice& c : gen.choices)
    if (c.fin == engine::FinishReason::Error) {
      abort_all(engine_, gen);
      // An engine that can run no more steps (a tensor-parallel rank failed) is unavailable.
      const bool stopped = !engine_.stats().fatal_error.empty();
      throw ApiError(stopped ? 503 : 500, "generation failed: " + c.rs->error(), {},
                     stopped ? "service_unavailable" : "");
    }
  json choices = json::array();
  for (Choice& c : gen.choices) {
    const Output& out = *c.out;
    json choice;
    if (g.chat) {
      ChatText t = chat_text(g, c, out.text, false);
      // Content is null when the message is all reasoning, or all tool calls but blanks.
      const bool calls = !t.tool_calls.is_null();
      const bool null_content =
          (c.think && t.content.empty() && !t.reasoning.empty()) ||
          (calls && t.content.find_first_not_of(" \t\r\n") == std::string::npos);
      json message = {{"role", "assistant"},
                      {"content", null_content ? json(nullptr) : json(t.content)},
                      {"tool_calls", calls ? t.tool_calls : json::array()}};
      // `reasoning` as vLLM names it now, `reasoning_content` as older clients read it.
      if (c.think)
        message["reasoning"] = message["reasoning_content"] =
            t.reasoning.empty() ? json(nullptr) : json(t.reasoning);
      choice = {{"index", c.index},
                {"message", std::move(message)},
                {"logprobs", g.want_logprobs ? json{{"content", out.chat_lp}} : json(nullptr)},
                {"finish_reason", t.finish},
                {"stop_reason", stop_reason_of(c, g)}};
    } else {
      json lp = nullptr;
      if (g.want_logprobs)
        lp = g.params.prompt_logprobs >= 0
                 ? with_prompt_logprobs(prompt_logprobs_json(tok_, gen, c),
                                        out.completion_logprobs())
                 : out.completion_logprobs();
      choice = {{"index", c.index},
                {"text", gen.echo[c.prompt] + out.text},
                {"logprobs", lp},
                {"finish_reason", finish_name(c.fin, out.stopped_by_string)},
                {"stop_reason", stop_reason_of(c, g)}};
    }
    choices.push_back(std::move(choice));
  }
  return json{{"id", gen.id},
              {"object", g.chat ? "chat.completion" : "text_completion"},
              {"created", gen.created},
              {"model", model_},
              {"choices", std::move(choices)},
              {"usage", usage_json(gen.usage_prompt(), gen.usage_completion())}};
}

json GenerationWriter::chunk_base() const {
  return {{"id", gen_->id},
          {"object", gen_->g.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", gen_->created},
          {"model", model_}};
}

json GenerationWriter::chunk(int index, const std::string& text, const json& lp, const json& finish,
                             const json& stop_reason, bool with_role, const std::string& reasoning,
                             const json& tool_calls) const {
  const Generation& gen = *gen_;
  json c = chunk_base();
  json choice;
  if (gen.g.chat) {
    json delta = json::object();
    if (with_role) delta["role"] = "assistant";
    if (!reasoning.empty()) delta["reasoning"] = delta["reasoning_content"] = reasoning;
    if (with_role || !text.empty()) delta["content"] = text;
    if (!tool_calls.is_null()) delta["tool_calls"] = tool_calls;
    choice = {{"index", index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", finish}};
  } else {
    choice = {{"index", index}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish}};
  }
  if (!finish.is_null()) choice["stop_reason"] = stop_reason;
  c["choices"] = json::array({choice});
  // OpenAI: with include_usage every other chunk carries "usage": null.
  if (gen.g.continuous_usage)
    c["usage"] = usage_json(gen.usage_prompt(), gen.usage_completion());
  else if (gen.g.include_usage)
    c["usage"] = nullptr;
  return c;
}

std::string GenerationWriter::stream_error(const std::string& message) {
  client_gone();
  return sse(error_json(500, message)) + "data: [DONE]\n\n";
}

std::string GenerationWriter::stream_step(std::chrono::milliseconds wait) {
  Generation& gen = *gen_;
  const GenerateRequest& g = gen.g;
  std::string out;
  if (gen.finished) return out;
  if (!gen.started) {
    gen.started = true;
    for (const Choice& c : gen.choices) {
      if (g.chat) out += sse(chunk(c.index, "", nullptr, nullptr, nullptr, true));
      // With logprobs the echo waits for the prompt's log-probs (they come with the first token).
      if (!g.chat && !gen.echo[c.prompt].empty() && g.params.prompt_logprobs < 0)
        out += sse(chunk(c.index, gen.echo[c.prompt], nullptr, nullptr, nullptr));
    }
    return out;
  }
  bool waited = false;
  for (Choice& c : gen.choices) {
    if (c.finished) continue;
    std::string text;
    json lp = nullptr;
    if (g.want_logprobs)
      lp = g.chat ? json{{"content", json::array()}}
                  : json{{"text_offset", json::array()},
                         {"token_logprobs", json::array()},
                         {"tokens", json::array()},
                         {"top_logprobs", json::array()}};
    const int64_t before = c.out->completion_tokens;
    pump(engine_, g, c, waited ? 0ms : wait, &text,
         lp.is_null() ? nullptr : (g.chat ? &lp["content"] : &lp));
    waited = true;
    if (c.prompt_lp_in && !c.prompt_lp_out && g.params.prompt_logprobs >= 0) {
      c.prompt_lp_out = true;
      out += sse(
          chunk(c.index, gen.echo[c.prompt], prompt_logprobs_json(tok_, gen, c), nullptr, nullptr));
    }
    ChatText t = chat_text(g, c, std::move(text), true);
    text = std::move(t.content);
    const std::string& reasoning = t.reasoning;
    if (!c.finished) {
      const bool new_tokens = c.out->completion_tokens > before;
      if (!text.empty() || !reasoning.empty() || !t.tool_calls.is_null() ||
          (new_tokens && g.want_logprobs))
        out += sse(chunk(c.index, text, lp, nullptr, nullptr, false, reasoning, t.tool_calls));
      continue;
    }
    if (c.fin == engine::FinishReason::Error) {
      // The end of the whole stream: report and stop.
      return out + stream_error("generation failed: " + c.rs->error());
    }
    out += sse(
        chunk(c.index, text, lp, t.finish, stop_reason_of(c, g), false, reasoning, t.tool_calls));
  }
  if (!gen.all_finished()) return out;
  // Every choice has ended: usage, [DONE].
  gen.finished = true;
  if (g.include_usage) {
    json u = chunk_base();
    u["choices"] = json::array();
    u["usage"] = usage_json(gen.usage_prompt(), gen.usage_completion());
    out += sse(u);
  }
  return out + "data: [DONE]\n\n";
}

namespace {

// One generation being answered. Steps never overlap (run_mu_); a wake during a step queues one
// more. It keeps itself alive until the answer is complete or the client is gone.
class GenerationTask : public std::enable_shared_from_this<GenerationTask> {
 public:
  GenerationTask(Http& http, std::shared_ptr<Exchange> ex, std::shared_ptr<GenerationWriter> w,
                 bool stream)
      : http_(http), ex_(std::move(ex)), w_(std::move(w)), stream_(stream) {}

  void start() {
    self_ = shared_from_this();
    std::weak_ptr<GenerationTask> weak = self_;
    auto wake = [weak] {
      if (auto t = weak.lock()) t->schedule();
    };
    if (stream_) ex_->start_stream("text/event-stream");
    ex_->on_gone(wake);
    for (const Choice& c : w_->generation().choices) c.rs->set_waker(wake);
    schedule();
  }

  void schedule() {
    {
      std::lock_guard lk(queued_mu_);
      if (queued_) return;
      queued_ = true;
    }
    http_.post_task([self = shared_from_this()] { self->run(); });
  }

 private:
  void run() {
    {
      std::lock_guard lk(queued_mu_);
      queued_ = false;
    }
    std::lock_guard lk(run_mu_);
    if (ended_) return;
    if (ex_->gone()) {
      w_->client_gone();
      return finish();
    }
    try {
      if (stream_) {
        const bool first = !w_->generation().started;
        std::string out = w_->stream_step(std::chrono::milliseconds(0));
        // The opening step only writes the role chunks: take what is already there too.
        if (first) out += w_->stream_step(std::chrono::milliseconds(0));
        if (!out.empty() && !ex_->write(out)) w_->client_gone();
        if (w_->done()) finish();
      } else if (std::optional<nlohmann::json> body = w_->full_step(std::chrono::milliseconds(0))) {
        ex_->reply_json(200, *body);
        finish();
      }
    } catch (const ApiError& e) {
      w_->client_gone();
      ex_->reply_error(e.status, e.what(), e.param, e.type);
      finish();
    } catch (const std::exception& e) {
      SIEVE_LOG(Error, "generation " << w_->generation().id << ": " << e.what());
      if (stream_) {
        // The headers are out: report in the stream, then end it.
        ex_->write(w_->stream_error(std::string("internal error: ") + e.what()));
      } else {
        w_->client_gone();
        ex_->reply_error(500, std::string("internal error: ") + e.what());
      }
      finish();
    }
  }

  void finish() {
    ended_ = true;
    if (stream_)
      ex_->end();
    else if (!ex_->answered())
      ex_->reply_error(499, "the client closed the connection");
    self_.reset();  // the last step's caller still holds this task
  }

  Http& http_;
  std::shared_ptr<Exchange> ex_;
  std::shared_ptr<GenerationWriter> w_;
  bool stream_;
  std::shared_ptr<GenerationTask> self_;
  std::mutex queued_mu_, run_mu_;
  bool queued_ = false, ended_ = false;
};

}  // namespace

void serve_generation(Http& http, const std::shared_ptr<Exchange>& ex,
                      std::shared_ptr<GenerationWriter> w, bool stream) {
  std::make_shared<GenerationTask>(http, ex, std::move(w), stream)->start();
}

}  // namespace sieve::server
