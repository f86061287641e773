#include "server/tool_calls.h"

#include <algorithm>
#include <span>
#include <unordered_map>

#include "server/stop_strings.h"
#include "server/reasoning.h"
#include "server/tool_calls_schema.h"

namespace sieve::server {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kNs = "]<]minimax[>[";
const std::string kNsString(kNs);
const std::string kM3Open = std::string(kNs) + "<tool_call>";
const std::string kM3Close = std::string(kNs) + "</tool_call>";
constexpr std::string_view kM2Open = "<minimax:tool_call>";
constexpr std::string_view kM2Close = "</minimax:tool_call>";
// Deeper values make the block malformed: bounded work and stack, whatever a model writes.
constexpr size_t kMaxDepth = 64;
// A tag longer than this (between '<' and '>') makes the block malformed.
constexpr size_t kMaxTag = 256;

bool is_blank(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool all_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), is_blank);
}

// ------------------------------------------------------------------ XML text

// The longest tail of `s` that could begin an entity (`&`, then up to 10 characters, no ';').
size_t entity_tail(std::string_view s) {
  const size_t amp = s.rfind('&');
  if (amp == std::string_view::npos || s.size() - amp > 10) return 0;
  return s.find(';', amp) == std::string_view::npos ? s.size() - amp : 0;
}

// XML's five named entities and numeric character references; anything else stays as written.
std::string decode_entities(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    const std::string_view name = s.substr(i + 1, semi - i - 1);
    std::string rep;
    if (name == "lt") rep = "<";
    else if (name == "gt") rep = ">";
    else if (name == "amp") rep = "&";
    else if (name == "quot") rep = "\"";
    else if (name == "apos") rep = "'";
    else if (name.size() >= 2 && name[0] == '#') {
      const bool hex = name[1] == 'x' || name[1] == 'X';
      const std::string_view digits = name.substr(hex ? 2 : 1);
      uint32_t cp = 0;
      bool ok = !digits.empty();
      for (char c : digits) {
        const int d = c >= '0' && c <= '9' ? c - '0'
                      : hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : hex && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                      : -1;
        if (d < 0 || cp > 0x10FFFF) ok = false;
        if (ok) cp = cp * (hex ? 16 : 10) + uint32_t(d);
      }
      if (ok && cp > 0 && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF)) {
        if (cp < 0x80) {
          rep = char(cp);
        } else if (cp < 0x800) {
          rep = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
        } else if (cp < 0x10000) {
          rep = {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
        } else {
          rep = {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)),
                 char(0x80 | (cp & 0x3F))};
        }
      }
    }
    if (rep.empty()) {
      out += s[i];
      continue;
    }
    out += rep;
    i = semi;
  }
  return out;
}

// A JSON string's body (no quotes) for streamed pieces of a string value.
std::string json_body(const std::string& s) {
  const std::string q = ojson(s).dump();
  return q.substr(1, q.size() - 2);
}

// ------------------------------------------------------------------ MiniMax-M3

// An element of a value: a leaf (text) or an object / array (child elements).
struct Node {
  std::string tag, text;
  std::vector<Node> children;
};

struct Invoke {
  std::string name;
  std::vector<Node> params;
  bool param_open = false;  // the last parameter is still being written
  bool closed = false;
  // Streaming: what take_calls sent.
  int index = -1;  // -1: not sent yet
  size_t params_sent = 0;
  bool key_sent = false, string_open = false, closed_sent = false;
  size_t text_sent = 0;  // bytes of the open string parameter's text sent
};

struct Block {
  enum State { kOpen, kClosed, kBroken } state = kOpen;
  std::vector<Invoke> invokes;
  bool begun = false;  // a call of it was streamed
};

// A value typed by its schema (tool_schema.h); a value without children is XML text.
ojson typed_value(const Node& n, const ojson* schema, bool object_at_top);

ojson leaf_value(const std::string& raw, const ojson* schema) {
  const std::string text = decode_entities(raw);
  const SchemaTypes t = types_of(schema);
  if (t.none()) return text;
  const size_t from = text.find_first_not_of(" \n\t\r");
  const std::string trimmed =
      from == std::string::npos ? std::string() : text.substr(from, text.find_last_not_of(" \n\t\r") - from + 1);
  // Strings as written (a string value streams as its text comes, so "null" stays a string).
  if (t.string) return text;
  if (t.null && (trimmed == "null" || trimmed.empty())) return nullptr;
  ojson v = ojson::parse(trimmed, nullptr, false);
  if (!v.is_discarded()) {
    if (t.integer && v.is_number_integer()) return v;
    if (t.number && v.is_number()) return v;
    if (t.boolean && v.is_boolean()) return v;
    if (t.object && v.is_object()) return v;
    if (t.array && v.is_array()) return v;
  }
  if (t.boolean && (trimmed == "True" || trimmed == "False" || trimmed == "TRUE" || trimmed == "FALSE"))
    return trimmed[0] == 'T';
  if (trimmed.empty() && t.object) return ojson::object();
  if (trimmed.empty() && t.array) return ojson::array();
  return text;
}

ojson typed_value(const Node& n, const ojson* schema, bool object_at_top) {
  if (n.children.empty() && !object_at_top) return leaf_value(n.text, schema);
  const SchemaTypes t = types_of(schema);
  const bool items = std::all_of(n.children.begin(), n.children.end(), [](const Node& c) { return c.tag == "item"; });
  if (!object_at_top && items && (t.array || !t.object)) {
    ojson out = ojson::array();
    for (const Node& c : n.children) out.push_back(typed_value(c, item_schema(schema), false));
    return out;
  }
  // Children by tag, in the order the tags first come; a tag repeated is an array (of the
  // property's item type where the property is an array).
  std::vector<std::pair<std::string, std::vector<const Node*>>> groups;
  std::unordered_map<std::string, size_t> group_of;
  for (const Node& c : n.children) {
    auto [g, fresh] = group_of.try_emplace(c.tag, groups.size());
    if (fresh) groups.push_back({c.tag, {}});
    groups[g->second].second.push_back(&c);
  }
  ojson out = ojson::object();
  for (const auto& [tag, nodes] : groups) {
    const ojson* cs = property_schema(schema, tag);
    if (nodes.size() == 1) {
      out[tag] = typed_value(*nodes[0], cs, false);
      continue;
    }
    const ojson* es = types_of(cs).array ? item_schema(cs) : cs;
    ojson arr = ojson::array();
    for (const Node* c : nodes) arr.push_back(typed_value(*c, es, false));
    out[tag] = std::move(arr);
  }
  return out;
}

// The structure of MiniMax-M3 tool calls in a growing text; typing waits for the tools (take_calls
// and calls). Content is released as it becomes certain.
class M3Scanner {
 public:
  // Appends text, scans as far as it allows; returns the content that is now certain.
  std::string push(std::string_view s) {
    text_.append(s);
    while (step()) {
    }
    return take_out();
  }
  // The text is complete.
  std::string finish() {
    while (step()) {
    }
    if (phase_ == kText) {
      // Blanks at the end stay out when there are calls (they sat between the calls and nothing).
      if (!has_calls()) release(text_.size());
      content_from_ = text_.size();
    } else {
      Block& b = blocks_.back();
      const bool calls = b.begun || (b.state != Block::kBroken && std::any_of(b.invokes.begin(), b.invokes.end(),
                                                                              [](const Invoke& i) { return i.closed; }));
      if (calls) {
        content_from_ = text_.size();
      } else {
        b.state = Block::kBroken;
        release(text_.size());
      }
      phase_ = kText;
    }
    finished_ = true;
    return take_out();
  }

  std::vector<Block>& blocks() { return blocks_; }
  bool finished() const { return finished_; }

 private:
  enum Phase { kText, kBlock, kInvoke, kValue, kBroken };
  std::string text_;
  size_t pos_ = 0;           // where scanning goes on
  size_t content_from_ = 0;  // the content not released yet starts here
  std::string out_;
  Phase phase_ = kText;
  std::vector<Block> blocks_;
  std::vector<Node*> stack_;  // kValue: the open elements of the current parameter
  bool finished_ = false;

  std::string take_out() {
    std::string o;
    o.swap(out_);
    return o;
  }
  void release(size_t upto) {
    if (upto > content_from_) out_.append(text_, content_from_, upto - content_from_);
    content_from_ = std::max(content_from_, upto);
  }
  bool has_calls() const {
    return std::any_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.state != Block::kBroken; });
  }
  // Where the blanks that end text_[0, p) begin.
  size_t blanks_before(size_t p) const {
    while (p > content_from_ && is_blank(text_[p - 1])) --p;
    return p;
  }

  // One step of the scan; false when it needs more text.
  bool step() {
    switch (phase_) {
      case kText:
        return scan_text();
      case kBlock:
      case kInvoke:
        return scan_tags();
      case kValue:
        return scan_value();
      case kBroken:
        return scan_broken();
    }
    return false;
  }

  // The next `tag` from pos_; npos with pos_ moved up to a tail that could begin one.
  size_t find_from_pos(const std::string& tag) {
    const size_t at = text_.find(tag, pos_);
    if (at == std::string::npos)
      pos_ = text_.size() -
             held_tail(std::string_view(text_).substr(pos_), std::span<const std::string>(&tag, 1));
    return at;
  }

  bool scan_text() {
    const size_t open = find_from_pos(kM3Open);
    if (open == std::string::npos) {
      release(blanks_before(pos_));
      return false;
    }
    // The blanks before the block are content only if it turns out to be no call.
    release(blanks_before(open));
    blocks_.emplace_back();
    pos_ = open + kM3Open.size();
    phase_ = kBlock;
    return true;
  }

  // A malformed block: it is content (unless a call of it went out already) once its closing
  // tag (or the end) comes.
  bool fail() {
    blocks_.back().state = Block::kBroken;
    stack_.clear();
    phase_ = kBroken;
    return true;
  }

  bool scan_broken() {
    const size_t close = find_from_pos(kM3Close);
    if (close == std::string::npos) return false;
    pos_ = close + kM3Close.size();
    end_block(pos_);
    return true;
  }

  void end_block(size_t end) {
    Block& b = blocks_.back();
    if (b.state != Block::kBroken && b.invokes.empty()) b.state = Block::kBroken;  // no call: text
    if (b.state == Block::kBroken && !b.begun)
      release(end);
    else
      content_from_ = end;
    phase_ = kText;
  }

  // Reads the tag that starts at `at` with the namespace token: 1 done (`tag`, `end` set), 0
  // more text needed, -1 not a tag.
  int read_tag(size_t at, std::string& tag, size_t& end) const {
    const std::string_view rest = std::string_view(text_).substr(at);
    if (rest.size() <= kNs.size()) return kNs.starts_with(rest) ? 0 : -1;
    if (!rest.starts_with(kNs) || rest[kNs.size()] != '<') return -1;
    const size_t from = kNs.size() + 1;
    for (size_t i = from; i < rest.size(); ++i) {
      const char c = rest[i];
      if (c == '>') {
        if (i == from) return -1;
        tag = std::string(rest.substr(from, i - from));
        end = at + i + 1;
        return 1;
      }
      if (c == '<' || c == '\n' || i - from >= kMaxTag) return -1;
    }
    return 0;
  }

  // Between invokes (kBlock) or between an invoke's parameters (kInvoke).
  bool scan_tags() {
    while (pos_ < text_.size() && is_blank(text_[pos_])) ++pos_;
    if (pos_ == text_.size()) return false;
    std::string tag;
    size_t end = 0;
    const int r = read_tag(pos_, tag, end);
    if (r == 0) return false;
    if (r < 0) return fail();
    Block& b = blocks_.back();
    if (phase_ == kBlock) {
      if (tag == "/tool_call") {
        b.state = Block::kClosed;
        pos_ = end;
        end_block(end);
        return true;
      }
      const std::string_view pre = "invoke name=\"";
      if (!tag.starts_with(pre) || tag.size() <= pre.size() + 1 || tag.back() != '"') return fail();
      const std::string name = tag.substr(pre.size(), tag.size() - pre.size() - 1);
      if (name.find('"') != std::string::npos) return fail();
      Invoke inv;
      inv.name = name;
      b.invokes.push_back(std::move(inv));
      phase_ = kInvoke;
      pos_ = end;
      return true;
    }
    Invoke& inv = b.invokes.back();
    if (tag == "/invoke") {
      inv.closed = true;
      phase_ = kBlock;
      pos_ = end;
      return true;
    }
    if (tag[0] == '/') return fail();
    inv.params.push_back(Node{tag, {}, {}});
    inv.param_open = true;
    stack_ = {&inv.params.back()};
    phase_ = kValue;
    pos_ = end;
    return true;
  }

  // Inside a parameter: text, child elements, closing tags.
  bool scan_value() {
    Node& top = *stack_.back();
    const size_t from = pos_;
    const size_t ns = find_from_pos(kNsString);
    const size_t upto = ns != std::string::npos ? ns : pos_;
    const std::string_view piece = std::string_view(text_).substr(from, upto - from);
    if (!top.children.empty()) {
      if (!all_blank(piece)) return fail();  // text beside child elements
    } else {
      top.text.append(piece);
    }
    pos_ = upto;
    if (ns == std::string::npos) return false;
    std::string tag;
    size_t end = 0;
    const int r = read_tag(ns, tag, end);
    if (r == 0) return false;
    if (r < 0) return fail();
    if (tag[0] == '/') {
      if (tag.compare(1, std::string::npos, top.tag) != 0) return fail();
      stack_.pop_back();
      if (stack_.empty()) {
        blocks_.back().invokes.back().param_open = false;
        phase_ = kInvoke;
      }
      pos_ = end;
      return true;
    }
    if (!all_blank(top.text) || stack_.size() >= kMaxDepth) return fail();
    top.text.clear();
    top.children.push_back(Node{tag, {}, {}});
    stack_.push_back(&top.children.back());
    pos_ = end;
    return true;
  }
};

// ------------------------------------------------------------------ MiniMax-M2

// An invoke of an M2 block whose name tag is complete: its complete parameters (name, raw value)
// in order, and whether its </invoke> came.
struct RawInvoke {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;
  bool closed = false;
};

// The value of attribute name="..." followed by '>', at `at` (after "<invoke " etc.).
bool read_name(std::string_view s, size_t& at, std::string& name) {
  const std::string_view key = "name=\"";
  if (s.substr(at, key.size()) != key) return false;
  const size_t end = s.find('"', at + key.size());
  if (end == std::string_view::npos || end + 1 >= s.size() || s[end + 1] != '>') return false;
  name = std::string(s.substr(at + key.size(), end - at - key.size()));
  at = end + 2;
  return true;
}

// The invokes from the first <minimax:tool_call> on; the scan ends at an invoke that is not
// closed, or a tag it cannot read.
std::vector<RawInvoke> m2_invokes(std::string_view text) {
  std::vector<RawInvoke> out;
  const size_t open = text.find(kM2Open);
  if (open == std::string_view::npos) return out;
  const std::string_view body = text.substr(open + kM2Open.size());
  size_t at = 0;
  while (true) {
    const size_t inv = body.find("<invoke ", at);
    const size_t close_block = body.find(kM2Close, at);
    if (inv == std::string_view::npos || inv > close_block) break;
    size_t p = inv + std::string_view("<invoke ").size();
    RawInvoke call;
    if (!read_name(body, p, call.name)) break;
    const size_t end = body.find("</invoke>", p);
    call.closed = end != std::string_view::npos;
    const std::string_view inner = body.substr(p, call.closed ? end - p : std::string_view::npos);
    for (size_t q = 0;;) {
      const size_t lt = inner.find("<parameter ", q);
      if (lt == std::string_view::npos) break;
      size_t r = lt + std::string_view("<parameter ").size();
      std::string key;
      if (!read_name(inner, r, key)) break;
      const size_t close = inner.find("</parameter>", r);
      if (close == std::string_view::npos) break;
      call.params.emplace_back(std::move(key), std::string(inner.substr(r, close - r)));
      q = close + std::string_view("</parameter>").size();
    }
    out.push_back(std::move(call));
    if (!out.back().closed) break;
    at = end + std::string_view("</invoke>").size();
  }
  return out;
}

// An M2 parameter: JSON when the schema gives a type other than string and the value parses, or,
// without a schema, when it parses as something other than a string; else the text (one leading
// and one trailing newline dropped).
ojson m2_value(std::string value, const ojson* schema) {
  if (!value.empty() && value.front() == '\n') value.erase(0, 1);
  if (!value.empty() && value.back() == '\n') value.pop_back();
  const SchemaTypes t = types_of(schema);
  ojson v = ojson::parse(value, nullptr, false);
  const bool json = t.none() ? !v.is_discarded() && !v.is_string() : !t.string && !v.is_discarded();
  return json ? v : ojson(value);
}

}  // namespace

// ------------------------------------------------------------------ the stream

struct ToolCallStream::Impl {
  bool m2 = false;
  // minimax_m3
  M3Scanner scan;
  int calls_sent = 0;
  // minimax_m2
  std::string text;
  size_t sent = 0;
  struct Sent {
    bool named = false, closed = false;
    size_t params = 0;
  };
  std::vector<Sent> m2_sent;

  size_t m2_content_prefix() const {
    const size_t p = text.find(kM2Open);
    if (p != std::string::npos) return p;
    const std::string open(kM2Open);
    return text.size() - held_tail(text, std::span<const std::string>(&open, 1));
  }

  // The new pieces of one M3 invoke.
  void m3_pieces(Invoke& inv, const ojson* fn, bool at_end, std::vector<ToolCallDelta>& out) {
    ToolCallDelta d;
    if (inv.index < 0) {
      inv.index = calls_sent++;
      d.first = true;
      d.name = inv.name;
    }
    d.index = inv.index;
    const ojson* params = parameters_of(fn);
    std::string& a = d.arguments;
    for (; inv.params_sent < inv.params.size(); ++inv.params_sent) {
      const Node& p = inv.params[inv.params_sent];
      const bool open = inv.param_open && inv.params_sent + 1 == inv.params.size();
      const ojson* schema = property_schema(params, p.tag);
      if (!inv.key_sent) {
        a += (inv.params_sent == 0 ? "{" : ",") + ojson(p.tag).dump() + ":";
        inv.key_sent = true;
      }
      // A string value goes out as its text comes, once it is surely text (not child elements).
      const bool stringy = types_of(schema).string || types_of(schema).none();
      if (stringy && p.children.empty() && (inv.string_open || !open || !all_blank(p.text))) {
        if (!inv.string_open) a += "\"";
        inv.string_open = true;
        size_t upto = p.text.size();
        if (open) upto -= entity_tail(std::string_view(p.text).substr(inv.text_sent));
        a += json_body(decode_entities(std::string_view(p.text).substr(inv.text_sent, upto - inv.text_sent)));
        inv.text_sent = upto;
      }
      if (open) break;
      if (inv.string_open)
        a += "\"";
      else
        a += typed_value(p, schema, false).dump();
      inv.key_sent = inv.string_open = false;
      inv.text_sent = 0;
    }
    if (!inv.closed_sent && (inv.closed || at_end)) {
      if (inv.string_open) a += "\"";
      else if (inv.key_sent) a += "null";
      a += inv.params.empty() ? "{}" : "}";
      inv.closed_sent = true;
    }
    if (d.first || !a.empty()) out.push_back(std::move(d));
  }
};

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

std::vector<int32_t> parser_marker_ids(const text::Tokenizer& tok, const std::string& reasoning_parser,
                                       const std::string& tool_parser) {
  std::vector<std::string> markers;
  if (!reasoning_parser.empty()) {
    const ReasoningFormat& f = reasoning_format(reasoning_parser);
    markers = {f.open, f.close};
  }
  if (tool_parser == "minimax_m2") {
    markers.insert(markers.end(), {std::string(kM2Open), std::string(kM2Close)});
  } else if (!tool_parser.empty()) {
    markers.insert(markers.end(), {kNsString, "<tool_call>", "</tool_call>"});
  }
  std::vector<int32_t> ids;
  for (const auto& [id, content] : tok.added_tokens())
    if (tok.is_special(id) && std::find(markers.begin(), markers.end(), content) != markers.end()) ids.push_back(id);
  return ids;
}

ToolCallStream::ToolCallStream(const std::string& parser) : impl_(std::make_unique<Impl>()) {
  impl_->m2 = parser == "minimax_m2";
}
ToolCallStream::~ToolCallStream() = default;
ToolCallStream::ToolCallStream(ToolCallStream&&) noexcept = default;
ToolCallStream& ToolCallStream::operator=(ToolCallStream&&) noexcept = default;

std::string ToolCallStream::push(std::string_view content) {
  Impl& m = *impl_;
  if (!m.m2) return m.scan.push(content);
  m.text.append(content);
  const size_t upto = m.m2_content_prefix();
  if (upto <= m.sent) return {};
  std::string out = m.text.substr(m.sent, upto - m.sent);
  m.sent = upto;
  return out;
}

bool ToolCallStream::calls_begun() const {
  return impl_->m2 ? !impl_->m2_sent.empty() : impl_->calls_sent > 0;
}

std::string ToolCallStream::finish_content(bool calls) {
  Impl& m = *impl_;
  if (!m.m2) return m.scan.finished() ? std::string() : m.scan.finish();
  const size_t end = calls ? m.text.find(kM2Open) : m.text.size();
  std::string out = end > m.sent ? m.text.substr(m.sent, end - m.sent) : std::string();
  m.sent = std::max(m.sent, end);
  return out;
}

std::vector<ToolCallDelta> ToolCallStream::take_calls(const ojson& tools, bool at_end) {
  Impl& m = *impl_;
  std::vector<ToolCallDelta> out;
  if (!m.m2) {
    for (Block& b : m.scan.blocks()) {
      // A malformed block is content, unless its calls had begun: those are closed as they stand.
      if (b.state == Block::kBroken && !b.begun) continue;
      for (Invoke& inv : b.invokes) {
        if (inv.closed_sent) continue;
        if (b.state == Block::kBroken && inv.index < 0) break;
        m.m3_pieces(inv, find_function(tools, inv.name), at_end || b.state == Block::kBroken, out);
        b.begun = true;
        if (!inv.closed_sent) break;
      }
      if (b.state == Block::kOpen && !at_end) break;
    }
    return out;
  }
  const std::vector<RawInvoke> invokes = m2_invokes(m.text);
  if (m.m2_sent.size() < invokes.size()) m.m2_sent.resize(invokes.size());
  for (size_t i = 0; i < invokes.size(); ++i) {
    const RawInvoke& inv = invokes[i];
    Impl::Sent& st = m.m2_sent[i];
    const ojson* params = parameters_of(find_function(tools, inv.name));
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
      d.arguments += ojson(key).dump() + ":" + m2_value(raw, property_schema(params, key)).dump();
    }
    if (!st.closed && (inv.closed || at_end)) {
      d.arguments += st.params == 0 ? "{}" : "}";
      st.closed = true;
    }
    if (d.first || !d.arguments.empty()) out.push_back(std::move(d));
  }
  return out;
}

ToolCallParse ToolCallStream::finish(const ojson& tools) {
  Impl& m = *impl_;
  ToolCallParse tp;
  if (m.m2) {
    for (const RawInvoke& inv : m2_invokes(m.text)) {
      if (!inv.closed) break;  // cut short: not a call
      ParsedToolCall call;
      call.name = inv.name;
      const ojson* params = parameters_of(find_function(tools, inv.name));
      for (const auto& [key, raw] : inv.params) call.arguments[key] = m2_value(raw, property_schema(params, key));
      tp.calls.push_back(std::move(call));
    }
    tp.content = finish_content(!tp.calls.empty());
    return tp;
  }
  tp.content = finish_content(true);
  for (const Block& b : m.scan.blocks()) {
    if (b.state == Block::kBroken) continue;
    for (const Invoke& inv : b.invokes) {
      if (!inv.closed) break;
      const ojson* fn = find_function(tools, inv.name);
      Node all{"", "", inv.params};
      tp.calls.push_back({inv.name, typed_value(all, parameters_of(fn), true)});
    }
  }
  return tp;
}

ToolCallParse parse_tool_calls(std::string_view text, const ojson& tools, const std::string& parser) {
  ToolCallStream s(parser);
  std::string content = s.push(text);
  ToolCallParse tp = s.finish(tools);
  tp.content = content + tp.content;
  return tp;
}

}  // namespace sieve::server
