// The grammars of forced tool calls (tool_choice "required" or a named function): the block the
// chat template writes, with values of the tools' schema types.
#include <algorithm>

#include "guided/guided.h"
#include "server/tool_calls.h"
#include "server/tool_calls_schema.h"

namespace sieve::server {

namespace {

using ojson = nlohmann::ordered_json;
using guided::ebnf_literal;

// Nested schemas deeper than this take any value (a tree of tags, or text).
constexpr int kMaxSchemaDepth = 8;

// The rules every grammar shares: JSON values.
constexpr const char* kJsonRules = R"(int ::= "-"? ("0" | [1-9] [0-9]{0,18})
num ::= int ("." [0-9]{1,16})? ([eE] [+-]? [0-9]{1,3})?
bool ::= "true" | "false"
jws ::= [ \t\n]{0,4}
jstr ::= "\"" ([^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
jobj ::= "{" jws (jstr jws ":" jws jv jws ("," jws jstr jws ":" jws jv jws)*)? "}"
jarr ::= "[" jws (jv jws ("," jws jv jws)*)? "]"
jv ::= jobj | jarr | jstr | num | bool | "null"
)";

// MiniMax-M3: text holds no "]<]" (so never the namespace token); a value of unknown shape is
// text or elements with any tag names.
constexpr const char* kM3Rules = R"(ns ::= "]<]minimax[>["
text ::= ([^\]] | "]"+ ([^\]<] | "<" [^\]]))* ("]"+ "<"?)?
tagname ::= [A-Za-z_] [A-Za-z0-9_.\-]{0,63}
anyval ::= text | anyel+
anyel ::= ns "<" tagname ">" anyval ns "</" tagname ">"
)";

// Whether `key` can be a tag of the M3 form (<key>...</key>).
bool tag_key(const std::string& key) {
  return !key.empty() && key.size() <= 256 && key.find_first_of("<>/\n") == std::string::npos &&
         key.find("]<]") == std::string::npos;
}

// The JSON text, or for a string its text, of an enum value as a template writes it.
std::string enum_text(const ojson& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The rules of one grammar: values by schema, each object and array schema a rule of its own.
class Builder {
 public:
  std::string rules;

  // M3: the expression of a value of `schema`; empty when only null fits (the template leaves
  // null values out).
  std::string m3_value(const ojson* schema, int depth) {
    if (!schema || depth > kMaxSchemaDepth) return "anyval";
    if (auto alts = literal_alternatives(*schema); !alts.empty()) return alts;
    const SchemaTypes t = types_of(schema);
    if (t.none()) return "anyval";
    if (t.string) return "text";  // text takes what the other types write
    std::vector<std::string> alts;
    if (t.integer) alts.push_back("int");
    if (t.number) alts.push_back("num");
    if (t.boolean) alts.push_back("bool");
    if (t.object) {
      const ojson* obj = with_key(schema, "properties");
      alts.push_back(obj ? rule("obj", m3_members(obj, depth + 1)) : "anyel*");
    }
    if (t.array) {
      const std::string item = m3_value(item_schema(schema), depth + 1);
      const std::string one = "ns \"<item>\" " + (item.empty() ? std::string("\"\"") : item) + " ns \"</item>\"";
      const ojson* arr = with_key(schema, "items");
      alts.push_back(rule("arr", "(" + one + ")" + bounds(arr ? *arr : *schema)));
    }
    return join(alts);
  }

  // M3: the elements of an object schema's properties, in their order, the required ones present.
  std::string m3_members(const ojson* schema, int depth) {
    const ojson* props = schema && schema->contains("properties") ? &(*schema)["properties"] : nullptr;
    if (!props || !props->is_object()) return "anyel*";
    std::string out;
    for (auto it = props->begin(); it != props->end(); ++it) {
      if (!tag_key(it.key())) continue;
      const std::string v = m3_value(it->is_object() ? &*it : nullptr, depth);
      if (v.empty()) continue;
      const std::string el = "ns " + ebnf_literal("<" + it.key() + ">") + " " + v + " ns " +
                             ebnf_literal("</" + it.key() + ">");
      out += (out.empty() ? "" : " ") + (required(*schema, it.key()) ? el : "(" + el + ")?");
    }
    return out.empty() ? "\"\"" : out;
  }

  // M2: parameters as <parameter name="KEY">, strings as text, other values as JSON.
  std::string m2_members(const ojson* schema) {
    const ojson* props = schema && schema->contains("properties") ? &(*schema)["properties"] : nullptr;
    if (!props || !props->is_object())
      return R"(("<parameter name=\"" [^"\n]+ "\">" text "</parameter>\n")*)";
    std::string out;
    for (auto it = props->begin(); it != props->end(); ++it) {
      const std::string el = ebnf_literal("<parameter name=\"" + it.key() + "\">") + " " +
                             m2_value(it->is_object() ? &*it : nullptr) + " " + ebnf_literal("</parameter>\n");
      out += (out.empty() ? "" : " ") + (required(*schema, it.key()) ? el : "(" + el + ")?");
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string m2_value(const ojson* schema) {
    if (!schema) return "text";
    if (auto alts = literal_alternatives(*schema); !alts.empty()) return alts;
    const SchemaTypes t = types_of(schema);
    if (t.none() || t.string) return "text";
    std::vector<std::string> alts;
    if (t.integer) alts.push_back("int");
    if (t.number) alts.push_back("num");
    if (t.boolean) alts.push_back("bool");
    if (t.null) alts.push_back("\"null\"");
    if (t.object) alts.push_back("jobj");
    if (t.array) alts.push_back("jarr");
    return join(alts);
  }

  // A new rule named `stem` + a number; returns its name.
  std::string rule(const std::string& stem, const std::string& body) {
    const std::string name = stem + std::to_string(next_++);
    rules += name + " ::= " + body + "\n";
    return name;
  }

 private:
  int next_ = 0;

  static std::string join(const std::vector<std::string>& alts) {
    if (alts.empty()) return {};
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  // An enum or const: one of its values as the template writes them (null ones left out).
  std::string literal_alternatives(const ojson& schema) const {
    std::vector<std::string> alts;
    auto add = [&](const ojson& v) {
      if (!v.is_null() && !v.is_object() && !v.is_array()) alts.push_back(ebnf_literal(enum_text(v)));
    };
    if (auto c = schema.find("const"); c != schema.end()) add(*c);
    if (auto e = schema.find("enum"); e != schema.end() && e->is_array())
      for (const ojson& v : *e) add(v);
    return join(alts);
  }

  static bool required(const ojson& schema, const std::string& key) {
    auto r = schema.find("required");
    return r != schema.end() && r->is_array() && std::find(r->begin(), r->end(), ojson(key)) != r->end();
  }

  // An array's minItems / maxItems as a repetition (up to the grammar's bound of 256).
  static std::string bounds(const ojson& schema) {
    auto count = [&](const char* key, int64_t fallback) {
      auto v = schema.find(key);
      return v != schema.end() && v->is_number_integer() ? std::clamp<int64_t>(v->get<int64_t>(), 0, 256) : fallback;
    };
    const int64_t lo = count("minItems", 0), hi = count("maxItems", -1);
    if (lo == 0 && hi < 0) return "*";
    std::string out = "{";
    out += std::to_string(hi < 0 ? lo : std::min(lo, hi));
    out += ",";
    if (hi >= 0) out += std::to_string(hi);
    return out + "}";
  }
};

}  // namespace

std::string tool_call_grammar(const std::vector<std::string>& names, const ojson& tools, bool several,
                              const std::string& parser) {
  const bool m2 = parser == "minimax_m2";
  Builder b;
  std::string calls;
  for (const std::string& name : names) {
    const ojson* params = parameters_of(find_function(tools, name));
    const std::string body =
        m2 ? ebnf_literal("<invoke name=\"" + name + "\">\n") + " " + b.m2_members(params) + " " +
                 ebnf_literal("</invoke>\n")
           : "ns " + ebnf_literal("<invoke name=\"" + name + "\">") + " " +
                 (params ? b.m3_members(params, 0) : std::string("anyel*")) + " ns " + ebnf_literal("</invoke>\n");
    calls += (calls.empty() ? "" : " | ") + b.rule("call", body);
  }
  const std::string repeat = several ? "+" : "";
  if (m2)
    return "root ::= \"<minimax:tool_call>\\n\" (" + calls + ")" + repeat + " \"</minimax:tool_call>\"\n" +
           "text ::= ([^<] | \"<\" [^/])*\n" + b.rules + kJsonRules;
  return "root ::= ns \"<tool_call>\\n\" (" + calls + ")" + repeat + " ns \"</tool_call>\"\n" + b.rules + kM3Rules +
         kJsonRules;
}

}  // namespace sieve::server
