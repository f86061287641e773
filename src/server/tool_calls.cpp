#include "server/tool_calls.h"

#include <algorithm>

#include "guided/guided.h"
#include "server/stop_strings.h"

namespace sieve::server {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kNs = "]<]minimax[>[";
constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kOpenM2 = "<minimax:tool_call>";

// The first tool-call opening in `text` (its namespace token included), or npos.
size_t find_open(std::string_view text) {
  size_t best = std::string_view::npos;
  for (std::string_view tag : {kOpen, kOpenM2}) {
    size_t p = text.find(tag);
    if (p == std::string_view::npos) continue;
    if (p >= kNs.size() && text.substr(p - kNs.size(), kNs.size()) == kNs) p -= kNs.size();
    best = std::min(best, p);
  }
  return best;
}

// The text with every namespace token removed.
std::string strip_ns(std::string_view s) {
  std::string out;
  size_t at = 0;
  for (size_t p; (p = s.find(kNs, at)) != std::string_view::npos; at = p + kNs.size()) out.append(s.substr(at, p - at));
  out.append(s.substr(at));
  return out;
}

// The value of attribute name="..." of a tag that starts at `s` (after "<invoke " etc.).
bool read_name(std::string_view s, size_t& at, std::string& name) {
  const std::string_view key = "name=\"";
  if (s.substr(at, key.size()) != key) return false;
  const size_t end = s.find('"', at + key.size());
  if (end == std::string_view::npos) return false;
  name = std::string(s.substr(at + key.size(), end - at - key.size()));
  at = end + 1;
  if (at >= s.size() || s[at] != '>') return false;
  ++at;
  return true;
}

// A character of a parameter tag's name (<KEY>): letters, digits, '_' and '-'.
bool tag_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// A tools entry's function object ({"type": "function", "function": {...}} or the function
// itself), or null when it has no string name.
const ojson* function_of(const ojson& entry) {
  const ojson& fn = entry.is_object() && entry.contains("function") ? entry["function"] : entry;
  if (!fn.is_object()) return nullptr;
  auto name = fn.find("name");
  return name != fn.end() && name->is_string() ? &fn : nullptr;
}

// The function object of the request's first tool named `name`, or null.
const ojson* find_function(const ojson& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const ojson& t : tools)
    if (const ojson* fn = function_of(t); fn && (*fn)["name"].get<std::string>() == name) return fn;
  return nullptr;
}

// A function's declared parameter properties (an object), or null.
const ojson* properties_of(const ojson* fn) {
  if (!fn) return nullptr;
  if (auto p = fn->find("parameters"); p != fn->end() && p->is_object())
    if (auto q = p->find("properties"); q != p->end() && q->is_object()) return &*q;
  return nullptr;
}

// The type(s) a schema names ("type": a string or a list of strings); empty when none.
std::vector<std::string> schema_types(const ojson& schema) {
  std::vector<std::string> types;
  if (!schema.is_object()) return types;
  if (auto ty = schema.find("type"); ty != schema.end()) {
    if (ty->is_string()) types.push_back(ty->get<std::string>());
    if (ty->is_array())
      for (const ojson& x : *ty)
        if (x.is_string()) types.push_back(x.get<std::string>());
  }
  return types;
}

// The JSON schema type(s) of a parameter, from the request's tools; empty when unknown.
std::vector<std::string> param_types(const ojson& tools, const std::string& tool, const std::string& param) {
  const ojson* props = properties_of(find_function(tools, tool));
  if (!props) return {};
  auto it = props->find(param);
  return it == props->end() ? std::vector<std::string>{} : schema_types(*it);
}

ojson param_value(std::string value, const std::vector<std::string>& types) {
  if (!value.empty() && value.front() == '\n') value.erase(0, 1);
  if (!value.empty() && value.back() == '\n') value.pop_back();
  bool try_json;
  if (!types.empty()) {
    try_json = std::any_of(types.begin(), types.end(), [](const std::string& t) { return t != "string"; }) &&
               !(types.size() == 1 && types[0] == "string");
  } else {
    ojson probe = ojson::parse(value, nullptr, false);
    try_json = !probe.is_discarded() && !probe.is_string();
  }
  if (try_json) {
    ojson v = ojson::parse(value, nullptr, false);
    if (!v.is_discarded()) return v;
  }
  return value;
}

}  // namespace

const std::vector<std::string>& tool_parser_names() {
  static const std::vector<std::string> names = {"minimax_m3", "minimax_m2"};
  return names;
}

std::vector<std::string> tool_names(const ojson& tools) {
  std::vector<std::string> names;
  if (tools.is_array())
    for (const ojson& t : tools)
      if (const ojson* fn = function_of(t)) names.push_back((*fn)["name"].get<std::string>());
  return names;
}

namespace {

// The rules every tool-call grammar shares: JSON values and the namespace token.
constexpr const char* kToolGrammarBase = R"(text ::= ([^<] | "<" [^/])*
int ::= "-"? ("0" | [1-9] [0-9]{0,18})
num ::= int ("." [0-9]{1,16})? ([eE] [+-]? [0-9]{1,3})?
bool ::= "true" | "false"
jws ::= [ \t\n]{0,4}
jstr ::= "\"" ([^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
jobj ::= "{" jws (jstr jws ":" jws jv jws ("," jws jstr jws ":" jws jv jws)*)? "}"
jarr ::= "[" jws (jv jws ("," jws jv jws)*)? "]"
jv ::= jobj | jarr | jstr | num | bool | "null"
)";

// The grammar of one parameter's value, from its schema (the tool parser's typing: strings as
// written, other types as JSON).
std::string value_rule(const ojson& schema) {
  if (!schema.is_object()) return "text";
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
    std::string alts;
    for (const ojson& v : *e) {
      if (!alts.empty()) alts += " | ";
      alts += guided::ebnf_literal(v.is_string() ? v.get<std::string>() : v.dump());
    }
    return "(" + alts + ")";
  }
  std::string alts;
  for (const std::string& t : schema_types(schema)) {
    const char* r = t == "string" ? "text" : t == "integer" ? "int" : t == "number" ? "num" : t == "boolean" ? "bool"
                    : t == "null" ? "\"null\"" : t == "object" ? "jobj" : t == "array" ? "jarr" : nullptr;
    if (!r || t == "string") return "text";  // text takes any value the others write
    if (!alts.empty()) alts += " | ";
    alts += r;
  }
  return alts.empty() ? "text" : "(" + alts + ")";
}

}  // namespace

std::string tool_call_grammar(const std::vector<std::string>& names, const ojson& tools, bool several) {
  std::string calls, rules;
  int i = 0;
  for (const std::string& name : names) {
    const ojson* fn = find_function(tools, name);
    const ojson* params = fn && fn->contains("parameters") ? &(*fn)["parameters"] : nullptr;
    const ojson* props = properties_of(fn);
    std::vector<std::string> required;
    if (params && params->is_object())
      if (auto r = params->find("required"); r != params->end() && r->is_array())
        for (const ojson& x : *r)
          if (x.is_string()) required.push_back(x.get<std::string>());
    const std::string call = "call" + std::to_string(i++);
    std::string body;
    if (props) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        const std::string& key = it.key();
        const bool tag = !key.empty() && std::all_of(key.begin(), key.end(), tag_name_char);
        // M3's form, the parameter named by its tag, unless the name cannot be a tag.
        const std::string open = tag ? "<" + key + ">" : "<parameter name=\"" + key + "\">";
        const std::string close = tag ? "</" + key + ">" : "</parameter>";
        const std::string item = "ns " + guided::ebnf_literal(open) + " " + value_rule(*it) + " ns " + guided::ebnf_literal(close) + " \"\\n\"";
        const bool req = std::find(required.begin(), required.end(), key) != required.end();
        body += req ? " " + item : " (" + item + ")?";
      }
    } else {
      // No declared properties: any parameters, named by their tags.
      body = R"( (ns "<" [a-zA-Z0-9_-]+ ">" text ns "</" [a-zA-Z0-9_-]+ ">" "\n")*)";
    }
    rules += call + " ::= ns " + guided::ebnf_literal("<invoke name=\"" + name + "\">\n") + body + " ns " +
             guided::ebnf_literal("</invoke>\n") + "\n";
    calls += (calls.empty() ? "" : " | ") + call;
  }
  const std::string close = "</" + std::string(kOpen.substr(1));
  return "root ::= ns " + guided::ebnf_literal(std::string(kOpen) + "\n") + " calls" + std::string(several ? "+" : "") +
         " ns " + guided::ebnf_literal(close) + "\ncalls ::= " + calls + "\nns ::= " + guided::ebnf_literal(kNs) + "\n" +
         rules + kToolGrammarBase;
}

size_t tool_call_content_prefix(std::string_view text) {
  if (const size_t p = find_open(text); p != std::string_view::npos) return p;
  static const std::string openings[] = {std::string(kNs) + std::string(kOpen), std::string(kOpen),
                                         std::string(kOpenM2)};
  return text.size() - held_tail(text, openings);
}

namespace {

// An invoke of a tool-call block whose name tag is complete: its complete parameters (name, raw
// value) in order, and whether its </invoke> came.
struct RawInvoke {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;
  bool closed = false;
};

// The invokes of `text` from its first tool-call opening on (none without one); the scan ends at
// an invoke that is not closed, or a tag it cannot read.
std::vector<RawInvoke> scan_invokes(std::string_view text) {
  std::vector<RawInvoke> out;
  const size_t open = find_open(text);
  if (open == std::string_view::npos) return out;
  const std::string body = strip_ns(text.substr(open));
  size_t at = 0;
  while (true) {
    const size_t inv = body.find("<invoke ", at);
    if (inv == std::string::npos) break;
    size_t p = inv + std::string_view("<invoke ").size();
    RawInvoke call;
    if (!read_name(body, p, call.name)) break;
    const size_t end = body.find("</invoke>", p);
    call.closed = end != std::string::npos;
    const std::string_view inner = std::string_view(body).substr(p, call.closed ? end - p : std::string::npos);
    // Parameters: <parameter name="KEY">VALUE</parameter>, or named by the tag itself,
    // <KEY>VALUE</KEY> (M3, as ATOM's parser reads it). Another '<' is text of the body.
    size_t q = 0;
    while (true) {
      const size_t lt = inner.find('<', q);
      if (lt == std::string_view::npos) break;
      size_t r = lt + 1;
      std::string key, close_tag;
      if (inner.substr(lt, std::string_view("<parameter ").size()) == "<parameter ") {
        r = lt + std::string_view("<parameter ").size();
        if (!read_name(inner, r, key)) break;
        close_tag = "</parameter>";
      } else {
        size_t e = r;
        while (e < inner.size() && tag_name_char(inner[e])) ++e;
        if (e == inner.size()) break;  // the tag is still being written
        if (e == r || inner[e] != '>') {
          q = lt + 1;
          continue;
        }
        key = std::string(inner.substr(r, e - r));
        r = e + 1;
        close_tag = "</" + key + ">";
      }
      const size_t close = inner.find(close_tag, r);
      if (close == std::string_view::npos) break;
      call.params.emplace_back(std::move(key), std::string(inner.substr(r, close - r)));
      q = close + close_tag.size();
    }
    out.push_back(std::move(call));
    if (!out.back().closed) break;
    at = end + std::string_view("</invoke>").size();
  }
  return out;
}

}  // namespace

ToolCallParse parse_tool_calls(std::string_view text, const ojson& tools) {
  ToolCallParse out;
  for (const RawInvoke& inv : scan_invokes(text)) {
    if (!inv.closed) break;  // cut short: not a call
    ParsedToolCall call;
    call.name = inv.name;
    for (const auto& [key, raw] : inv.params) call.arguments[key] = param_value(raw, param_types(tools, inv.name, key));
    out.calls.push_back(std::move(call));
  }
  out.content = out.calls.empty() ? std::string(text) : std::string(text.substr(0, find_open(text)));
  return out;
}

std::string ToolCallStream::push(std::string_view content) {
  text_.append(content);
  const size_t upto = tool_call_content_prefix(text_);
  if (upto <= sent_) return {};
  std::string out = text_.substr(sent_, upto - sent_);
  sent_ = upto;
  return out;
}

ToolCallParse ToolCallStream::finish(const nlohmann::ordered_json& tools) {
  ToolCallParse tp = parse_tool_calls(text_, tools);
  tp.content = finish_content(!tp.calls.empty());
  return tp;
}

std::string ToolCallStream::finish_content(bool calls) {
  const size_t end = calls ? find_open(text_) : text_.size();
  std::string out = end > sent_ ? text_.substr(sent_, end - sent_) : std::string();
  sent_ = std::max(sent_, end);
  return out;
}

std::vector<ToolCallDelta> ToolCallStream::take_calls(const nlohmann::ordered_json& tools, bool at_end) {
  std::vector<ToolCallDelta> out;
  const std::vector<RawInvoke> invokes = scan_invokes(text_);
  if (streamed_.size() < invokes.size()) streamed_.resize(invokes.size());
  for (size_t i = 0; i < invokes.size(); ++i) {
    const RawInvoke& inv = invokes[i];
    Streamed& st = streamed_[i];
    ToolCallDelta d;
    d.index = int(i);
    if (!st.named) {
      d.first = true;
      d.name = inv.name;
      st.named = true;
    }
    for (; st.params < inv.params.size(); ++st.params) {
      const auto& [key, raw] = inv.params[st.params];
      d.arguments += st.params == 0 ? "{" : ",";
      d.arguments += ojson(key).dump() + ":" + param_value(raw, param_types(tools, inv.name, key)).dump();
    }
    if (!st.closed && (inv.closed || at_end)) {
      d.arguments += st.params == 0 ? "{}" : "}";
      st.closed = true;
    }
    if (d.first || !d.arguments.empty()) out.push_back(std::move(d));
  }
  return out;
}

}  // namespace sieve::server
