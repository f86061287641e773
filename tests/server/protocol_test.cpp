#include "server/protocol.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace sieve::server {
namespace {

using ojson = nlohmann::ordered_json;

GenerateRequest parse(const std::string& body, bool chat) {
  return parse_generate_request(parse_json_body(body), chat);
}

// The request is refused with 400 and the error names `param`.
void refused(const std::string& body, bool chat, const std::string& param, int status = 400) {
  try {
    parse(body, chat);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.what();
  }
}

TEST(Protocol, ParsesACompletionRequest) {
  auto r = parse(
      R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,
    "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,"seed":42,"stop":["a","bc"],
    "stop_token_ids":[3,4],"ignore_eos":true,"min_tokens":2,"logprobs":3,"stream":true,
    "stream_options":{"include_usage":true},"n":1,"best_of":null,"user":"ignored","unknown_field":{"x":1}})",
      false);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(*r.prompts[0].text, "hi");
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_DOUBLE_EQ(r.params.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.params.top_p, 0.9);
  EXPECT_EQ(r.params.top_k, 40);
  EXPECT_DOUBLE_EQ(r.params.min_p, 0.05);
  EXPECT_DOUBLE_EQ(r.params.frequency_penalty, -0.5);
  EXPECT_TRUE(r.params.has_seed);
  EXPECT_EQ(r.params.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.params.min_tokens, 2);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.add_special_tokens);
}

TEST(Protocol, PromptsAsTokenIds) {
  auto r = parse(R"({"prompt":[1,2,3]})", false);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].text.has_value());
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_EQ(parse(R"({"prompt":[[5,6]]})", false).prompts.at(0).ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(*parse(R"({"prompt":["x"]})", false).prompts.at(0).text, "x");
  refused(R"({"prompt":[1,-2]})", false, "prompt");
  refused(R"({"prompt":[1,2.5]})", false, "prompt");
  refused(R"({"prompt":[1,99999999999]})", false, "prompt");
  refused(R"({"prompt":[]})", false, "prompt");
  // Batches: strings or id arrays, each a prompt of its own.
  auto b = parse(R"({"prompt":["a",[7,8],"c"]})", false);
  ASSERT_EQ(b.prompts.size(), 3u);
  EXPECT_EQ(*b.prompts[0].text, "a");
  EXPECT_EQ(b.prompts[1].ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(*b.prompts[2].text, "c");
  refused(R"({"prompt":["a",5]})", false, "prompt[1]");
  refused(R"({"prompt":["a",[]]})", false, "prompt[1]");
  refused(R"({"prompt":[[1],[-1]]})", false, "prompt[1]");
  refused(R"({"prompt":[true]})", false, "prompt[0]");
  refused(R"({"max_tokens":3})", false, "prompt");
}

TEST(Protocol, ParsesChat) {
  auto r = parse(
      R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},
    {"type":"text","text":"b"}]}],"max_completion_tokens":5,"logprobs":true,"top_logprobs":2,
    "chat_template_kwargs":{"enable_thinking":false}})",
      true);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 2);
  EXPECT_FALSE(r.add_special_tokens);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
  refused(R"({"messages":"hi"})", true, "messages");
  refused(R"({"messages":[]})", true, "messages");
  refused(R"({"messages":[{"content":"x"}]})", true, "messages[0].role");
  refused(R"({"messages":[{"role":"user","content":5}]})", true, "messages[0].content");
  refused(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})", true,
          "messages[0].content[0].type");
  refused(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", true, "top_logprobs");
}

// --default-chat-template-kwargs fills what the request's chat_template_kwargs leaves out;
// thinking_mode, where given, is one of MiniMax-M3's modes.
TEST(Protocol, ChatTemplateKwargsOverTheServersDefaults) {
  RequestDefaults d;
  d.chat_template_kwargs = {{"thinking_mode", "disabled"}, {"x", 1}};
  const std::string msgs = R"("messages":[{"role":"developer","content":"d"}])";
  GenerateRequest r = parse_generate_request(ojson::parse("{" + msgs + "}"), true, d);
  EXPECT_EQ(r.chat_template_kwargs, ojson({{"thinking_mode", "disabled"}, {"x", 1}}));
  r = parse_generate_request(
      ojson::parse("{" + msgs + R"(,"chat_template_kwargs":{"thinking_mode":"enabled","y":2}})"), true, d);
  EXPECT_EQ(r.chat_template_kwargs, ojson({{"thinking_mode", "enabled"}, {"x", 1}, {"y", 2}}));
  EXPECT_EQ(r.messages[0]["role"], "developer");
  refused("{" + msgs + R"(,"chat_template_kwargs":{"thinking_mode":"on"}})", true, "chat_template_kwargs.thinking_mode");
  refused("{" + msgs + R"(,"chat_template_kwargs":{"thinking_mode":true}})", true, "chat_template_kwargs.thinking_mode");
  EXPECT_EQ(check_chat_template_kwargs(ojson({{"thinking_mode", "adaptive"}})), "");
  EXPECT_NE(check_chat_template_kwargs(ojson({{"thinking_mode", "max"}})).find("thinking_mode"), std::string::npos);
}

TEST(Protocol, RefusesBadValuesNamingTheField) {
  EXPECT_THROW(parse_json_body("{\"prompt\": "), ApiError);
  EXPECT_THROW(parse_json_body("[1]"), ApiError);
  EXPECT_THROW(parse_json_body(""), ApiError);
  refused(R"({"prompt":"x","max_tokens":0})", false, "max_tokens");
  refused(R"({"prompt":"x","max_tokens":-3})", false, "max_tokens");
  refused(R"({"prompt":"x","max_tokens":"3"})", false, "max_tokens");
  refused(R"({"prompt":"x","max_tokens":2.5})", false, "max_tokens");
  refused(R"({"prompt":"x","temperature":-0.1})", false, "temperature");
  refused(R"({"prompt":"x","temperature":"hot"})", false, "temperature");
  refused(R"({"prompt":"x","top_p":0})", false, "top_p");
  refused(R"({"prompt":"x","top_p":1.5})", false, "top_p");
  refused(R"({"prompt":"x","top_k":-2})", false, "top_k");
  refused(R"({"prompt":"x","min_p":2})", false, "min_p");
  refused(R"({"prompt":"x","presence_penalty":3})", false, "presence_penalty");
  refused(R"({"prompt":"x","repetition_penalty":0})", false, "repetition_penalty");
  refused(R"({"prompt":"x","seed":"1"})", false, "seed");
  EXPECT_EQ(parse(R"({"prompt":"x","n":3,"best_of":3})", false).n, 3);
  refused(R"({"prompt":"x","n":0})", false, "n");
  refused(R"({"prompt":"x","n":1025})", false, "n");
  refused(R"({"prompt":["a","b","c"],"n":500})", false, "n");
  refused(R"({"prompt":"x","best_of":2})", false, "best_of");
  refused(R"({"prompt":"x","n":2,"best_of":3})", false, "best_of");
  refused(R"({"prompt":"x","stop":5})", false, "stop");
  refused(R"({"prompt":"x","stop":["a",1]})", false, "stop");
  refused(R"({"prompt":"x","stop":[""]})", false, "stop");
  refused(R"({"prompt":"x","stream":"yes"})", false, "stream");
  refused(R"({"prompt":"x","stream_options":{"include_usage":true}})", false, "stream_options");
  refused(R"({"prompt":"x","logprobs":21})", false, "logprobs");
  refused(R"({"prompt":"x","logprobs":true})", false, "logprobs");
  refused(R"({"prompt":"x","max_tokens":3,"min_tokens":4})", false, "min_tokens");
  refused(R"({"prompt":"x","model":7})", false, "model");
  refused(R"({"prompt":"x","logit_bias":[1]})", false, "logit_bias");
  refused(R"({"prompt":"x","logit_bias":{"a":5}})", false, "logit_bias");
  refused(R"({"prompt":"x","logit_bias":{"-1":5}})", false, "logit_bias");
  refused(R"({"prompt":"x","logit_bias":{"99999999999":5}})", false, "logit_bias");
  refused(R"({"prompt":"x","logit_bias":{"1":"5"}})", false, "logit_bias");
  refused(R"({"prompt":"x","logit_bias":{"1":100.5}})", false, "logit_bias");
  {
    // echo with logprobs asks for the prompt's log-probs; with max_tokens 0, for the prompt alone.
    auto e = parse(R"({"prompt":"x","echo":true,"logprobs":2})", false);
    EXPECT_EQ(e.params.prompt_logprobs, 2);
    EXPECT_FALSE(e.prompt_only);
    auto z = parse(R"({"prompt":"x","echo":true,"logprobs":0,"max_tokens":0})", false);
    EXPECT_TRUE(z.prompt_only);
    EXPECT_EQ(z.params.max_tokens, 1);
    EXPECT_EQ(z.params.prompt_logprobs, 0);
    EXPECT_EQ(parse(R"({"prompt":"x","logprobs":2})", false).params.prompt_logprobs, -1);
  }
  {
    const auto lb = parse(R"({"prompt":"x","logit_bias":{"7":-100,"12":2.5}})", false).params.logit_bias;
    ASSERT_EQ(lb.size(), 2u);
    EXPECT_EQ(lb[0], (std::pair<int32_t, float>{7, -100.0f}));
    EXPECT_EQ(lb[1], (std::pair<int32_t, float>{12, 2.5f}));
  }
  // Top-k -1 means off, as in vLLM; null means "default" everywhere.
  EXPECT_EQ(parse(R"({"prompt":"x","top_k":-1,"temperature":null,"max_tokens":null})", false)
                .params.top_k,
            0);
}

// Random JSON values, biased towards the request's own fields and the edges of their ranges.
ojson random_value(std::mt19937_64& rng, int depth) {
  switch (rng() % (depth > 2 ? 7 : 9)) {
    case 0:
      return nullptr;
    case 1:
      return bool(rng() & 1);
    case 2: {
      static const int64_t edges[] = {
          0, 1, -1, 2, 20, 21, INT32_MAX, int64_t(INT32_MAX) + 1, INT64_MIN, INT64_MAX, 511, 512};
      return edges[rng() % 12];
    }
    case 3: {
      static const double edges[] = {0.0,    -0.0,  0.5, 1.0,  1.0000001,
                                     -1e308, 1e308, 2.5, -2.0, 1e-320};
      return edges[rng() % 10];
    }
    case 4:
      return uint64_t(rng());
    case 5: {
      std::string s;
      size_t n = rng() % 8;
      for (size_t i = 0; i < n; ++i) s += char(rng() % 256);
      return s;
    }
    case 6:
      return std::string(rng() % 2 ? "text" : "user");
    case 7: {
      ojson a = ojson::array();
      size_t n = rng() % 4;
      for (size_t i = 0; i < n; ++i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      ojson o = ojson::object();
      static const char* keys[] = {"role", "content", "type", "text", "include_usage", "x"};
      size_t n = rng() % 4;
      for (size_t i = 0; i < n; ++i) o[keys[rng() % 6]] = random_value(rng, depth + 1);
      return o;
    }
  }
}

// Server-wide defaults fill what a request leaves out (absent or null), never what it sets.
TEST(Protocol, DefaultsFillOnlyWhatTheRequestLeavesOut) {
  RequestDefaults d;
  d.temperature = 0.7;
  d.top_p = 0.95;
  d.top_k = 40;
  d.min_p = 0.02;
  d.repetition_penalty = 1.05;
  d.max_logprobs = 5;
  for (bool chat : {false, true}) {
    const std::string base = chat ? R"("messages":[{"role":"user","content":"hi"}])" : R"("prompt":"hi")";
    auto r = parse_generate_request(parse_json_body("{" + base + R"(,"top_p":null})"), chat, d);
    EXPECT_DOUBLE_EQ(r.params.temperature, 0.7);
    EXPECT_DOUBLE_EQ(r.params.top_p, 0.95);
    EXPECT_EQ(r.params.top_k, 40);
    EXPECT_DOUBLE_EQ(r.params.min_p, 0.02);
    EXPECT_DOUBLE_EQ(r.params.repetition_penalty, 1.05);
    r = parse_generate_request(
        parse_json_body("{" + base +
                        R"(,"temperature":0,"top_p":1,"top_k":-1,"min_p":0,"repetition_penalty":1})"),
        chat, d);
    EXPECT_DOUBLE_EQ(r.params.temperature, 0.0);
    EXPECT_DOUBLE_EQ(r.params.top_p, 1.0);
    EXPECT_EQ(r.params.top_k, 0);
    EXPECT_DOUBLE_EQ(r.params.min_p, 0.0);
    EXPECT_DOUBLE_EQ(r.params.repetition_penalty, 1.0);
  }
  // --max-logprobs bounds both APIs' alternatives.
  EXPECT_EQ(parse_generate_request(parse_json_body(R"({"prompt":"hi","logprobs":5})"), false, d).top_logprobs, 5);
  for (const auto& [body, chat, param] :
       std::vector<std::tuple<std::string, bool, std::string>>{
           {R"({"prompt":"hi","logprobs":6})", false, "logprobs"},
           {R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":6})", true,
            "top_logprobs"}}) {
    try {
      parse_generate_request(parse_json_body(body), chat, d);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, param);
      EXPECT_NE(std::string(e.what()).find("5"), std::string::npos) << e.what();
    }
  }
}

// As vLLM reads a generation config: the keys it sets away from transformers' defaults, then
// every key of the overrides.
TEST(Protocol, GenerationConfigDefaults) {
  using json = nlohmann::json;
  RequestDefaults d = request_defaults_from(
      json::parse(R"({"do_sample":true,"temperature":0.6,"top_p":0.95,"top_k":40,"min_p":0.01,
                      "repetition_penalty":1.1,"max_new_tokens":512,"eos_token_id":[2]})"),
      json::object());
  EXPECT_DOUBLE_EQ(d.temperature, 0.6);
  EXPECT_DOUBLE_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.top_k, 40);
  EXPECT_DOUBLE_EQ(d.min_p, 0.01);
  EXPECT_DOUBLE_EQ(d.repetition_penalty, 1.1);
  EXPECT_EQ(d.max_tokens, 512);
  // transformers' own defaults (top_k 50, temperature 1.0, ...) are not a model's choice.
  d = request_defaults_from(json::parse(R"({"temperature":1.0,"top_k":50,"top_p":1.0,"repetition_penalty":1.0})"),
                            nullptr);
  EXPECT_DOUBLE_EQ(d.temperature, 1.0);
  EXPECT_EQ(d.top_k, 0);
  EXPECT_DOUBLE_EQ(d.top_p, 1.0);
  EXPECT_EQ(d.max_tokens, 0);
  // Overrides apply whatever their value, over the file; max_logprobs comes from the base.
  RequestDefaults base;
  base.max_logprobs = 7;
  d = request_defaults_from(json::parse(R"({"top_k":40,"temperature":0.6})"), json::parse(R"({"top_k":50})"), base);
  EXPECT_EQ(d.top_k, 50);
  EXPECT_DOUBLE_EQ(d.temperature, 0.6);
  EXPECT_EQ(d.max_logprobs, 7);
  // Bad values name the key and where it came from.
  for (const auto& [cfg, over, needle] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"({"temperature":"hot"})", "{}", "generation config temperature"},
           {R"({"top_p":0})", "{}", "generation config top_p"},
           {R"({"top_k":2.5})", "{}", "generation config top_k"},
           {"{}", R"({"max_new_tokens":0})", "--override-generation-config max_new_tokens"},
           {"{}", R"({"repetition_penalty":-1})", "--override-generation-config repetition_penalty"},
           {"{}", "[1]", "--override-generation-config: expected a JSON object"}}) {
    try {
      request_defaults_from(json::parse(cfg), json::parse(over));
      ADD_FAILURE() << cfg << " " << over << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

TEST(Protocol, ToolChoiceAndEarlierReasoning) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x","reasoning":"r1"},{"role":"user","content":"more"}])";
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}])";
  EXPECT_EQ(parse("{" + msgs + "}", true).tool_choice, "none");
  EXPECT_EQ(parse("{" + msgs + "," + tools + "}", true).tool_choice, "auto");
  EXPECT_EQ(parse("{" + msgs + "," + tools + R"(,"tool_choice":"none"})", true).tool_choice, "none");
  EXPECT_EQ(parse("{" + msgs + "," + tools + R"(,"tool_choice":"required"})", true).tool_choice, "required");
  EXPECT_EQ(parse("{" + msgs + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})", true)
                .tool_choice,
            "function:f");
  refused("{" + msgs + R"(,"tool_choice":"sometimes"})", true, "tool_choice");
  refused("{" + msgs + R"(,"tool_choice":{"type":"function"}})", true, "tool_choice");
  // An assistant turn's `reasoning` reaches the template as reasoning_content.
  auto r = parse("{" + msgs + "}", true);
  EXPECT_EQ(r.messages[1]["reasoning_content"], "r1");
}

// Guided decoding: a JSON object, a JSON schema, a regular expression, an EBNF grammar or choices;
// other structured_outputs keys are refused by name, never answered with free text.
TEST(Protocol, GuidedDecodingFields) {
  const std::string m = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(parse("{" + m + R"(,"response_format":{"type":"text"}})", true).guided, "");
  EXPECT_EQ(parse("{" + m + R"(,"response_format":null})", true).guided, "");
  EXPECT_EQ(parse("{" + m + R"(,"response_format":{"type":"json_object"}})", true).guided, "json_object");
  auto r = parse(R"({"prompt":"hi","guided_choice":["a","bc"]})", false);
  EXPECT_EQ(r.guided, "choice");
  EXPECT_EQ(r.guided_choice, (std::vector<std::string>{"a", "bc"}));
  r = parse("{" + m + R"(,"structured_outputs":{"choice":["x"]}})", true);
  EXPECT_EQ(r.guided, "choice");
  EXPECT_EQ(parse("{" + m + R"(,"structured_outputs":{"json_object":true}})", true).guided, "json_object");
  r = parse("{" + m + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}})", true);
  EXPECT_EQ(r.guided, "json_schema");
  EXPECT_EQ(r.guided_schema, R"({"type":"object"})");
  EXPECT_EQ(r.guided_param, "response_format");
  r = parse(R"({"prompt":"hi","guided_json":{"type":"array","items":{"type":"integer"}}})", false);
  EXPECT_EQ(r.guided, "json_schema");
  EXPECT_EQ(r.guided_param, "guided_json");
  EXPECT_EQ(parse("{" + m + R"(,"structured_outputs":{"json":"{\"type\":\"object\"}"}})", true).guided_schema,
            R"({"type":"object"})");
  refused("{" + m + R"(,"response_format":{"type":"json_schema"}})", true, "response_format");
  refused("{" + m + R"(,"response_format":{"type":"xml"}})", true, "response_format");
  refused("{" + m + R"(,"response_format":"json"})", true, "response_format");
  refused(R"({"prompt":"hi","guided_choice":[]})", false, "guided_choice");
  refused(R"({"prompt":"hi","guided_choice":["a",""]})", false, "guided_choice");
  refused(R"({"prompt":"hi","guided_choice":["a"],"response_format":{"type":"json_object"}})", false, "guided_choice");
  refused("{" + m + R"(,"guided_json":3})", true, "guided_json");
  r = parse("{" + m + R"(,"guided_regex":"a+"})", true);
  EXPECT_EQ(r.guided, "regex");
  EXPECT_EQ(r.guided_schema, "a+");
  EXPECT_EQ(parse("{" + m + R"(,"structured_outputs":{"regex":"\\d+"}})", true).guided_param, "structured_outputs.regex");
  refused("{" + m + R"(,"guided_regex":""})", true, "guided_regex");
  r = parse("{" + m + R"(,"guided_grammar":"root ::= \"a\"+"})", true);
  EXPECT_EQ(r.guided, "grammar");
  EXPECT_EQ(r.guided_schema, "root ::= \"a\"+");
  EXPECT_EQ(r.guided_param, "guided_grammar");
  r = parse(R"({"prompt":"hi","structured_outputs":{"grammar":"root ::= [0-9]"}})", false);
  EXPECT_EQ(r.guided, "grammar");
  EXPECT_EQ(r.guided_param, "structured_outputs.grammar");
  refused("{" + m + R"(,"guided_grammar":""})", true, "guided_grammar");
  refused("{" + m + R"(,"guided_grammar":{"root":"x"}})", true, "guided_grammar");
  refused("{" + m + R"(,"guided_grammar":"root ::= x","guided_regex":"a"})", true, "guided_grammar");
  refused("{" + m + R"(,"structured_outputs":{"structural_tag":"x"}})", true, "structured_outputs.structural_tag");
}

TEST(Protocol, RandomizedRequestsNeverCrashTheParser) {
  static const char* fields[] = {"model",
                                 "prompt",
                                 "messages",
                                 "max_tokens",
                                 "max_completion_tokens",
                                 "temperature",
                                 "top_p",
                                 "top_k",
                                 "min_p",
                                 "presence_penalty",
                                 "frequency_penalty",
                                 "repetition_penalty",
                                 "seed",
                                 "stop",
                                 "stop_token_ids",
                                 "ignore_eos",
                                 "min_tokens",
                                 "logprobs",
                                 "top_logprobs",
                                 "stream",
                                 "stream_options",
                                 "n",
                                 "best_of",
                                 "echo",
                                 "suffix",
                                 "logit_bias",
                                 "tools",
                                 "chat_template_kwargs",
                                 "add_generation_prompt",
                                 "continue_final_message",
                                 "include_stop_str_in_output",
                                 "skip_special_tokens",
                                 "add_special_tokens",
                                 "return_tokens_as_token_ids"};
  constexpr size_t num_fields = sizeof(fields) / sizeof(fields[0]);
  std::mt19937_64 rng(20261202);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  int64_t iters = 0, accepted = 0, refused_count = 0;
  const std::string valid =
      R"({"model":"m","prompt":[1,2,3],"max_tokens":5,"stop":["ab"],"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"logprobs":2})";
  while (std::chrono::steady_clock::now() < deadline && iters < 400000) {
    ++iters;
    std::string body;
    if (iters % 3 == 0) {
      // Byte-level mutations of a valid body: truncation, flips, insertions.
      body = valid;
      int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits && !body.empty(); ++e) {
        size_t at = rng() % body.size();
        switch (rng() % 3) {
          case 0:
            body.resize(at);
            break;
          case 1:
            body[at] = char(rng() % 256);
            break;
          default:
            body.insert(at, 1, "{}[],:\"0-.e\\"[rng() % 12]);
        }
      }
    } else {
      ojson o = ojson::object();
      size_t n = rng() % 8;
      for (size_t i = 0; i < n; ++i) o[fields[rng() % num_fields]] = random_value(rng, 0);
      if (rng() % 2) o["prompt"] = random_value(rng, 0);
      if (rng() % 2)
        o["messages"] = ojson::array({{{"role", "user"}, {"content", random_value(rng, 1)}}});
      body = o.dump(-1, ' ', false, ojson::error_handler_t::replace);
    }
    for (bool chat : {false, true}) {
      try {
        auto r = parse_generate_request(parse_json_body(body), chat);
        ++accepted;
        // What is accepted is within the documented ranges.
        EXPECT_GE(r.params.temperature, 0.0);
        EXPECT_GT(r.params.top_p, 0.0);
        EXPECT_LE(r.params.top_p, 1.0);
        EXPECT_GE(r.params.max_tokens, 1);
        EXPECT_GE(r.params.min_tokens, 0);
        EXPECT_LE(r.params.top_logprobs, 20);
        EXPECT_GE(r.params.top_logprobs, 0);
        EXPECT_GE(r.n, 1);
        if (!chat) {
          EXPECT_FALSE(r.prompts.empty());
          EXPECT_LE(int64_t(r.prompts.size()) * r.n, kMaxChoices);
          for (const PromptInput& p : r.prompts) {
            EXPECT_TRUE(p.text.has_value() || !p.ids.empty());
            for (int32_t id : p.ids) EXPECT_GE(id, 0);
          }
        } else {
          EXPECT_FALSE(r.messages.empty());
        }
      } catch (const ApiError& e) {
        ++refused_count;
        EXPECT_EQ(e.status, 400);
        EXPECT_FALSE(std::string(e.what()).empty());
      }
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused_count, 100);
  RecordProperty("iterations", std::to_string(iters));
}

}  // namespace
}  // namespace sieve::server
