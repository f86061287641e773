// The HTTP server in-process on a loopback port, over the paged fake model: paths the end-to-end
// tests cannot reach with a real model (a failing step, before and after a stream started) and
// shutdown while a stream is open.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "server/server.h"
#include "server/tool_calls.h"
#include "server_rig.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace sieve::server {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

TEST(ServerHttp, CompletesAndAnswersErrorsAsObjects) {
  Rig rig;
  auto c = rig.client();
  auto r = c.Post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":5,"temperature":0})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  auto nf = c.Get("/nowhere");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(json::parse(nf->body)["error"]["code"], 404);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// Prompt limits are checked once, by the engine; the server answers them as 400s naming the
// field (and which prompt of a batch).
TEST(ServerHttp, PromptLimitsAre400sNamingThePrompt) {
  Rig rig({}, 64);
  auto c = rig.client();
  std::string long_ids;
  for (int i = 0; i < 70; ++i) {
    if (i) long_ids += ',';
    long_ids += std::to_string(1 + i % 200);
  }
  auto r = c.Post("/v1/completions", R"({"prompt":[)" + long_ids + "]}", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 400) << r->body;
  auto e = json::parse(r->body)["error"];
  EXPECT_EQ(e["param"], "prompt");
  EXPECT_NE(e["message"].get<std::string>().find("has 70 input tokens"), std::string::npos) << e;
  r = c.Post("/v1/completions", R"({"prompt":[[1,2],[)" + long_ids + "]]}", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("(prompt 1)"), std::string::npos) << r->body;
  r = c.Post("/v1/completions", R"({"prompt":""})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("the prompt is empty"), std::string::npos) << r->body;
  r = c.Post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":62})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("in the completion"), std::string::npos) << r->body;
  EXPECT_TRUE(rig.engine->wait_idle(2s));
  EXPECT_EQ(rig.engine->stats().num_free_blocks, 32);
}

// The generation config's max_new_tokens caps every request, given or defaulted, on both APIs.
TEST(ServerHttp, GenerationConfigMaxTokensCapsEveryRequest) {
  ServerOptions o;
  o.defaults.max_tokens = 3;
  o.defaults.temperature = 0;
  Rig rig(o);
  auto c = rig.client();
  for (const std::string body : {R"({"prompt":[1,2,3]})", R"({"prompt":[1,2,3],"max_tokens":10})",
                                 R"({"prompt":[1,2,3],"max_tokens":2})",
                                 R"({"messages":[{"role":"user","content":"hi"}]})"}) {
    const bool chat = body.find("messages") != std::string::npos;
    auto r = c.Post(chat ? "/v1/chat/completions" : "/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], body.find(":2}") != std::string::npos ? 2 : 3)
        << body;
  }
}

// --reasoning-parser: with thinking on (the built-in MiniMax-M3 template opens <mm:think> for the
// model), the generated text is the message's reasoning, streamed as reasoning deltas; with
// thinking off it stays content; without the parser nothing changes.
TEST(ServerHttp, ReasoningParserSplitsChatOutput) {
  const std::string think =
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":6,"temperature":0,"chat_template_kwargs":{"thinking_mode":"enabled"}})";
  const std::string no_think =
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":6,"temperature":0,"chat_template_kwargs":{"thinking_mode":"disabled"}})";
  std::string plain, plain_off;
  {
    Rig rig;
    auto c = rig.client();
    auto r = c.Post("/v1/chat/completions", think, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto m = json::parse(r->body)["choices"][0]["message"];
    plain = m["content"];
    EXPECT_FALSE(m.contains("reasoning"));
    r = c.Post("/v1/chat/completions", no_think, "application/json");
    ASSERT_TRUE(r);
    plain_off = json::parse(r->body)["choices"][0]["message"]["content"];
  }
  ASSERT_FALSE(plain.empty());
  ASSERT_EQ(plain.find("</think>"), std::string::npos);
  ServerOptions o;
  o.reasoning_parser = "minimax_m3";
  Rig rig(o);
  auto c = rig.client();
  auto r = c.Post("/v1/chat/completions", think, "application/json");
  ASSERT_TRUE(r);
  auto m = json::parse(r->body)["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null()) << m;
  EXPECT_EQ(m["reasoning"], plain);
  EXPECT_EQ(m["reasoning_content"], plain);
  r = c.Post("/v1/chat/completions", no_think, "application/json");
  ASSERT_TRUE(r);
  m = json::parse(r->body)["choices"][0]["message"];
  EXPECT_EQ(m["content"], plain_off);
  EXPECT_TRUE(m["reasoning"].is_null()) << m;
  // Streaming: the reasoning deltas add up to the same text, and no content arrives.
  std::string body = think;
  body.insert(body.size() - 1, R"(,"stream":true)");
  r = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(r);
  std::string reasoning, content;
  for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos; ++at) {
    const size_t end = r->body.find("\n\n", at);
    auto d = json::parse(r->body.substr(at + 6, end - at - 6))["choices"][0]["delta"];
    if (d.contains("reasoning")) reasoning += d["reasoning"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, plain);
  EXPECT_EQ(content, "");
}

// tool_choice "required" or a named function makes the output calls whose parameters follow the
// tools' schemas (tools without declared parameters take any, and the fake model's bytes rarely
// close those, so the text shows the opening); without the tool parser, or naming a tool the
// request lacks, it is refused. With the parser on, output without tool calls is unchanged.
TEST(ServerHttp, ToolChoiceForcesACallsOpening) {
  // The opening of a call of `name` as the chat template writes it.
  auto tool_call_opening = [](const std::string& name) {
    return std::string("]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"") + name + "\">";
  };
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}},{"type":"function","function":{"name":"g","parameters":{}}}])";
  const std::string base = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":80,"temperature":0,)" + tools +
                           R"(,"chat_template_kwargs":{"enable_thinking":false})";
  {
    Rig plain({}, 500);
    auto c = plain.client();
    auto r = c.Post("/v1/chat/completions", base + R"(,"tool_choice":"required"})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], "tool_choice");
  }
  ServerOptions o;
  o.tool_parser = "minimax_m3";
  Rig rig(o, 500);
  auto c = rig.client();
  for (const auto& [choice, names] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {R"("required")", {"f", "g"}}, {R"({"type":"function","function":{"name":"g"}})", {"g"}}}) {
    auto r = c.Post("/v1/chat/completions", base + R"(,"tool_choice":)" + choice + "}", "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto m = json::parse(r->body)["choices"][0]["message"];
    std::string text = m["content"].is_string() ? m["content"].get<std::string>() : "";
    if (!m["tool_calls"].empty()) text = tool_call_opening(m["tool_calls"][0]["function"]["name"]);
    EXPECT_TRUE(std::any_of(names.begin(), names.end(), [&](const std::string& n) { return text.rfind(tool_call_opening(n), 0) == 0; }))
        << choice << ": " << text;
  }
  // Streamed, the call goes out in pieces as soon as its name is known: the first piece with the
  // id, type and name, then the arguments; at the end (max_tokens) it is closed as it stands.
  {
    auto r = c.Post("/v1/chat/completions", base + R"(,"tool_choice":{"type":"function","function":{"name":"g"}},"stream":true})",
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string content, args, id;
    int pieces = 0;
    json finish;
    for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos; ++at) {
      const size_t end = r->body.find("\n\n", at);
      auto ch = json::parse(r->body.substr(at + 6, end - at - 6))["choices"][0];
      auto d = ch["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      if (!d.contains("tool_calls")) continue;
      for (const json& tc : d["tool_calls"]) {
        EXPECT_EQ(tc["index"], 0) << r->body;
        if (pieces++ == 0) {
          EXPECT_EQ(tc["type"], "function");
          EXPECT_EQ(tc["function"]["name"], "g");
          id = tc["id"].get<std::string>();
        } else {
          EXPECT_FALSE(tc.contains("id"));
          EXPECT_FALSE(tc["function"].contains("name"));
        }
        args += tc["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_GE(pieces, 1) << r->body;
    EXPECT_EQ(id.rfind("call_", 0), 0u) << id;
    EXPECT_EQ(content, "");
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_TRUE(json::parse(args, nullptr, false).is_object()) << args;
  }
  // A named function with a schema: the call comes out whole, its arguments of the schema's types.
  Rig roomy(o, 1024, 64);
  auto c2 = roomy.client();
  for (int seed = 0; seed < 4; ++seed) {
    const std::string typed =
        R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":200,"seed":)" + std::to_string(seed) +
        R"(,"tools":[{"type":"function","function":{"name":"set","parameters":{"type":"object","properties":{)"
        R"("n":{"type":"integer"},"mode":{"enum":["on","off"]}},"required":["n","mode"]}}}],)"
        R"("tool_choice":{"type":"function","function":{"name":"set"}},"chat_template_kwargs":{"enable_thinking":false}})";
    auto r = c2.Post("/v1/chat/completions", typed, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto ch = json::parse(r->body)["choices"][0];
    EXPECT_EQ(ch["finish_reason"], "tool_calls") << r->body;
    ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << r->body;
    auto fn = ch["message"]["tool_calls"][0]["function"];
    EXPECT_EQ(fn["name"], "set");
    auto args = json::parse(fn["arguments"].get<std::string>());
    EXPECT_TRUE(args["n"].is_number_integer()) << args.dump();
    EXPECT_TRUE(args["mode"] == "on" || args["mode"] == "off") << args.dump();
  }
  auto r = c.Post("/v1/chat/completions", base + R"(,"tool_choice":{"type":"function","function":{"name":"h"}}})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  // (No tools in the prompt here: plain output with tool_choice auto stays as it is.)
  r = c.Post("/v1/chat/completions",
             R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"tool_choice":"auto"})",
             "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto ch = json::parse(r->body)["choices"][0];
  EXPECT_EQ(ch["message"]["tool_calls"], json::array());
  EXPECT_EQ(ch["finish_reason"], "length");
}

// Guided decoding over HTTP: the text is one of the choices, matches the pattern, or is a JSON
// object when the request ended on its own (max_tokens may cut one short).
TEST(ServerHttp, GuidedChoiceRegexAndJsonObject) {
  Rig rig;
  auto c = rig.client();
  for (int seed = 0; seed < 4; ++seed) {
    auto r = c.Post("/v1/completions",
                    R"({"prompt":[1,2,3],"max_tokens":20,"seed":)" + std::to_string(seed) +
                        R"(,"guided_choice":["red","green","blue"]})",
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto ch = json::parse(r->body)["choices"][0];
    const std::string text = ch["text"];
    EXPECT_TRUE(text == "red" || text == "green" || text == "blue") << text;
    EXPECT_EQ(ch["finish_reason"], "stop");
  }
  for (int seed = 0; seed < 4; ++seed) {
    auto r = c.Post("/v1/completions",
                    R"({"prompt":[1,2,3],"max_tokens":20,"seed":)" + std::to_string(seed) +
                        R"(,"guided_regex":"[a-c]{2}-\\d\\d"})",
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto ch = json::parse(r->body)["choices"][0];
    const std::string text = ch["text"];
    EXPECT_TRUE(text.size() == 5 && text[0] >= 'a' && text[0] <= 'c' && text[2] == '-' && std::isdigit(uint8_t(text[4])))
        << text;
    EXPECT_EQ(ch["finish_reason"], "stop");
  }
  for (int seed = 0; seed < 4; ++seed) {
    auto r = c.Post("/v1/completions",
                    R"({"prompt":[1,2,3],"max_tokens":24,"seed":)" + std::to_string(seed) +
                        R"(,"guided_grammar":"root ::= num (\",\" num){2}\nnum ::= [1-9] [0-9]?"})",
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto ch = json::parse(r->body)["choices"][0];
    const std::string text = ch["text"];
    int commas = 0;
    bool ok = !text.empty() && text[0] >= '1' && text[0] <= '9';
    for (char x : text) {
      commas += x == ',';
      ok = ok && (x == ',' || std::isdigit(uint8_t(x)));
    }
    EXPECT_TRUE(ok && commas == 2 && text.back() != ',') << text;
    EXPECT_EQ(ch["finish_reason"], "stop") << text;
  }
  // A union of objects (pydantic's Union of two models) through the schema's grammar.
  for (int seed = 0; seed < 4; ++seed) {
    auto r = c.Post("/v1/completions",
                    R"({"prompt":[1,2,3],"max_tokens":40,"seed":)" + std::to_string(seed) +
                        R"(,"guided_json":{"anyOf":[{"type":"object","properties":{"k":{"const":"a"}},"required":["k"]},)"
                        R"({"type":"object","properties":{"k":{"const":"b"},"v":{"type":"boolean"}},"required":["k","v"]}]}})",
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto ch = json::parse(r->body)["choices"][0];
    const std::string text = ch["text"];
    EXPECT_TRUE(text == R"({"k":"a"})" || text == R"({"k":"b","v":true})" || text == R"({"k":"b","v":false})") << text;
    EXPECT_EQ(ch["finish_reason"], "stop") << text;
  }
  auto bad_grammar = c.Post("/v1/completions", R"({"prompt":[1],"guided_grammar":"root ::= root \"a\""})", "application/json");
  ASSERT_TRUE(bad_grammar);
  EXPECT_EQ(bad_grammar->status, 400);
  EXPECT_EQ(json::parse(bad_grammar->body)["error"]["param"], "guided_grammar");
  EXPECT_NE(std::string(json::parse(bad_grammar->body)["error"]["message"]).find("left-recursive"), std::string::npos);
  auto bad = c.Post("/v1/completions", R"({"prompt":[1],"guided_regex":"(a"})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "guided_regex");
  int objects = 0;
  for (int seed = 0; seed < 8; ++seed) {
    auto r = c.Post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"max_tokens":60,"seed":)" + std::to_string(seed) +
                        R"(,"response_format":{"type":"json_object"},"chat_template_kwargs":{"enable_thinking":false}})",
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto ch = json::parse(r->body)["choices"][0];
    if (ch["finish_reason"] != "stop") continue;
    ++objects;
    EXPECT_TRUE(json::parse(ch["message"]["content"].get<std::string>()).is_object()) << ch;
  }
  EXPECT_GT(objects, 0);
}

// A burst of simultaneous connections must be served, not refused: the listen backlog holds them
// until the event loop accepts.
TEST(ServerHttp, ABurstOfConnectionsIsServed) {
  Rig rig;
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 64; ++i)
    clients.emplace_back([&] {
      auto c = rig.client();
      auto r = c.Get("/health");
      if (r && r->status == 200) ++ok;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 64);
}

TEST(ServerHttp, AFailingStepIsA500OrAnErrorEvent) {
  Rig rig;
  rig.model.fail_on_token = 77;
  auto c = rig.client();
  auto r = c.Post("/v1/completions", R"({"prompt":[1,77],"max_tokens":3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  auto e = json::parse(r->body)["error"];
  EXPECT_EQ(e["code"], 500);
  EXPECT_NE(e["message"].get<std::string>().find("injected failure"), std::string::npos);
  auto s = c.Post("/v1/completions", R"({"prompt":[2,77],"max_tokens":3,"stream":true})",
                  "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("data: {\"error\""), std::string::npos) << s->body;
  EXPECT_NE(s->body.find("data: [DONE]\n\n"), std::string::npos);
  // And the engine goes on. Greedy: a sampled second token could be the failing one (1 in 300).
  auto ok = c.Post("/v1/completions", R"({"prompt":[1,2],"max_tokens":2,"temperature":0})",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(rig.engine->wait_idle(2s));
  EXPECT_EQ(rig.engine->stats().num_free_blocks, 32);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(ServerHttp, HealthIs503WhileEveryStepFails) {
  Rig rig;
  rig.model.fail_on_token = 77;
  auto c = rig.client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  for (int i = 0; i < 3; ++i) {
    auto r = c.Post("/v1/completions", R"({"prompt":[3,77],"max_tokens":2})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500);
  }
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_NE(h->body.find("injected failure"), std::string::npos) << h->body;
  // A step that runs makes it healthy again.
  auto ok = c.Post("/v1/completions", R"({"prompt":[1,2],"max_tokens":1,"temperature":0})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(ServerHttp, ShutdownEndsOpenStreamsAndRefusesNewWork) {
  Rig rig;
  rig.model.delay_us = 20000;  // 250 tokens take 5 s: longer than the shutdown grace period
  std::string body;
  std::thread client([&] {
    auto c = rig.client();
    auto r = c.Post("/v1/completions",
                    R"({"prompt":[1,2],"max_tokens":250,"stream":true,"ignore_eos":true})",
                    "application/json");
    if (r) body = r->body;
  });
  for (int i = 0; i < 200 && rig.engine->stats().num_running == 0; ++i)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(rig.engine->stats().num_running, 1);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread stopper([&] { rig.srv->shutdown(); });
  std::this_thread::sleep_for(100ms);
  auto c = rig.client();
  auto refused = c.Post("/v1/completions", R"({"prompt":[1],"max_tokens":1})", "application/json");
  ASSERT_TRUE(refused);  // the listener stays while draining
  EXPECT_EQ(refused->status, 503);
  stopper.join();
  client.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_NE(body.find("\"finish_reason\":\"abort\""), std::string::npos)
      << body.substr(body.size() > 300 ? body.size() - 300 : 0);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(rig.engine->stats().num_free_blocks, 32);
}

}  // namespace
}  // namespace sieve::server
