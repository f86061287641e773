#include "server/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "guided/guided.h"
#include "server/stop_strings.h"
#include "server/protocol.h"
#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "server/web_ui.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"

namespace sieve::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace std::chrono_literals;

namespace {

std::string random_hex(int n) {
  thread_local std::mt19937_64 rng{
      std::random_device{}() ^ uint64_t(std::hash<std::thread::id>{}(std::this_thread::get_id()))};
  static const char* d = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < n; ++i) s += d[rng() & 15];
  return s;
}

int64_t unix_now() {
  return int64_t(std::time(nullptr));
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& msg,
                const std::string& param = {}) {
  send_json(res, status, error_json(status, msg, param));
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string addr_str(const sockaddr_storage& a, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    *port = ntohs(v6->sin6_port);
  } else {
    *port = -1;
  }
  return buf;
}

// The socket of this request's connection. httplib 0.11 does not hand it to handlers, and the
// only way to notice a client that went away while nothing is being written (a request still
// queued or prefilling, a non-streaming request) is to look at the socket itself.
int find_client_socket(const httplib::Request& req) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (*end != 0 || fd < 0) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    int lport = -1, pport = -1;
    addr_str(local, &lport);
    const std::string paddr = addr_str(peer, &pport);
    if (lport == req.local_port && pport == req.remote_port && paddr == req.remote_addr) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

// True when the peer closed the connection (EOF or a socket error); pending bytes of a pipelined
// request mean it is still there.
bool peer_gone(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;
}

// httplib serves a connection on one pool thread for as long as it stays open (keep-alive
// included), so a fixed pool stalls new clients behind idle connections under load. This pool
// starts a thread whenever every thread is busy, up to a cap, as a thread-per-connection server
// with a bound would.
class GrowingPool : public httplib::TaskQueue {
 public:
  explicit GrowingPool(size_t max_threads) : max_(max_threads) {}
  ~GrowingPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < max_)
      threads_.emplace_back([this] { work(); });
    else
      cv_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    std::unique_lock lk(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      fn();
      lk.lock();
    }
  }
  size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

// Characters (code points) of UTF-8 text: text offsets count them, as Python's str does in vLLM.
int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

// Per-request output assembly: detokenize, match stop strings, collect logprobs.
struct Output {
  const text::Tokenizer& tok;
  text::StreamDecoder dec;
  StopStringMatcher stop;
  bool include_stop;
  bool chat;
  bool want_logprobs;
  bool ids_as_tokens;
  int64_t min_tokens;
  int64_t completion_tokens = 0;
  bool stopped_by_string = false;
  std::string text;  // everything emitted so far
  int64_t text_chars = 0;
  int32_t last_token = -1;
  json stop_reason = nullptr;
  // Completions logprobs (legacy format) or chat logprobs content entries, for what was emitted.
  json lp_tokens = json::array(), lp_values = json::array(), lp_top = json::array(),
       lp_offsets = json::array();
  json chat_lp = json::array();

  Output(const text::Tokenizer& t, const GenerateRequest& g)
      : tok(t),
        dec(t, g.skip_special_tokens),
        stop(g.stop),
        include_stop(g.include_stop_str_in_output),
        chat(g.chat),
        want_logprobs(g.want_logprobs),
        ids_as_tokens(g.return_tokens_as_token_ids),
        min_tokens(g.params.min_tokens) {}

  // A model's vocabulary may be larger than its tokenizer's (padded embeddings); ids without a
  // token decode to nothing rather than failing the request.
  bool known(int32_t id) const { return id >= 0 && id < tok.vocab_size(); }
  std::string token_str(int32_t id) const {
    if (ids_as_tokens) return "token_id:" + std::to_string(id);
    return known(id) ? tok.decode({id}, false) : std::string();
  }
  json token_bytes(int32_t id) const {
    json b = json::array();
    if (known(id))
      for (unsigned char c : tok.token_bytes(id)) b.push_back(int(c));
    return b;
  }

  // Feeds one token; returns the text it releases. Sets stopped_by_string on a match.
  std::string push(const engine::TokenOutput& t, json* lp_delta) {
    ++completion_tokens;
    last_token = t.token;
    std::string piece = known(t.token) ? dec.push(t.token) : std::string();
    // As vLLM: stop strings count only once min_tokens tokens were generated.
    std::string out =
        completion_tokens >= min_tokens ? stop.push(piece) : stop.push_unchecked(piece);
    if (stop.stopped()) {
      stopped_by_string = true;
      stop_reason = stop.matched();
      if (include_stop) out += stop.matched();
    }
    if (want_logprobs) {
      if (chat) {
        json e = {
            {"token", token_str(t.token)}, {"logprob", t.logprob}, {"bytes", token_bytes(t.token)}};
        json top = json::array();
        for (const auto& a : t.top)
          top.push_back({{"token", token_str(a.token)},
                         {"logprob", a.logprob},
                         {"bytes", token_bytes(a.token)}});
        e["top_logprobs"] = top;
        chat_lp.push_back(e);
        if (lp_delta) lp_delta->push_back(e);
      } else {
        json top = json::object();
        for (const auto& a : t.top) top[token_str(a.token)] = a.logprob;
        const std::string ts = token_str(t.token);
        lp_tokens.push_back(ts);
        lp_values.push_back(t.logprob);
        lp_top.push_back(top);
        lp_offsets.push_back(text_chars);
        if (lp_delta) {
          (*lp_delta)["tokens"].push_back(ts);
          (*lp_delta)["token_logprobs"].push_back(t.logprob);
          (*lp_delta)["top_logprobs"].push_back(top);
          (*lp_delta)["text_offset"].push_back(text_chars);
        }
      }
    }
    append(out);
    return out;
  }
  // Offsets count characters (code points), as Python's str does in vLLM, not bytes.
  void append(const std::string& s) {
    text += s;
    text_chars += code_points(s);
  }
  // End of generation: what the decoder and the stop matcher still hold.
  std::string finish() {
    if (stopped_by_string) return {};
    std::string out = stop.push(dec.flush());
    if (stop.stopped()) {
      stopped_by_string = true;
      stop_reason = stop.matched();
      if (include_stop) out += stop.matched();
    } else {
      out += stop.flush();
    }
    append(out);
    return out;
  }
  json completion_logprobs() const {
    return {{"text_offset", lp_offsets},
            {"token_logprobs", lp_values},
            {"tokens", lp_tokens},
            {"top_logprobs", lp_top}};
  }
};

// /health answers 503 after this many engine steps failed in a row.
constexpr int64_t kUnhealthyFailedSteps = 3;

struct Server::Impl {
  engine::Engine& engine;
  const text::Tokenizer& tok;
  ServerOptions opts;
  httplib::Server http;
  Server* owner;
  std::atomic<int> in_flight{0};
  std::unique_ptr<WebUi> web;  // the chat page and dashboard

  Impl(engine::Engine& e, const text::Tokenizer& t, ServerOptions o, Server* s)
      : engine(e), tok(t), opts(std::move(o)), owner(s) {}

  const std::string& model_name() const { return opts.served_model_names.front(); }

  // Guided decoding's view of the vocabulary: each token's bytes; special tokens none (they never
  // belong to a constrained output; end-of-sequence is the constraint's own business).
  std::shared_ptr<const guided::TokenBytes> guided_vocab() {
    std::call_once(vocab_once, [this] {
      auto v = std::make_shared<guided::TokenBytes>(size_t(tok.vocab_size()));
      for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (!tok.is_special(id)) (*v)[size_t(id)] = tok.token_bytes(id);
      vocab_bytes = std::move(v);
    });
    return vocab_bytes;
  }
  std::once_flag vocab_once;
  std::shared_ptr<const guided::TokenBytes> vocab_bytes;
  // One JSON constraint serves every request (its states are per request).
  std::shared_ptr<const guided::OutputConstraint> guided_json() {
    std::call_once(json_once, [this] { json_constraint = guided::json_object_constraint(guided_vocab()); });
    return json_constraint;
  }
  std::once_flag json_once;
  std::shared_ptr<const guided::OutputConstraint> json_constraint;
  // Compiled schemas and patterns by their text (clients tend to send the same few again and again).
  std::shared_ptr<const guided::OutputConstraint> guided_compiled(const std::string& kind, const std::string& text,
                                                                  const std::string& param) {
    const std::string key = kind + ":" + text;
    {
      std::lock_guard lk(schema_mu);
      if (auto it = schemas.find(key); it != schemas.end()) return it->second;
    }
    std::shared_ptr<const guided::OutputConstraint> c;
    try {
      c = kind == "regex"     ? guided::regex_constraint(guided_vocab(), text)
          : kind == "grammar" ? guided::grammar_constraint(guided_vocab(), text)
                              : guided::json_schema_constraint(guided_vocab(), text);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), param);
    }
    std::lock_guard lk(schema_mu);
    if (schemas.size() >= 64) schemas.clear();
    schemas.emplace(key, c);
    return c;
  }
  std::mutex schema_mu;
  std::map<std::string, std::shared_ptr<const guided::OutputConstraint>> schemas;

  void check_model(const std::string& m) const {
    if (m.empty()) return;
    for (const auto& n : opts.served_model_names)
      if (n == m) return;
    throw ApiError(404, "The model `" + m + "` does not exist.", "model");
  }

  // The token ids of each prompt (chat: the rendered conversation); `texts` gets each prompt's
  // text where the response repeats it (chat; completions with echo).
  std::vector<std::vector<int32_t>> prompt_ids(const GenerateRequest& g, std::vector<std::string>* texts) const {
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
          // Ids of the model's padded vocabulary that have no token decode to nothing, as in outputs.
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

  // One choice of a request: sample j of prompt i is choice i * n + j.
  struct Choice {
    int index = 0;
    size_t prompt = 0;
    std::shared_ptr<engine::RequestStream> rs;
    std::unique_ptr<Output> out;
    engine::FinishReason fin = engine::FinishReason::None;
    bool finished = false;  // no more tokens will come (fin is final)
    // echo with logprobs: the prompt's log-probs (positions 1, 2, ...), with the first token.
    std::vector<engine::PromptTokenLogprob> prompt_lp;
    bool prompt_lp_in = false;   // they arrived
    bool prompt_lp_out = false;  // streaming: the echo chunk that carries them was written
    std::unique_ptr<ReasoningSplitter> think;  // chat with --reasoning-parser
    // Chat with --tool-call-parser and a tool_choice other than "none": the content through the parser.
    bool parse_tools = false;
    ToolCallStream tool_stream;
  };

  // A request's choices and what its responses repeat.
  struct Generation {
    GenerateRequest g;
    std::vector<Choice> choices;
    std::vector<std::vector<int32_t>> prompt_ids;  // per prompt
    std::vector<std::string> echo;  // per prompt: the text a completion with echo repeats
    std::string id;
    int64_t created = 0;
    int client_fd = -1;
    bool started = false, finished = false;

    int64_t usage_prompt() const {
      int64_t n = 0;
      for (const auto& ids : prompt_ids) n += int64_t(ids.size());
      return n;
    }
    int64_t usage_completion() const {
      int64_t n = 0;
      for (const Choice& c : choices) n += c.out->completion_tokens;
      return n;
    }
    bool all_finished() const {
      for (const Choice& c : choices)
        if (!c.finished) return false;
      return true;
    }
  };

  void abort_all(Generation& gen, engine::FinishReason why = engine::FinishReason::Abort) {
    for (Choice& c : gen.choices)
      if (!c.finished) {
        c.finished = true;
        c.fin = why;
        engine.abort(c.rs->id(), why);
      }
  }

  // Takes what a choice's stream has (waiting up to `wait`); true when it produced anything
  // (tokens or its end). `lp_delta`: streaming logprobs of the new tokens; `text`: their text.
  bool pump(const GenerateRequest& g, Choice& c, std::chrono::milliseconds wait, std::string* text,
            json* lp_delta) {
    if (c.finished) return false;
    std::vector<engine::TokenOutput> toks;
    const engine::FinishReason fin = c.rs->next(toks, wait);
    for (auto& t : toks) {
      if (&t == &toks.front() && !c.prompt_lp_in && c.out->completion_tokens == 0) {
        c.prompt_lp = std::move(t.prompt);
        c.prompt_lp_in = true;
      }
      if (g.prompt_only) continue;  // echo with max_tokens 0: the generated token is left out
      const std::string piece = c.out->push(t, lp_delta);
      if (text) *text += piece;
      if (c.out->stopped_by_string) break;
    }
    if (c.out->stopped_by_string) {
      engine.abort(c.rs->id(), engine::FinishReason::Stop);
      c.fin = engine::FinishReason::Stop;
      c.finished = true;
    } else if (fin != engine::FinishReason::None) {
      c.fin = fin;
      c.finished = true;
      const std::string rest = c.out->finish();
      if (text) *text += rest;
    }
    return !toks.empty() || c.finished;
  }

  // The stop reason of a finished choice: the matched stop string, or the stop token id that
  // ended it (not EOS alone), as vLLM reports.
  static json stop_reason_of(const Choice& c, const GenerateRequest& g) {
    json stop_reason = c.out->stop_reason;
    if (stop_reason.is_null() && c.fin == engine::FinishReason::Stop) {
      const int32_t last = c.out->last_token;
      if (std::find(g.params.stop_token_ids.begin(), g.params.stop_token_ids.end(), last) !=
          g.params.stop_token_ids.end())
        stop_reason = last;
    }
    return stop_reason;
  }

  void handle_generate(const httplib::Request& req, const std::string& req_body,
                       httplib::Response& res, bool chat) {
    if (owner->draining())
      throw ApiError(503, "the server is shutting down", {}, "service_unavailable");
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
        throw ApiError(400, "tool_choice \"" + g.tool_choice + "\" needs --enable-auto-tool-choice --tool-call-parser",
                       "tool_choice");
      if (!g.guided.empty())
        throw ApiError(400, "tool_choice \"" + g.tool_choice + "\" cannot be combined with guided decoding", "tool_choice");
      std::vector<std::string> names = tool_names(g.tools);
      if (g.tool_choice != "required") {
        const std::string want = g.tool_choice.substr(9);
        if (std::find(names.begin(), names.end(), want) == names.end())
          throw ApiError(400, "tool_choice names \"" + want + "\", which is not among the request's tools", "tool_choice");
        names = {want};
      }
      if (names.empty()) throw ApiError(400, "tool_choice \"required\" needs tools", "tool_choice");
      forced_grammar = tool_call_grammar(names, g.tools, g.tool_choice == "required");
    }
    std::vector<std::string> texts;
    const std::vector<std::vector<int32_t>> prompts = prompt_ids(g, &texts);
    // Prompt limits (empty, longer than the context) are the engine's to check: submit's Error
    // names them and becomes a 400 below.
    const int64_t max_len = engine.max_model_len();
    const std::string param = chat ? "messages" : "prompt";
    std::shared_ptr<const guided::OutputConstraint> constraint;
    if (!forced_grammar.empty()) constraint = guided_compiled("grammar", forced_grammar, "tool_choice");
    if (g.guided == "json_object") constraint = guided_json();
    if (g.guided == "choice") constraint = guided::choice_constraint(guided_vocab(), g.guided_choice);
    if (g.guided == "json_schema" || g.guided == "regex" || g.guided == "grammar")
      constraint = guided_compiled(g.guided, g.guided_schema, g.guided_param);
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine::SamplingParams params = g.params;
      params.constraint = constraint;
      // With the reasoning parser, an output that starts in the reasoning would be constrained
      // from its first token, and the constrained text would count as reasoning.
      if (constraint && chat && !opts.reasoning_parser.empty() && prompt_opens_reasoning(texts[i]))
        throw ApiError(400,
                       "guided decoding with thinking on is not supported: the whole output is constrained, "
                       "so it would all be reasoning; set chat_template_kwargs.enable_thinking to false",
                       forced_grammar.empty() ? g.guided_param : std::string("tool_choice"));
      if (!g.max_tokens_given) {
        // vLLM's defaults: completions 16 tokens, chat whatever the context leaves.
        const int64_t left = max_len - int64_t(prompts[i].size());
        params.max_tokens = chat ? left : std::min<int64_t>(16, left);
      }
      // The generation config's max_new_tokens caps every request, as in vLLM.
      if (opts.defaults.max_tokens > 0) params.max_tokens = std::min(params.max_tokens, opts.defaults.max_tokens);
      if (params.min_tokens > params.max_tokens) params.min_tokens = params.max_tokens;
      gen->prompt_ids.push_back(prompts[i]);
      gen->echo.push_back(g.echo ? texts[i] : std::string());
      for (int j = 0; j < g.n; ++j) {
        engine::SamplingParams pj = params;
        if (pj.has_seed) pj.seed += uint64_t(j);
        Choice c;
        c.index = int(i) * g.n + j;
        c.prompt = i;
        c.out = std::make_unique<Output>(tok, g);
        // With echo, the generated tokens' text offsets count from the end of the prompt's text.
        c.out->text_chars = code_points(gen->echo[i]);
        if (chat && !opts.reasoning_parser.empty())
          c.think = std::make_unique<ReasoningSplitter>(prompt_opens_reasoning(texts[i]));
        c.parse_tools = chat && !opts.tool_parser.empty() && g.tool_choice != "none";
        try {
          c.rs = engine.submit(prompts[i], pj);
        } catch (const Error& e) {
          abort_all(*gen);
          throw ApiError(400, e.what() + (prompts.size() > 1 ? " (prompt " + std::to_string(i) + ")" : std::string()),
                         param);
        }
        gen->choices.push_back(std::move(c));
      }
    }
    gen->id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(32);
    gen->created = unix_now();
    gen->client_fd = find_client_socket(req);
    if (g.stream)
      stream_response(res, gen);
    else
      full_response(res, *gen);
  }

  // OpenAI's tool_calls: arguments as a JSON string.
  static json tool_calls_json(const std::vector<ParsedToolCall>& calls) {
    json out = json::array();
    for (const ParsedToolCall& call : calls)
      out.push_back({{"id", "call_" + random_hex(24)},
                     {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", call.arguments.dump()}}}});
    return out;
  }

  // A stream's tool_calls delta: each call numbered (index); its first piece with an id, the type
  // and the name, the later ones with more of its arguments.
  static json tool_call_pieces_json(const std::vector<ToolCallDelta>& pieces) {
    json out = json::array();
    for (const ToolCallDelta& d : pieces) {
      json call = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
      if (d.first) {
        call["id"] = "call_" + random_hex(24);
        call["type"] = "function";
        call["function"]["name"] = d.name;
      }
      out.push_back(std::move(call));
    }
    return out;
  }

  // A choice's new text through the reasoning splitter and the tool-call parser, where they are
  // on: what goes out now as reasoning, content and tool calls and, once the choice has finished,
  // its finish reason. Streams pass each piece (and get the calls' new pieces, numbered), a full
  // response the whole text (and gets the calls whole once finished).
  struct ChatText {
    std::string reasoning, content;
    json tool_calls = nullptr;  // when there are calls (a stream: their new pieces)
    json finish = nullptr;      // once finished
  };
  ChatText chat_text(const GenerateRequest& g, Choice& c, std::string text, bool stream) const {
    ChatText t;
    if (c.think) {
      ReasoningSplitter::Piece p = c.think->push(text);
      if (c.finished) {
        ReasoningSplitter::Piece rest = c.think->finish();
        p.reasoning += rest.reasoning;
        p.content += rest.content;
      }
      text = std::move(p.content);
      t.reasoning = std::move(p.reasoning);
    }
    if (c.finished) t.finish = finish_name(c.fin, c.out->stopped_by_string);
    if (c.parse_tools) {
      // Content up to a tool-call opening goes out as it comes; the calls in pieces as they come
      // (streams) or whole at the end.
      text = c.tool_stream.push(text);
      if (stream) {
        std::vector<ToolCallDelta> pieces = c.tool_stream.take_calls(g.tools, c.finished);
        if (!pieces.empty()) t.tool_calls = tool_call_pieces_json(pieces);
        if (c.finished) {
          text += c.tool_stream.finish_content(c.tool_stream.calls_begun());
          if (c.tool_stream.calls_begun()) t.finish = "tool_calls";
        }
      } else if (c.finished) {
        ToolCallParse tp = c.tool_stream.finish(g.tools);
        text += tp.content;
        if (!tp.calls.empty()) {
          t.tool_calls = tool_calls_json(tp.calls);
          t.finish = "tool_calls";
        }
      }
    }
    t.content = std::move(text);
    return t;
  }

  static const char* finish_name(engine::FinishReason f, bool stopped_by_string) {
    if (stopped_by_string) return "stop";
    switch (f) {
      case engine::FinishReason::Stop:
        return "stop";
      case engine::FinishReason::Length:
        return "length";
      default:
        return "abort";
    }
  }

  json usage(int64_t prompt, int64_t completion) const {
    return {{"prompt_tokens", prompt},
            {"total_tokens", prompt + completion},
            {"completion_tokens", completion},
            {"prompt_tokens_details", nullptr}};
  }

  // Completions logprobs of a choice's prompt (echo with logprobs): its tokens, their log-probs
  // (the first null) and alternatives, and their offsets in the echoed text.
  json prompt_logprobs_json(const Generation& gen, const Choice& c) const {
    const std::vector<int32_t>& ids = gen.prompt_ids[c.prompt];
    json tokens = json::array(), values = json::array(), top = json::array(), offsets = json::array();
    text::StreamDecoder dec(tok, gen.g.skip_special_tokens);
    int64_t chars = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      tokens.push_back(c.out->token_str(ids[i]));
      offsets.push_back(chars);
      if (c.out->known(ids[i])) chars += code_points(dec.push(ids[i]));
      if (i == 0 || i - 1 >= c.prompt_lp.size()) {
        values.push_back(nullptr);
        top.push_back(nullptr);
        continue;
      }
      const engine::PromptTokenLogprob& e = c.prompt_lp[i - 1];
      values.push_back(e.logprob);
      json alts = json::object();
      for (const auto& a : e.top) alts[c.out->token_str(a.token)] = a.logprob;
      top.push_back(alts);
    }
    return {{"text_offset", offsets}, {"token_logprobs", values}, {"tokens", tokens}, {"top_logprobs", top}};
  }

  // The prompt's completions logprobs followed by the generated tokens' (`lp`).
  static json with_prompt_logprobs(json prompt, const json& lp) {
    for (const char* k : {"text_offset", "token_logprobs", "tokens", "top_logprobs"})
      for (const auto& v : lp[k]) prompt[k].push_back(v);
    return prompt;
  }

  void full_response(httplib::Response& res, Generation& gen) {
    const GenerateRequest& g = gen.g;
    while (!gen.all_finished()) {
      // Wait on the first unfinished choice, then take what the others have.
      bool waited = false;
      for (Choice& c : gen.choices) {
        if (c.finished) continue;
        pump(g, c, waited ? 0ms : 100ms, nullptr, nullptr);
        waited = true;
      }
      if (!gen.all_finished() && peer_gone(gen.client_fd)) {
        abort_all(gen);
        res.set_header("Connection", "close");
        send_error(res, 499, "the client closed the connection");
        return;
      }
    }
    for (const Choice& c : gen.choices)
      if (c.fin == engine::FinishReason::Error) {
        abort_all(gen);
        throw ApiError(500, "generation failed: " + c.rs->error());
      }
    json choices = json::array();
    for (Choice& c : gen.choices) {
      const Output& out = *c.out;
      json choice;
      if (g.chat) {
        ChatText t = chat_text(g, c, out.text, false);
        // Content is null when the message is all reasoning, or all tool calls but blanks.
        const bool calls = !t.tool_calls.is_null();
        const bool null_content = (c.think && t.content.empty() && !t.reasoning.empty()) ||
                                  (calls && t.content.find_first_not_of(" \t\r\n") == std::string::npos);
        json message = {{"role", "assistant"},
                        {"content", null_content ? json(nullptr) : json(t.content)},
                        {"tool_calls", calls ? t.tool_calls : json::array()}};
        // `reasoning` as vLLM names it now, `reasoning_content` as older clients read it.
        if (c.think)
          message["reasoning"] = message["reasoning_content"] = t.reasoning.empty() ? json(nullptr) : json(t.reasoning);
        choice = {{"index", c.index},
                  {"message", std::move(message)},
                  {"logprobs", g.want_logprobs ? json{{"content", out.chat_lp}} : json(nullptr)},
                  {"finish_reason", t.finish},
                  {"stop_reason", stop_reason_of(c, g)}};
      } else {
        json lp = nullptr;
        if (g.want_logprobs)
          lp = g.params.prompt_logprobs >= 0
                   ? with_prompt_logprobs(prompt_logprobs_json(gen, c), out.completion_logprobs())
                   : out.completion_logprobs();
        choice = {{"index", c.index},
                  {"text", gen.echo[c.prompt] + out.text},
                  {"logprobs", lp},
                  {"finish_reason", finish_name(c.fin, out.stopped_by_string)},
                  {"stop_reason", stop_reason_of(c, g)}};
      }
      choices.push_back(std::move(choice));
    }
    json body = {{"id", gen.id},
                 {"object", g.chat ? "chat.completion" : "text_completion"},
                 {"created", gen.created},
                 {"model", model_name()},
                 {"choices", std::move(choices)},
                 {"usage", usage(gen.usage_prompt(), gen.usage_completion())}};
    send_json(res, 200, body);
  }

  void stream_response(httplib::Response& res, std::shared_ptr<Generation> gen) {
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, gen](size_t, httplib::DataSink& sink) {
          try {
            return stream_step(*gen, sink);
          } catch (const std::exception& e) {
            // Headers are out: report in the stream, then end it.
            SIEVE_LOG(Error, "stream " << gen->id << ": " << e.what());
            const std::string msg =
                sse(error_json(500, std::string("internal error: ") + e.what())) +
                "data: [DONE]\n\n";
            sink.write(msg.data(), msg.size());
            abort_stream(*gen);
            sink.done();
            return true;
          }
        },
        [this, gen](bool) {
          // The client went away (or the server stops) before the end: free the blocks now.
          if (!gen->finished) {
            gen->finished = true;
            abort_all(*gen);
          }
          --in_flight;
        });
    ++in_flight;  // until the stream is written out: shutdown waits for it
  }

  json chunk_base(const Generation& gen) const {
    return {{"id", gen.id},
            {"object", gen.g.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", gen.created},
            {"model", model_name()}};
  }

  json chunk(const Generation& gen, int index, const std::string& text, const json& lp, const json& finish,
             const json& stop_reason, bool with_role = false, const std::string& reasoning = {},
             const json& tool_calls = nullptr) const {
    json c = chunk_base(gen);
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
      c["usage"] = usage(gen.usage_prompt(), gen.usage_completion());
    else if (gen.g.include_usage)
      c["usage"] = nullptr;
    return c;
  }

  bool stream_step(Generation& gen, httplib::DataSink& sink) {
    auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
    const GenerateRequest& g = gen.g;
    if (gen.finished) {
      sink.done();
      return true;
    }
    if (!gen.started) {
      gen.started = true;
      for (const Choice& c : gen.choices) {
        if (g.chat && !write(sse(chunk(gen, c.index, "", nullptr, nullptr, nullptr, true))))
          return abort_stream(gen);
        // With logprobs the echo waits for the prompt's log-probs (they come with the first token).
        if (!g.chat && !gen.echo[c.prompt].empty() && g.params.prompt_logprobs < 0 &&
            !write(sse(chunk(gen, c.index, gen.echo[c.prompt], nullptr, nullptr, nullptr))))
          return abort_stream(gen);
      }
      return true;
    }
    bool waited = false, progress = false;
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
      const bool any =
          pump(g, c, waited ? 0ms : 50ms, &text, lp.is_null() ? nullptr : (g.chat ? &lp["content"] : &lp));
      waited = true;
      progress |= any;
      if (c.prompt_lp_in && !c.prompt_lp_out && g.params.prompt_logprobs >= 0) {
        c.prompt_lp_out = true;
        if (!write(sse(chunk(gen, c.index, gen.echo[c.prompt], prompt_logprobs_json(gen, c), nullptr, nullptr))))
          return abort_stream(gen);
      }
      ChatText t = chat_text(g, c, std::move(text), true);
      text = std::move(t.content);
      const std::string& reasoning = t.reasoning;
      if (!c.finished) {
        const bool new_tokens = c.out->completion_tokens > before;
        if ((!text.empty() || !reasoning.empty() || !t.tool_calls.is_null() || (new_tokens && g.want_logprobs)) &&
            !write(sse(chunk(gen, c.index, text, lp, nullptr, nullptr, false, reasoning, t.tool_calls))))
          return abort_stream(gen);
        continue;
      }
      if (c.fin == engine::FinishReason::Error) {
        // The end of the whole stream: report and stop.
        gen.finished = true;
        abort_all(gen);
        write(sse(error_json(500, "generation failed: " + c.rs->error())));
        write("data: [DONE]\n\n");
        sink.done();
        return true;
      }
      if (!write(sse(chunk(gen, c.index, text, lp, t.finish, stop_reason_of(c, g), false, reasoning, t.tool_calls))))
        return abort_stream(gen);
    }
    if (!gen.all_finished()) {
      if (!progress && peer_gone(gen.client_fd)) return abort_stream(gen);
      return true;
    }
    // Every choice has ended: usage, [DONE].
    gen.finished = true;
    bool ok = true;
    if (g.include_usage) {
      json u = chunk_base(gen);
      u["choices"] = json::array();
      u["usage"] = usage(gen.usage_prompt(), gen.usage_completion());
      ok = write(sse(u));
    }
    if (ok) ok = write("data: [DONE]\n\n");
    if (!ok) return false;
    sink.done();
    return true;
  }

  bool abort_stream(Generation& gen) {
    if (!gen.finished) {
      gen.finished = true;
      abort_all(gen);
    }
    return false;
  }

  // --- other routes -----------------------------------------------------------------------

  void handle_models(httplib::Response& res) {
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
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  }

  void handle_tokenize(const std::string& req_body, httplib::Response& res) {
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
    send_json(res, 200,
              {{"count", ids.size()},
               {"max_model_len", engine.max_model_len()},
               {"tokens", ids},
               {"token_strs", nullptr}});
  }

  void handle_detokenize(const std::string& req_body, httplib::Response& res) {
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
    send_json(res, 200, {{"prompt", text}});
  }

  void handle_profile(httplib::Response& res, bool start) {
    if (opts.profiler_dir.empty())
      throw ApiError(400, "profiling is off: start the server with --profiler-dir DIR");
    if (start) {
      engine.start_profile();
      send_json(res, 200, {{"status", "profiling"}});
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
    send_json(res, 200, {{"status", "stopped"}, {"trace", path}});
  }

  // Wraps a handler: ApiError -> its status; anything else -> 500; all as error objects.
  template <class F>
  httplib::Server::Handler wrap(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      ++in_flight;
      try {
        f(req, res);
      } catch (const ApiError& e) {
        send_json(res, e.status, error_json(e.status, e.what(), e.param, e.type));
      } catch (const Error& e) {
        send_error(res, 400, e.what());
      } catch (const std::exception& e) {
        SIEVE_LOG(Error, req.method << ' ' << req.path << ": " << e.what());
        send_error(res, 500, std::string("internal error: ") + e.what());
      }
      --in_flight;
    };
  }

  // POST routes read their body themselves: httplib's own reader caps bodies sent as
  // application/x-www-form-urlencoded (curl -d's default) at 8 KiB, and a chunked body would
  // not meet the size limit. The body is JSON whatever the Content-Type says, as in vLLM.
  template <class F>
  void post(const std::string& pattern, F f) {
    http.Post(pattern, [this, f](const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& reader) {
      if (req.get_header_value("Content-Type").rfind("multipart/", 0) == 0) {
        res.set_header("Connection", "close");
        send_error(res, 415, "multipart bodies are not accepted: send JSON");
        return;
      }
      std::string body;
      bool too_big = false;
      const bool ok = reader([&](const char* data, size_t n) {
        if (body.size() + n > opts.max_body_bytes) {
          too_big = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      // httplib refuses a Content-Length over the limit before reading (status 413).
      if (too_big || (!ok && res.status == 413)) {
        res.set_header("Connection", "close");
        send_error(res, 413,
                   "the request body is larger than the server accepts (" +
                       std::to_string(opts.max_body_bytes) + " bytes)");
        return;
      }
      if (!ok) {
        res.set_header("Connection", "close");
        send_error(res, 400, "could not read the request body");
        return;
      }
      wrap([&](const httplib::Request& q, httplib::Response& r) { f(q, body, r); })(req, res);
    });
  }

  void setup() {
    int threads = opts.http_threads;
    if (threads <= 0)
      threads = std::clamp(4 * engine.config().scheduler.max_num_seqs + 64, 256, 4096);
    http.new_task_queue = [threads] { return new GrowingPool(size_t(threads)); };
    http.set_payload_max_length(opts.max_body_bytes);
    http.set_keep_alive_timeout(5);
    http.set_read_timeout(60);
    http.set_write_timeout(30);
    http.set_tcp_nodelay(true);

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (opts.api_key.empty() || req.path.rfind("/v1", 0) != 0)
        return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");
      if (auth != "Bearer " + opts.api_key) {
        res.set_header("Connection", "close");
        send_json(res, 401,
                  error_json(401,
                             auth.empty() ? "Missing API key: send Authorization: Bearer <key>"
                                          : "Invalid API key",
                             {}, "authentication_error"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404)
        send_error(res, 404, "Not Found: " + req.method + " " + req.path);
      else if (res.status == 413)
        send_error(res, 413, "the request body is larger than the server accepts");
      else if (res.status == 400)
        send_error(res, 400, "malformed HTTP request");
      else
        send_error(res, res.status, "HTTP error " + std::to_string(res.status));
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string msg = "internal error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            msg += std::string(": ") + e.what();
          } catch (...) {
          }
          send_error(res, 500, msg);
        });

    post("/v1/completions", [this](const httplib::Request& q, const std::string& b, auto& r) {
      handle_generate(q, b, r, false);
    });
    post("/v1/chat/completions", [this](const httplib::Request& q, const std::string& b, auto& r) {
      handle_generate(q, b, r, true);
    });
    http.Get("/v1/models", wrap([this](const auto&, auto& r) { handle_models(r); }));
    http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
      if (owner->draining()) {
        send_error(r, 503, "the server is shutting down");
        return;
      }
      // A device that fails step after step (a lost GPU context) is not healthy; one bad step is.
      const engine::EngineStats st = engine.stats();
      if (st.consecutive_failed_steps >= kUnhealthyFailedSteps)
        send_error(r, 503,
                   "the engine's last " + std::to_string(st.consecutive_failed_steps) +
                       " steps failed: " + st.last_step_error);
      else
        r.status = 200;
    });
    http.Get("/ping", [](const httplib::Request&, httplib::Response& r) { r.status = 200; });
    http.Get("/version", [](const httplib::Request&, httplib::Response& r) {
      send_json(r, 200, {{"version", "0.1.0"}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(prometheus_text(engine.stats(), model_name()),
                    "text/plain; version=0.0.4; charset=utf-8");
    });
    if (opts.web_ui) {
      web = std::make_unique<WebUi>(engine, opts);
      http.Get(WebUi::kRoutePattern, [this](const httplib::Request& req, httplib::Response& r) {
        auto w = web->get(req.path, req.get_param_value("since"), req.get_header_value("If-None-Match"));
        if (!w) return send_error(r, 404, "Not Found: GET " + req.path);
        r.status = w->status;
        for (const auto& [k, v] : w->headers) r.set_header(k, v);
        if (w->status != 304) r.set_content(std::move(w->body), w->content_type);
      });
    }
    post("/tokenize",
         [this](const httplib::Request&, const std::string& b, auto& r) { handle_tokenize(b, r); });
    post("/detokenize", [this](const httplib::Request&, const std::string& b, auto& r) {
      handle_detokenize(b, r);
    });
    post("/start_profile",
         [this](const httplib::Request&, const std::string&, auto& r) { handle_profile(r, true); });
    post("/stop_profile", [this](const httplib::Request&, const std::string&, auto& r) {
      handle_profile(r, false);
    });
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

void widen_listen_backlog(int port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (!end || *end != '\0' || fd < 0) continue;
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = addr.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
            : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                         : -1;
    if (p == port) ::listen(int(fd), SOMAXCONN);
  }
  closedir(d);
}

void Server::bind() {
  auto& o = impl_->opts;
  if (o.port == 0) {
    port_ = impl_->http.bind_to_any_port(o.host);
    if (port_ <= 0) throw Error("cannot listen on " + o.host + " (any port)");
  } else {
    if (!impl_->http.bind_to_port(o.host, o.port))
      throw Error("cannot listen on " + o.host + ":" + std::to_string(o.port) +
                  " (address in use or not available)");
    port_ = o.port;
  }
  widen_listen_backlog(port_);
}

void Server::run() {
  impl_->http.listen_after_bind();
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
  for (int i = 0; i < 150 && impl_->in_flight.load() > 0; ++i) std::this_thread::sleep_for(10ms);
  impl_->http.stop();
}

}  // namespace sieve::server
