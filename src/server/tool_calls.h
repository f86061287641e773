// Tool-call parsers for chat completions (`sieve serve --enable-auto-tool-choice
// --tool-call-parser minimax_m3`): MiniMax's XML tool calls in the generated text become the
// message's `tool_calls`, as vLLM's MiniMax tool parsers return them. The format is the one the
// chat template renders: every tag may carry the M3 namespace token ]<]minimax[>[ in front,
//   <tool_call>
//   <invoke name="NAME">
//   <KEY>VALUE</KEY> ...                       (M3: the parameter named by its tag, as ATOM reads it)
//   <parameter name="KEY">VALUE</parameter> ... (M2's form, which templates also render)
//   </invoke> ...
//   </tool_call>
// and MiniMax-M2's <minimax:tool_call> opening is accepted too.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sieve::server {

// The names --tool-call-parser accepts (one format).
const std::vector<std::string>& tool_parser_names();

struct ParsedToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

struct ToolCallParse {
  std::string content;  // the text before the first tool call (all of it when there is none)
  std::vector<ParsedToolCall> calls;
};

// Parses the tool calls of a complete text. A parameter's value is JSON when the tool's schema
// (from the request's `tools`) gives the parameter a type other than string and the value parses
// as JSON, or, without a schema, when it parses as a JSON object, array, number, boolean or null;
// otherwise it is the string as written (one leading and one trailing newline dropped). A text
// whose tool-call block holds no complete invoke (generation cut short) is all content.
ToolCallParse parse_tool_calls(std::string_view text, const nlohmann::ordered_json& tools);

// The function names of a request's tools (entries {"type": "function", "function": {...}}, or
// the function objects themselves), in order; entries without a string name are skipped.
std::vector<std::string> tool_names(const nlohmann::ordered_json& tools);

// The grammar (EBNF of guided/guided.h) of what tool_choice "required" (`several`: one call or
// more, of any of `names`) or a named function (one call) makes the output: the tool-call block
// as the chat template writes it, with the namespace token before every tag, each call's
// parameters in the order its schema declares them, the required ones present, each written
// <KEY>VALUE</KEY> (or <parameter name="KEY"> when the key is not a tag name) with a value of
// its schema's type: integer, number, boolean and null as JSON scalars, object and array as
// JSON, enum as one of its values, string (or no type) as text without "</".
std::string tool_call_grammar(const std::vector<std::string>& names, const nlohmann::ordered_json& tools,
                              bool several);

// Streaming: how much of `text` is surely content: up to the first tool-call opening, and short
// of a suffix that could begin one.
size_t tool_call_content_prefix(std::string_view text);

// A piece of a streamed call (OpenAI's tool_calls delta): the call's first piece carries its
// name; the pieces' arguments, concatenated, are the call's arguments as JSON text (what the
// non-streamed response gives, but for a parameter named twice, which a response keeps once).
struct ToolCallDelta {
  int index = 0;
  bool first = false;  // the call's first piece (it carries the name)
  std::string name;
  std::string arguments;
};

// A streamed chat's content through the parser: push() returns the content that can go out now
// (it stops short of a tool-call opening). Then either
//  - take_calls() after each push: the new pieces of the calls, as vLLM streams them: a call's
//    name once its invoke tag is complete, each parameter as it closes ("{" and "key": value,
//    then ",", ...), "}" at its </invoke>; at_end closes a call cut short as it stands. At the
//    end, finish_content(calls_begun()) returns the rest of the content;
//  - or finish() at the end: the rest of the content and the calls, parsed from everything
//    pushed.
class ToolCallStream {
 public:
  std::string push(std::string_view content);
  std::vector<ToolCallDelta> take_calls(const nlohmann::ordered_json& tools, bool at_end);
  bool calls_begun() const { return !streamed_.empty(); }
  // The content not returned yet: up to the tool-call opening when there are calls, else all.
  std::string finish_content(bool calls);
  ToolCallParse finish(const nlohmann::ordered_json& tools);

 private:
  struct Streamed {
    bool named = false, closed = false;
    size_t params = 0;  // parameters sent
  };
  std::string text_;
  size_t sent_ = 0;
  std::vector<Streamed> streamed_;
};

}  // namespace sieve::server
