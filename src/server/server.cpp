#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "server/constraints.h"
#include "server/http.h"
#include "server/output.h"
#include "server/protocol.h"
#include "server/reasoning.h"
#include "server/responses.h"
#include "server/tool_calls.h"
#include "server/web_ui.h"
#include "text/chat_template.h"

namespace sieve::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace std::chrono_literals;

namespace {

// /health answers 503 after this many engine steps failed in a row.
constexpr int64_t kUnhealthyFailedSteps = 3;

// The value of `key` in a query string ("a=1&since=2"), undecoded; "" when absent.
std::string query_param(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view kv = query.substr(0, amp);
    if (kv.substr(0, key.size()) == key && kv.size() > key.size() && kv[key.size()] == '=')
      return std::string(kv.substr(key.size() + 1));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {};
}

HttpOptions http_options(const ServerOptions& o) {
  HttpOptions h;
  h.limits.max_body_bytes = o.max_body_bytes;
  h.api_key = o.api_key;
  h.threads = o.http_threads;
  h.max_connections = o.max_connections;
  h.head_timeout_s = o.head_timeout_s;
  h.body_timeout_s = o.body_timeout_s;
  h.idle_timeout_s = o.idle_timeout_s;
  return h;
}

}  // namespace

// The routes: OpenAI's generation endpoints, tokenizer endpoints, models, health, metrics and the
// profiler switch.
struct Server::Impl {
  engine::Engine& engine;
  const text::Tokenizer& tok;
  ServerOptions opts;
  Server* owner;
  std::unique_ptr<WebUi> web;  // the chat page and dashboard (before http: its handlers use it)
  Http http;
  // The special tokens the chat parsers read (they stay in chat text, and forced tool calls may
  // use them).
  std::vector<int32_t> markers;
  GuidedConstraints constraints;

  Impl(engine::Engine& e, const text::Tokenizer& t, ServerOptions o, Server* s)
      : engine(e), tok(t), opts(std::move(o)), owner(s), http(http_options(opts)),
        markers(parser_marker_ids(t, opts.reasoning_parser, opts.tool_parser)), constraints(t, markers) {}

  const std::string& model_name() const { return opts.served_model_names.front(); }

  void check_model(const std::string& m) const {
    if (m.empty()) return;
    for (const auto& n : opts.served_model_names)
      if (n == m) return;
    throw ApiError(404, "The model `" + m + "` does not exist.", "model");
  }

  // The token ids of each prompt (chat: the rendered conversation); `texts` gets each prompt's
  // text where the response repeats it (chat; completions with echo).
  std::vector<std::vector<int32_t>> prompt_ids(const GenerateRequest& g,
                                               std::vector<std::string>* texts) const {
    std::vector<std::vector<int32_t>> out;
    try {
      if (g.chat) {
        std::string rendered = text::render_chat(
            tok, g.messages, g.tools.is_null() ? ojson() : g.tools, g.add_generation_prompt,
            g.chat_template_kwargs.is_null() ? ojson::object() : g.chat_template_kwargs);
        out.push_back(tok.encode(rendered, g.add_special_tokens));
        texts->push_back(std::move(rendered));
        return out;
      }
      for (const PromptInput& p : g.prompts) {
        if (!p.text) {
          // Ids of the model's padded vocabulary that have no token decode to nothing, as in
          // outputs.
          std::vector<int32_t> known;
          if (g.echo)
            for (int32_t id : p.ids)
              if (id < tok.vocab_size()) known.push_back(id);
          texts->push_back(g.echo ? tok.decode(known, g.skip_special_tokens) : std::string());
          out.push_back(p.ids);
        } else {
          texts->push_back(*p.text);
          out.push_back(tok.encode(*p.text, g.add_special_tokens));
        }
      }
      return out;
    } catch (const ApiError&) {
      throw;
    } catch (const Error& e) {
      throw ApiError(400, e.what(), g.chat ? "messages" : "prompt");
    }
  }

  void handle_generate(const std::shared_ptr<Exchange>& ex, bool chat) {
    const std::string& req_body = ex->request().body;
    if (owner->draining())
      throw ApiError(503, "the server is shutting down", {}, "service_unavailable");
    if (const std::string why = engine.stats().fatal_error; !why.empty())
      throw ApiError(503, "the engine stopped: " + why, {}, "service_unavailable");
    ojson body = parse_json_body(req_body);
    auto gen = std::make_shared<Generation>();
    gen->g = parse_generate_request(body, chat, opts.defaults);
    GenerateRequest& g = gen->g;
    check_model(g.model);
    // tool_choice "required" or a named function: the output is made to be calls (of any of the
    // tools, or of that one) whose parameters follow the tools' schemas (tool_call_grammar); the
    // tool parser then returns them.
    std::string forced_grammar;
    if (g.tool_choice == "required" || g.tool_choice.rfind("function:", 0) == 0) {
      if (opts.tool_parser.empty())
        throw ApiError(400,
                       "tool_choice \"" + g.tool_choice +
                           "\" needs --enable-auto-tool-choice --tool-call-parser",
                       "tool_choice");
      if (!g.guided.empty())
        throw ApiError(
            400, "tool_choice \"" + g.tool_choice + "\" cannot be combined with guided decoding",
            "tool_choice");
      std::vector<std::string> names = tool_names(g.tools);
      if (g.tool_choice != "required") {
        const std::string want = g.tool_choice.substr(9);
        if (std::find(names.begin(), names.end(), want) == names.end())
          throw ApiError(
              400, "tool_choice names \"" + want + "\", which is not among the request's tools",
              "tool_choice");
        names = {want};
      }
      if (names.empty()) throw ApiError(400, "tool_choice \"required\" needs tools", "tool_choice");
      forced_grammar = tool_call_grammar(names, g.tools, g.tool_choice == "required", opts.tool_parser);
    }
    std::vector<std::string> texts;
    const std::vector<std::vector<int32_t>> prompts = prompt_ids(g, &texts);
    // Prompt limits (empty, longer than the context) are the engine's to check: submit's Error
    // names them and becomes a 400 below.
    const int64_t max_len = engine.max_model_len();
    const std::string param = chat ? "messages" : "prompt";
    std::shared_ptr<const guided::OutputConstraint> constraint;
    if (!forced_grammar.empty())
      constraint = constraints.compiled("grammar", forced_grammar, "tool_choice");
    if (g.guided == "json_object") constraint = constraints.json_object();
    if (g.guided == "choice") constraint = constraints.choice(g.guided_choice);
    if (g.guided == "json_schema" || g.guided == "regex" || g.guided == "grammar")
      constraint = constraints.compiled(g.guided, g.guided_schema, g.guided_param);
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine::SamplingParams params = g.params;
      params.constraint = constraint;
      // With the reasoning parser, an output that starts in the reasoning would be constrained
      // from its first token, and the constrained text would count as reasoning.
      const ReasoningFormat& think = reasoning_format(opts.reasoning_parser);
      if (constraint && chat && !opts.reasoning_parser.empty() && prompt_opens_reasoning(think, texts[i]))
        throw ApiError(400, guided_in_reasoning_message(think),
                       forced_grammar.empty() ? g.guided_param : std::string("tool_choice"));
      if (!g.max_tokens_given) {
        // vLLM's defaults: completions 16 tokens, chat whatever the context leaves.
        const int64_t left = max_len - int64_t(prompts[i].size());
        params.max_tokens = chat ? left : std::min<int64_t>(16, left);
      }
      // The generation config's max_new_tokens caps every request, as in vLLM.
      if (opts.defaults.max_tokens > 0)
        params.max_tokens = std::min(params.max_tokens, opts.defaults.max_tokens);
      if (params.min_tokens > params.max_tokens) params.min_tokens = params.max_tokens;
      gen->prompt_ids.push_back(prompts[i]);
      gen->echo.push_back(g.echo ? texts[i] : std::string());
      for (int j = 0; j < g.n; ++j) {
        engine::SamplingParams pj = params;
        if (pj.has_seed) pj.seed += uint64_t(j);
        Choice c;
        c.index = int(i) * g.n + j;
        c.prompt = i;
        c.out = std::make_unique<Output>(tok, g, chat ? markers : std::vector<int32_t>());
        // With echo, the generated tokens' text offsets count from the end of the prompt's text.
        c.out->text_chars = code_points(gen->echo[i]);
        if (chat && !opts.reasoning_parser.empty())
          c.think = std::make_unique<ReasoningSplitter>(think, prompt_opens_reasoning(think, texts[i]));
        c.parse_tools = chat && !opts.tool_parser.empty() && g.tool_choice != "none";
        if (c.parse_tools) c.tool_stream = ToolCallStream(opts.tool_parser);
        try {
          c.rs = engine.submit(prompts[i], pj);
        } catch (const Error& e) {
          abort_all(engine, *gen);
          throw ApiError(400,
                         e.what() + (prompts.size() > 1 ? " (prompt " + std::to_string(i) + ")"
                                                        : std::string()),
                         param);
        }
        gen->choices.push_back(std::move(c));
      }
    }
    gen->id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(32);
    gen->created = unix_now();
    serve_generation(http, ex, std::make_shared<GenerationWriter>(engine, tok, model_name(), gen),
                     g.stream);
  }

  void handle_models(Exchange& res) {
    json data = json::array();
    for (const auto& n : opts.served_model_names)
      data.push_back({{"id", n},
                      {"object", "model"},
                      {"created", unix_now()},
                      {"owned_by", "sieve"},
                      {"root", opts.model_dir.empty() ? n : opts.model_dir},
                      {"parent", nullptr},
                      {"max_model_len", engine.max_model_len()},
                      {"permission", json::array()}});
    res.reply_json(200, {{"object", "list"}, {"data", data}});
  }

  void handle_tokenize(Exchange& res) {
    const std::string& req_body = res.request().body;
    ojson body = parse_json_body(req_body);
    if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
      if (!m->is_string()) throw ApiError(400, "model: expected a string", "model");
      check_model(m->get<std::string>());
    }
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
      GenerateRequest g = parse_generate_request(body, true, opts.defaults);
      std::vector<std::string> texts;
      ids = prompt_ids(g, &texts).front();
    } else {
      auto p = body.find("prompt");
      if (p == body.end() || !p->is_string())
        throw ApiError(400, "prompt: expected a string", "prompt");
      bool add = true;
      if (auto a = body.find("add_special_tokens"); a != body.end() && !a->is_null()) {
        if (!a->is_boolean())
          throw ApiError(400, "add_special_tokens: expected a boolean", "add_special_tokens");
        add = a->get<bool>();
      }
      try {
        ids = tok.encode(p->get<std::string>(), add);
      } catch (const Error& e) {
        throw ApiError(400, e.what(), "prompt");
      }
    }
    res.reply_json(200, {{"count", ids.size()},
                         {"max_model_len", engine.max_model_len()},
                         {"tokens", ids},
                         {"token_strs", nullptr}});
  }

  void handle_detokenize(Exchange& res) {
    const std::string& req_body = res.request().body;
    ojson body = parse_json_body(req_body);
    if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
      if (!m->is_string()) throw ApiError(400, "model: expected a string", "model");
      check_model(m->get<std::string>());
    }
    auto t = body.find("tokens");
    if (t == body.end() || !t->is_array())
      throw ApiError(400, "tokens: expected an array of token ids", "tokens");
    std::vector<int32_t> ids;
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& v = (*t)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= engine.vocab_size())
        throw ApiError(400,
                       "tokens[" + std::to_string(i) + "]: " + v.dump() +
                           " is not a token id of this model (0.." +
                           std::to_string(engine.vocab_size() - 1) + ")",
                       "tokens");
      // Ids of the model's padded vocabulary that have no token decode to nothing, as in outputs.
      if (v.get<int64_t>() < tok.vocab_size()) ids.push_back(int32_t(v.get<int64_t>()));
    }
    std::string text;
    try {
      text = tok.decode(ids, true);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "tokens");
    }
    res.reply_json(200, {{"prompt", text}});
  }

  void handle_profile(Exchange& res, bool start) {
    if (opts.profiler_dir.empty())
      throw ApiError(400, "profiling is off: start the server with --profiler-dir DIR");
    if (start) {
      engine.start_profile();
      res.reply_json(200, {{"status", "profiling"}});
      return;
    }
    if (!engine.profiling())
      throw ApiError(400, "no profile is running: POST /start_profile first");
    std::string trace = engine.stop_profile();
    std::filesystem::create_directories(opts.profiler_dir);
    const std::string path =
        (std::filesystem::path(opts.profiler_dir) /
         ("sieve-trace-" + std::to_string(unix_now()) + "-" + random_hex(6) + ".json"))
            .string();
    std::ofstream f(path);
    f << trace;
    if (!f) throw ApiError(500, "could not write the trace to " + path);
    SIEVE_LOG(Info, "profile written to " << path);
    res.reply_json(200, {{"status", "stopped"}, {"trace", path}});
  }

  void setup() {
    using Ex = std::shared_ptr<Exchange>;
    http.post("/v1/completions", [this](const Ex& ex) { handle_generate(ex, false); });
    http.post("/v1/chat/completions", [this](const Ex& ex) { handle_generate(ex, true); });
    http.get("/v1/models", [this](const Ex& ex) { handle_models(*ex); });
    http.get("/health", [this](const Ex& ex) {
      if (owner->draining()) throw ApiError(503, "the server is shutting down");
      // A device that fails step after step (a lost GPU context) is not healthy; one bad step is.
      const engine::EngineStats st = engine.stats();
      if (!st.fatal_error.empty()) throw ApiError(503, "the engine stopped: " + st.fatal_error);
      if (st.consecutive_failed_steps >= kUnhealthyFailedSteps)
        throw ApiError(503, "the engine's last " + std::to_string(st.consecutive_failed_steps) +
                                " steps failed: " + st.last_step_error);
      ex->reply(200, "", "");
    });
    http.get("/ping", [](const Ex& ex) { ex->reply(200, "", ""); });
    http.get("/version", [](const Ex& ex) { ex->reply_json(200, {{"version", "0.1.0"}}); });
    http.get("/metrics", [this](const Ex& ex) {
      ex->reply(200, "text/plain; version=0.0.4; charset=utf-8",
                prometheus_text(engine.stats(), model_name()));
    });
    if (opts.web_ui) {
      web = std::make_unique<WebUi>(engine, opts);
      auto page = [this](const Ex& ex) {
        const HttpRequest& q = ex->request();
        auto w = web->get(q.path, query_param(q.query, "since"), q.header("If-None-Match"));
        if (!w) throw ApiError(404, "Not Found: GET " + q.path);
        ex->reply(w->status, w->status == 304 ? std::string() : w->content_type,
                  w->status == 304 ? std::string() : w->body, w->headers);
      };
      for (const char* path : {"/", "/dashboard", "/ui/info", "/ui/metrics"}) http.get(path, page);
      http.get_prefix("/assets/", page);
    }
    http.post("/tokenize", [this](const Ex& ex) { handle_tokenize(*ex); });
    http.post("/detokenize", [this](const Ex& ex) { handle_detokenize(*ex); });
    // As vLLM's: no body needed (curl -X POST).
    http.post(
        "/start_profile", [this](const Ex& ex) { handle_profile(*ex, true); }, false);
    http.post(
        "/stop_profile", [this](const Ex& ex) { handle_profile(*ex, false); }, false);
  }
};

Server::Server(engine::Engine& engine, const text::Tokenizer& tok, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, tok, std::move(opts), this)) {
  if (impl_->opts.served_model_names.empty()) impl_->opts.served_model_names = {"sieve"};
  impl_->setup();
}

Server::~Server() {
  shutdown();
}

void Server::add_static(const std::string& path, std::string content_type, std::string body) {
  impl_->http.get_static(path, std::move(content_type), std::move(body));
}

void Server::bind() {
  port_ = impl_->http.bind(impl_->opts.host, impl_->opts.port);
}

void Server::run() {
  impl_->http.run();
}

void Server::shutdown() {
  std::lock_guard lk(shutdown_mu_);
  if (draining_.exchange(true)) return;
  auto& e = impl_->engine;
  // New generation requests now get 503; running ones may finish within the grace period.
  if (!e.wait_idle(std::chrono::milliseconds(int64_t(impl_->opts.shutdown_grace_s * 1000)))) {
    SIEVE_LOG(Info,
              "aborting requests still running after " << impl_->opts.shutdown_grace_s << " s");
    e.abort_all();
    e.wait_idle(2s);
  }
  // Let handlers and streams write their last chunks before the listener goes (a stream
  // counts until its provider is released, which is after its last chunk).
  for (int i = 0; i < 150 && impl_->http.in_flight.load() > 0; ++i)
    std::this_thread::sleep_for(10ms);
  impl_->http.stop();
}

}  // namespace sieve::server
