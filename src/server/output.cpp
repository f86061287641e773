#include "server/output.h"

#include <algorithm>
#include <ctime>
#include <functional>
#include <random>
#include <thread>

namespace sieve::server {

using json = nlohmann::json;

int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

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

Output::Output(const text::Tokenizer& t, const GenerateRequest& g, std::vector<int32_t> keep)
    : tok(t),
      dec(t, g.skip_special_tokens, std::move(keep)),
      stop(g.stop),
      include_stop(g.include_stop_str_in_output),
      chat(g.chat),
      want_logprobs(g.want_logprobs),
      ids_as_tokens(g.return_tokens_as_token_ids),
      min_tokens(g.params.min_tokens) {}

std::string Output::token_str(int32_t id) const {
  if (ids_as_tokens) return "token_id:" + std::to_string(id);
  return known(id) ? tok.decode({id}, false) : std::string();
}

json Output::token_bytes(int32_t id) const {
  json b = json::array();
  if (known(id))
    for (unsigned char c : tok.token_bytes(id)) b.push_back(int(c));
  return b;
}

std::string Output::push(const engine::TokenOutput& t, json* lp_delta) {
  ++completion_tokens;
  last_token = t.token;
  std::string piece = known(t.token) ? dec.push(t.token) : std::string();
  // As vLLM: stop strings count only once min_tokens tokens were generated.
  std::string out = completion_tokens >= min_tokens ? stop.push(piece) : stop.push_unchecked(piece);
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

void Output::append(const std::string& s) {
  text += s;
  text_chars += code_points(s);
}
std::string Output::finish() {
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

json Output::completion_logprobs() const {
  return {{"text_offset", lp_offsets},
          {"token_logprobs", lp_values},
          {"tokens", lp_tokens},
          {"top_logprobs", lp_top}};
}

int64_t Generation::usage_prompt() const {
  int64_t n = 0;
  for (const auto& ids : prompt_ids) n += int64_t(ids.size());
  return n;
}
int64_t Generation::usage_completion() const {
  int64_t n = 0;
  for (const Choice& c : choices) n += c.out->completion_tokens;
  return n;
}
bool Generation::all_finished() const {
  for (const Choice& c : choices)
    if (!c.finished) return false;
  return true;
}

void abort_all(engine::Engine& engine, Generation& gen, engine::FinishReason why) {
  for (Choice& c : gen.choices)
    if (!c.finished) {
      c.finished = true;
      c.fin = why;
      engine.abort(c.rs->id(), why);
    }
}

bool pump(engine::Engine& engine, const GenerateRequest& g, Choice& c,
          std::chrono::milliseconds wait, std::string* text, json* lp_delta) {
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

json stop_reason_of(const Choice& c, const GenerateRequest& g) {
  json stop_reason = c.out->stop_reason;
  if (stop_reason.is_null() && c.fin == engine::FinishReason::Stop) {
    const int32_t last = c.out->last_token;
    if (std::find(g.params.stop_token_ids.begin(), g.params.stop_token_ids.end(), last) !=
        g.params.stop_token_ids.end())
      stop_reason = last;
  }
  return stop_reason;
}

const char* finish_name(engine::FinishReason f, bool stopped_by_string) {
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

namespace {

// OpenAI's tool_calls: arguments as a JSON string.
json tool_calls_json(const std::vector<ParsedToolCall>& calls) {
  json out = json::array();
  for (const ParsedToolCall& call : calls)
    out.push_back({{"id", "call_" + random_hex(24)},
                   {"type", "function"},
                   {"function", {{"name", call.name}, {"arguments", call.arguments.dump()}}}});
  return out;
}

// A stream's tool_calls delta: each call numbered (index); its first piece with an id, the type
// and the name, the later ones with more of its arguments.
json tool_call_pieces_json(const std::vector<ToolCallDelta>& pieces) {
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

}  // namespace

ChatText chat_text(const GenerateRequest& g, Choice& c, std::string text, bool stream) {
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

json usage_json(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"total_tokens", prompt + completion},
          {"completion_tokens", completion},
          {"prompt_tokens_details", nullptr}};
}

json prompt_logprobs_json(const text::Tokenizer& tok, const Generation& gen, const Choice& c) {
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
  return {{"text_offset", offsets},
          {"token_logprobs", values},
          {"tokens", tokens},
          {"top_logprobs", top}};
}

json with_prompt_logprobs(json prompt, const json& lp) {
  for (const char* k : {"text_offset", "token_logprobs", "tokens", "top_logprobs"})
    for (const auto& v : lp[k]) prompt[k].push_back(v);
  return prompt;
}

}  // namespace sieve::server
