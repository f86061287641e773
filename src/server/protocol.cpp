#include "server/protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace sieve::server {

using ojson = nlohmann::ordered_json;

nlohmann::json error_json(int status, const std::string& message, const std::string& param,
                          const std::string& type) {
  std::string t = type;
  if (t.empty()) {
    if (status == 401)
      t = "authentication_error";
    else if (status == 404)
      t = "not_found_error";
    else if (status >= 500)
      t = "server_error";
    else
      t = "invalid_request_error";
  }
  nlohmann::json e = {{"message", message}, {"type", t}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) e["param"] = param;
  return nlohmann::json{{"error", e}};
}

ojson parse_json_body(const std::string& body) {
  ojson j;
  try {
    // Nothing a request holds nests this deep; a document that does is refused as it is read,
    // before it is built (and later walked by recursive code).
    j = ojson::parse(body, [](int depth, ojson::parse_event_t, ojson&) {
      if (depth > kMaxJsonDepth)
        throw ApiError(400, "the request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      return true;
    });
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

const char* type_name(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null:
      return "null";
    case ojson::value_t::boolean:
      return "a boolean";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned:
      return "an integer";
    case ojson::value_t::number_float:
      return "a number";
    case ojson::value_t::string:
      return "a string";
    case ojson::value_t::array:
      return "an array";
    case ojson::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw ApiError(400, field + ": " + what, field);
}

// Field readers: absent or null means "use the default" (as the OpenAI schema's optional fields).
const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const ojson& body, const char* name, bool def) {
  const ojson* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) bad(name, std::string("expected a boolean, got ") + type_name(*v));
  return v->get<bool>();
}

double get_number(const ojson& body, const char* name, double def, double lo, double hi) {
  const ojson* v = field(body, name);
  if (!v) return def;
  if (!v->is_number()) bad(name, std::string("expected a number, got ") + type_name(*v));
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(name, "must be between " + nlohmann::json(lo).dump() + " and " + nlohmann::json(hi).dump() +
                  ", got " + v->dump());
  return x;
}

int64_t get_int(const ojson& body, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const ojson* v = field(body, name);
  if (!v) return def;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(name, "must be at most " + std::to_string(hi) + ", got " + v->dump());
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    double d = v->get<double>();
    // JSON clients write 16.0 for 16 now and then; accept integral floats, as pydantic does.
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
      bad(name, std::string("expected an integer, got ") + v->dump());
    x = int64_t(d);
  } else {
    bad(name, std::string("expected an integer, got ") + type_name(*v));
  }
  if (x < lo || x > hi)
    bad(name, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                  std::to_string(x));
  return x;
}

std::vector<int32_t> get_id_list(const ojson& arr, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const ojson& v = arr[i];
    if (!v.is_number_integer())
      bad(name,
          "element " + std::to_string(i) + ": expected a token id (integer), got " + type_name(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT32_MAX)
                               : (v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX))
      bad(name,
          "element " + std::to_string(i) + ": token id " + v.dump() + " is outside the vocabulary");
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(const ojson& body, GenerateRequest& r) {
  const ojson* p = field(body, "prompt");
  if (!p) bad("prompt", "is required (a string, an array of token ids, or a batch of either)");
  if (p->is_string()) {
    r.prompts.push_back({p->get<std::string>(), {}});
    return;
  }
  if (!p->is_array())
    bad("prompt", std::string("expected a string or an array of token ids, got ") + type_name(*p));
  if (p->empty()) bad("prompt", "is empty");
  const ojson& first = (*p)[0];
  if (first.is_number()) {
    r.prompts.push_back({std::nullopt, get_id_list(*p, "prompt")});
    return;
  }
  // A batch: strings, or arrays of token ids.
  if (int64_t(p->size()) > kMaxChoices)
    bad("prompt", "a batch of " + std::to_string(p->size()) + " prompts is more than " +
                      std::to_string(kMaxChoices));
  for (size_t i = 0; i < p->size(); ++i) {
    const ojson& e = (*p)[i];
    const std::string where = "prompt[" + std::to_string(i) + "]";
    if (e.is_string()) {
      r.prompts.push_back({e.get<std::string>(), {}});
    } else if (e.is_array()) {
      if (e.empty()) bad(where, "is empty");
      r.prompts.push_back({std::nullopt, get_id_list(e, where)});
    } else {
      bad(where, std::string("expected a string or an array of token ids, got ") + type_name(e));
    }
  }
}

void parse_messages(const ojson& body, GenerateRequest& r, const RequestDefaults& defaults) {
  const ojson* m = field(body, "messages");
  if (!m) bad("messages", "is required (an array of {role, content} objects)");
  if (!m->is_array()) bad("messages", std::string("expected an array, got ") + type_name(*m));
  if (m->empty()) bad("messages", "must contain at least one message");
  ojson out = ojson::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const ojson& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) bad(where, std::string("expected an object, got ") + type_name(msg));
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string())
      bad(where + ".role", "is required and must be a string");
    ojson copy = msg;
    // Earlier reasoning comes back as `reasoning` (vLLM's name now) or `reasoning_content` (what
    // the templates read): the template sees it under the latter either way.
    if (auto rs = msg.find("reasoning"); rs != msg.end() && rs->is_string() && !msg.contains("reasoning_content"))
      copy["reasoning_content"] = *rs;
    auto content = msg.find("content");
    if (content != msg.end() && !content->is_null()) {
      if (content->is_array()) {
        // Content parts: only text parts can be served by a text model; join them as vLLM does.
        std::string text;
        for (size_t k = 0; k < content->size(); ++k) {
          const ojson& part = (*content)[k];
          const std::string pw = where + ".content[" + std::to_string(k) + "]";
          if (!part.is_object()) bad(pw, std::string("expected an object, got ") + type_name(part));
          auto type = part.find("type");
          if (type == part.end() || !type->is_string()) bad(pw + ".type", "is required");
          if (*type != "text")
            bad(pw + ".type",
                "'" + type->get<std::string>() + "' content is not supported by this text model");
          auto t = part.find("text");
          if (t == part.end() || !t->is_string())
            bad(pw + ".text", "is required and must be a string");
          if (!text.empty()) text += "\n";
          text += t->get<std::string>();
        }
        copy["content"] = text;
      } else if (!content->is_string()) {
        bad(where + ".content",
            std::string("expected a string or an array of content parts, got ") +
                type_name(*content));
      }
    } else if (!msg.contains("tool_calls")) {
      copy["content"] = "";
    }
    out.push_back(std::move(copy));
  }
  r.messages = std::move(out);
  const ojson* tools = field(body, "tools");
  if (tools) {
    if (!tools->is_array())
      bad("tools", std::string("expected an array, got ") + type_name(*tools));
    // Each entry a function with a name: a parser or a forced call could not use anything else.
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      auto refuse = [&](const std::string& what) { throw ApiError(400, at + what, "tools"); };
      if (!t.is_object()) refuse(std::string(": expected an object, got ") + type_name(t));
      if (auto ty = t.find("type"); ty != t.end() && (!ty->is_string() || ty->get<std::string>() != "function"))
        refuse(".type: expected \"function\", got " + ty->dump());
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object())
        refuse(".function: expected an object with the function's name, got " +
               (fn == t.end() ? std::string("nothing") : std::string(type_name(*fn))));
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
        refuse(".function.name: expected a non-empty string");
    }
    r.tools = *tools;
  }
  r.tool_choice = r.tools.is_array() && !r.tools.empty() ? "auto" : "none";
  if (const ojson* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      const std::string v = tc->get<std::string>();
      if (v != "none" && v != "auto" && v != "required")
        bad("tool_choice", "expected \"none\", \"auto\", \"required\" or a named function, got \"" + v + "\"");
      r.tool_choice = v;
    } else if (tc->is_object() && tc->value("type", std::string()) == "function" && tc->contains("function") &&
               (*tc)["function"].is_object() && (*tc)["function"].value("name", ojson()).is_string()) {
      r.tool_choice = "function:" + (*tc)["function"]["name"].get<std::string>();
    } else {
      bad("tool_choice", "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}, got " + tc->dump());
    }
  }
  // The server's defaults, then the request's keys over them (vLLM's order).
  r.chat_template_kwargs = defaults.chat_template_kwargs;
  const ojson* kw = field(body, "chat_template_kwargs");
  if (kw) {
    if (!kw->is_object())
      bad("chat_template_kwargs", std::string("expected an object, got ") + type_name(*kw));
    for (auto it = kw->begin(); it != kw->end(); ++it) r.chat_template_kwargs[it.key()] = it.value();
    if (std::string why = check_chat_template_kwargs(*kw); !why.empty())
      bad("chat_template_kwargs." + why.substr(0, why.find(':')), why.substr(why.find(':') + 2));
  }
  r.add_generation_prompt = get_bool(body, "add_generation_prompt", true);
  r.continue_final_message = get_bool(body, "continue_final_message", false);
  if (r.add_generation_prompt && r.continue_final_message && field(body, "add_generation_prompt"))
    bad("continue_final_message", "cannot be combined with add_generation_prompt");
  if (r.continue_final_message) r.add_generation_prompt = false;
}

}  // namespace

std::string check_chat_template_kwargs(const ojson& kwargs) {
  auto mode = kwargs.find("thinking_mode");
  if (mode == kwargs.end() || mode->is_null()) return {};
  if (mode->is_string()) {
    const std::string m = mode->get<std::string>();
    if (m == "enabled" || m == "disabled" || m == "adaptive") return {};
  }
  return "thinking_mode: expected \"enabled\", \"disabled\" or \"adaptive\", got " + mode->dump();
}

RequestDefaults request_defaults_from(const nlohmann::json& generation_config, const nlohmann::json& overrides,
                                      RequestDefaults base) {
  RequestDefaults d = base;
  auto number = [](const nlohmann::json& v, const std::string& key, double lo, double hi, bool lo_open) {
    if (!v.is_number()) throw Error(key + ": expected a number, got " + v.dump());
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
      throw Error(key + ": must be " + (lo_open ? "greater than " : "at least ") + nlohmann::json(lo).dump() +
                  " and at most " + nlohmann::json(hi).dump() + ", got " + v.dump());
    return x;
  };
  auto integer = [](const nlohmann::json& v, const std::string& key, int64_t lo, int64_t hi) {
    if (!v.is_number_integer()) throw Error(key + ": expected an integer, got " + v.dump());
    const int64_t x = v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(hi) + 1))
                                             : v.get<int64_t>();
    if (x < lo || x > hi)
      throw Error(key + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + v.dump());
    return x;
  };
  auto apply = [&](const nlohmann::json& cfg, const std::string& where, bool skip_hf_defaults) {
    if (cfg.is_null()) return;
    if (!cfg.is_object()) throw Error(where + ": expected a JSON object, got " + cfg.dump());
    for (const char* key : {"repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens"}) {
      auto it = cfg.find(key);
      if (it == cfg.end() || it->is_null()) continue;
      const std::string name = where + " " + key;
      const std::string k = key;
      if (k == "repetition_penalty") {
        const double v = number(*it, name, 0.0, 1e6, true);
        if (!(skip_hf_defaults && v == 1.0)) d.repetition_penalty = v;
      } else if (k == "temperature") {
        const double v = number(*it, name, 0.0, 1e6, false);
        if (!(skip_hf_defaults && v == 1.0)) d.temperature = v;
      } else if (k == "top_k") {
        const int64_t v = integer(*it, name, -1, std::numeric_limits<int>::max());
        if (!(skip_hf_defaults && v == 50)) d.top_k = v < 0 ? 0 : int(v);
      } else if (k == "top_p") {
        const double v = number(*it, name, 0.0, 1.0, true);
        if (!(skip_hf_defaults && v == 1.0)) d.top_p = v;
      } else if (k == "min_p") {
        d.min_p = number(*it, name, 0.0, 1.0, false);
      } else {
        d.max_tokens = integer(*it, name, 1, int64_t(1) << 40);
      }
    }
  };
  apply(generation_config, "generation config", true);
  apply(overrides, "--override-generation-config", false);
  return d;
}

GenerateRequest parse_generate_request(const ojson& body, bool chat, const RequestDefaults& d) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  GenerateRequest r;
  r.chat = chat;
  if (const ojson* m = field(body, "model")) {
    if (!m->is_string()) bad("model", std::string("expected a string, got ") + type_name(*m));
    r.model = m->get<std::string>();
  }
  if (chat)
    parse_messages(body, r, d);
  else
    parse_prompt(body, r);

  r.n = int(get_int(body, "n", 1, 1, kMaxChoices));
  const int64_t num_prompts = chat ? 1 : int64_t(r.prompts.size());
  if (num_prompts * r.n > kMaxChoices)
    bad("n", std::to_string(num_prompts) + " prompts x n = " + std::to_string(r.n) + " is more than " +
                 std::to_string(kMaxChoices) + " choices");
  // best_of > n would rank candidates by likelihood, which vLLM's current engine has dropped too.
  if (const int64_t best_of = get_int(body, "best_of", r.n, std::numeric_limits<int64_t>::min(),
                                      std::numeric_limits<int64_t>::max());
      best_of != r.n)
    bad("best_of", "only best_of = n is supported, got " + std::to_string(best_of) + " with n = " +
                       std::to_string(r.n));
  if (const ojson* s = field(body, "suffix")) {
    if (!s->is_string()) bad("suffix", std::string("expected a string, got ") + type_name(*s));
    if (!s->get<std::string>().empty()) bad("suffix", "is not supported");
  }
  // Guided decoding: a JSON object, a JSON schema, a regular expression or one of a list of
  // strings. Grammars are refused rather than answered with free text.
  auto set_guided = [&](const std::string& kind, const std::string& param) {
    if (!r.guided.empty() && r.guided != kind)
      bad(param, "only one kind of guided decoding at a time (already " + r.guided + ")");
    r.guided = kind;
    r.guided_param = param;
  };
  auto read_schema = [&](const ojson& v, const std::string& param) {
    set_guided("json_schema", param);
    if (v.is_object()) {
      r.guided_schema = v.dump();
    } else if (v.is_string()) {
      r.guided_schema = v.get<std::string>();
    } else {
      bad(param, "expected a JSON schema (an object, or its text), got " + v.dump());
    }
  };
  auto read_regex = [&](const ojson& v, const std::string& param) {
    set_guided("regex", param);
    if (!v.is_string() || v.get<std::string>().empty()) bad(param, "expected a non-empty pattern string, got " + v.dump());
    r.guided_schema = v.get<std::string>();
  };
  auto read_grammar = [&](const ojson& v, const std::string& param) {
    set_guided("grammar", param);
    if (!v.is_string() || v.get<std::string>().empty())
      bad(param, "expected a non-empty grammar string (EBNF: root ::= ...), got " + v.dump());
    r.guided_schema = v.get<std::string>();
  };
  auto read_choices = [&](const ojson& v, const std::string& param) {
    if (!v.is_array() || v.empty()) bad(param, "expected a non-empty array of strings, got " + v.dump());
    for (const ojson& c : v) {
      if (!c.is_string() || c.get<std::string>().empty()) bad(param, "expected non-empty strings, got " + c.dump());
      r.guided_choice.push_back(c.get<std::string>());
    }
  };
  if (const ojson* rf = field(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad("response_format", "expected an object with a string \"type\", got " + rf->dump());
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_object") {
      set_guided("json_object", "response_format");
    } else if (type == "json_schema") {
      const ojson* js = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
      if (!js || !js->is_object() || !js->contains("schema"))
        bad("response_format", "json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
      read_schema((*js)["schema"], "response_format");
    } else if (type != "text") {
      bad("response_format", "type \"" + type + "\" is not supported (text, json_object or json_schema)");
    }
  }
  if (const ojson* gc = field(body, "guided_choice")) {
    set_guided("choice", "guided_choice");
    read_choices(*gc, "guided_choice");
  }
  if (const ojson* so = field(body, "structured_outputs")) {
    if (!so->is_object()) bad("structured_outputs", "expected an object, got " + so->dump());
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it->is_null()) continue;
      if (it.key() == "choice") {
        set_guided("choice", "structured_outputs.choice");
        read_choices(*it, "structured_outputs.choice");
      } else if (it.key() == "json") {
        read_schema(*it, "structured_outputs.json");
      } else if (it.key() == "regex") {
        read_regex(*it, "structured_outputs.regex");
      } else if (it.key() == "grammar") {
        read_grammar(*it, "structured_outputs.grammar");
      } else if (it.key() == "json_object") {
        if (!it->is_boolean()) bad("structured_outputs.json_object", "expected a boolean, got " + it->dump());
        if (it->get<bool>()) set_guided("json_object", "structured_outputs.json_object");
      } else {
        bad("structured_outputs." + it.key(),
            "is not supported: this server constrains output to a JSON object, a JSON schema, a regular "
            "expression, an EBNF grammar or choices");
      }
    }
  }
  if (const ojson* gj = field(body, "guided_json")) read_schema(*gj, "guided_json");
  if (const ojson* gr = field(body, "guided_regex")) read_regex(*gr, "guided_regex");
  if (const ojson* gg = field(body, "guided_grammar")) read_grammar(*gg, "guided_grammar");
  if (const ojson* lb = field(body, "logit_bias")) {
    if (!lb->is_object())
      bad("logit_bias", std::string("expected an object, got ") + type_name(*lb));
    for (const auto& [key, v] : lb->items()) {
      const std::string k = key;
      const bool digits = !k.empty() && k.size() <= 10 && k.find_first_not_of("0123456789") == std::string::npos;
      const long long id = digits ? std::stoll(k) : -1;
      if (id < 0 || id > INT32_MAX)
        bad("logit_bias", "keys must be token ids (non-negative integers as strings), got \"" + k + "\"");
      if (!v.is_number())
        bad("logit_bias", "the bias of token " + k + ": expected a number, got " + type_name(v));
      const double b = v.get<double>();
      if (!(b >= -100.0 && b <= 100.0))
        bad("logit_bias", "the bias of token " + k + " must be between -100 and 100, got " + v.dump());
      r.params.logit_bias.emplace_back(int32_t(id), float(b));
    }
  }

  r.stream = get_bool(body, "stream", false);
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object())
      bad("stream_options", std::string("expected an object, got ") + type_name(*so));
    if (!r.stream) bad("stream_options", "is only allowed when stream is true");
    r.include_usage = get_bool(*so, "include_usage", false);
    r.continuous_usage = get_bool(*so, "continuous_usage_stats", false);
  }

  engine::SamplingParams& p = r.params;
  const int64_t kMax = int64_t(1) << 40;
  const char* max_name = "max_tokens";
  if (chat && field(body, "max_completion_tokens")) max_name = "max_completion_tokens";
  if (field(body, max_name)) {
    p.max_tokens = get_int(body, max_name, 16, std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max());
    // max_tokens 0 is the completions API's way (with echo) of asking for the prompt alone.
    if (p.max_tokens == 0 && !chat && get_bool(body, "echo", false)) {
      r.prompt_only = true;
      p.max_tokens = 1;
    }
    if (p.max_tokens < 1) bad(max_name, "must be at least 1, got " + std::to_string(p.max_tokens));
    r.max_tokens_given = true;
  }
  p.temperature = get_number(body, "temperature", d.temperature, 0.0, 1e6);
  p.top_p = get_number(body, "top_p", d.top_p, 0.0, 1.0);
  if (p.top_p <= 0.0) bad("top_p", "must be in (0, 1], got 0");
  p.top_k = int(get_int(body, "top_k", d.top_k, -1, std::numeric_limits<int>::max()));
  if (p.top_k < 0) p.top_k = 0;
  p.min_p = get_number(body, "min_p", d.min_p, 0.0, 1.0);
  p.presence_penalty = get_number(body, "presence_penalty", 0.0, -2.0, 2.0);
  p.frequency_penalty = get_number(body, "frequency_penalty", 0.0, -2.0, 2.0);
  p.repetition_penalty = get_number(body, "repetition_penalty", d.repetition_penalty, 0.0, 1e6);
  if (p.repetition_penalty <= 0.0) bad("repetition_penalty", "must be greater than 0");
  if (const ojson* s = field(body, "seed")) {
    if (!s->is_number_integer())
      bad("seed", std::string("expected an integer, got ") + type_name(*s));
    p.has_seed = true;
    p.seed = s->is_number_unsigned() ? s->get<uint64_t>() : uint64_t(s->get<int64_t>());
  }
  p.min_tokens = get_int(body, "min_tokens", 0, 0, kMax);
  if (r.max_tokens_given && p.min_tokens > p.max_tokens)
    bad("min_tokens", "must be at most max_tokens (" + std::to_string(p.max_tokens) + "), got " +
                          std::to_string(p.min_tokens));
  p.ignore_eos = get_bool(body, "ignore_eos", false);
  if (const ojson* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array())
      bad("stop_token_ids", std::string("expected an array of token ids, got ") + type_name(*ids));
    p.stop_token_ids = get_id_list(*ids, "stop_token_ids");
  }
  if (const ojson* st = field(body, "stop")) {
    if (st->is_string()) {
      r.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      for (size_t i = 0; i < st->size(); ++i) {
        if (!(*st)[i].is_string())
          bad("stop",
              "element " + std::to_string(i) + ": expected a string, got " + type_name((*st)[i]));
        r.stop.push_back((*st)[i].get<std::string>());
      }
    } else {
      bad("stop", std::string("expected a string or an array of strings, got ") + type_name(*st));
    }
    for (const auto& s : r.stop)
      if (s.empty()) bad("stop", "stop strings must not be empty");
  }
  r.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output", false);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens", true);
  r.return_tokens_as_token_ids = get_bool(body, "return_tokens_as_token_ids", false);
  r.add_special_tokens = get_bool(body, "add_special_tokens", !chat);

  if (chat) {
    r.want_logprobs = get_bool(body, "logprobs", false);
    r.top_logprobs = int(get_int(body, "top_logprobs", 0, 0, d.max_logprobs));
    if (r.top_logprobs > 0 && !r.want_logprobs) bad("top_logprobs", "requires logprobs to be true");
  } else {
    if (const ojson* lp = field(body, "logprobs")) {
      if (lp->is_boolean())
        bad("logprobs", "expected an integer (the number of alternatives, 0.." + std::to_string(d.max_logprobs) +
                            "), got a boolean");
      r.top_logprobs = int(get_int(body, "logprobs", 0, 0, d.max_logprobs));
      r.want_logprobs = true;
    }
    r.echo = get_bool(body, "echo", false);
    // echo with logprobs: the prompt's tokens get log-probs too (the first one null).
    if (r.echo && r.want_logprobs) p.prompt_logprobs = r.top_logprobs;
  }
  p.logprobs = r.want_logprobs;
  p.top_logprobs = r.top_logprobs;
  if (r.prompt_only) p.min_tokens = 0;
  return r;
}

}  // namespace sieve::server
