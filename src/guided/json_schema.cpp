// JSON-schema guided decoding (guided.h): the schema is compiled into a tree of nodes, and a
// request's state is a stack of frames over it, stepped byte by byte. Compact JSON only (no
// whitespace outside strings), so the automaton stays deterministic: every alternative of an
// anyOf starts with a different character, and object keys are matched against the properties
// that may come next.
#include <algorithm>
#include <bit>
#include <bitset>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "guided/guided.h"

namespace sieve::guided {

namespace {

using json = nlohmann::ordered_json;  // properties keep their declared order

enum class Kind : uint8_t { Object, Array, String, Integer, Number, Enum, AnyOf };  // boolean, null: Enum

struct Node {
  Kind kind = Kind::Object;
  // Object: properties in order (the key as it appears between the quotes), required flags.
  std::vector<std::string> keys;
  std::vector<const Node*> values;
  std::vector<bool> required;
  // Array.
  const Node* items = nullptr;
  int64_t min_items = 0, max_items = std::numeric_limits<int64_t>::max();
  // Enum: the JSON texts of the allowed values (at most 64).
  std::vector<std::string> texts;
  // AnyOf.
  std::vector<const Node*> alts;
  std::bitset<256> first;  // the bytes a value of this node can start with
};

constexpr size_t kMaxFrames = 24;
constexpr size_t kMaxEnum = 64;

// What the byte automaton cannot follow but the grammar matcher can (json_schema_constraint
// then writes the schema as a grammar): alternatives that start alike, nesting past the
// automaton's frames (a recursive $ref), string length bounds.
struct BeyondAutomaton : Error {
  using Error::Error;
};

// The definition a "$ref" names in the schema `root`.
const json& resolve_ref(const json& root, const json& ref) {
  if (!ref.is_string()) throw Error("json schema: $ref must be a string");
  const std::string r = ref.get<std::string>();
  for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
    const std::string p = prefix;
    if (r.rfind(p, 0) != 0) continue;
    auto defs = root.find(p.substr(2, p.size() - 3));
    if (defs == root.end() || !defs->is_object() || !defs->contains(r.substr(p.size())))
      throw Error("json schema: $ref " + r + " is not defined");
    return (*defs)[r.substr(p.size())];
  }
  throw Error("json schema: only $ref to #/$defs/... or #/definitions/... is supported, got " + r);
}

// Throws Error naming the first keyword of the schema object `s` that is not supported.
void check_keywords(const json& s) {
  if (!s.is_object()) throw Error("json schema: a schema must be an object, got " + s.dump());
  static const std::set<std::string> known = {
      "type", "properties", "required", "items", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "$ref",
      "title", "description", "default", "examples", "format", "$defs", "definitions", "$schema", "$id",
      "additionalProperties", "strict", "name", "minLength", "maxLength"};
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!known.count(it.key())) throw Error("json schema: \"" + it.key() + "\" is not supported");
}

// An object schema's properties in their declared order, each with whether it is required.
// Throws Error for a required name that is not a property, and for more than 64 properties.
struct Property {
  std::string key;
  const json* schema;
  bool required;
};
std::vector<Property> object_properties(const json& s) {
  std::set<std::string> req;
  if (auto r = s.find("required"); r != s.end()) {
    if (!r->is_array()) throw Error("json schema: \"required\" must be an array");
    for (const json& x : *r) req.insert(x.get<std::string>());
  }
  std::vector<Property> props;
  if (auto p = s.find("properties"); p != s.end()) {
    if (!p->is_object()) throw Error("json schema: \"properties\" must be an object");
    for (auto it = p->begin(); it != p->end(); ++it) {
      props.push_back({it.key(), &*it, req.count(it.key()) > 0});
      req.erase(it.key());
    }
  }
  if (!req.empty()) throw Error("json schema: required property \"" + *req.begin() + "\" is not in properties");
  if (props.size() > 64) throw Error("json schema: more than 64 properties in one object");
  return props;
}

// An array schema's minItems and maxItems (no maxItems: the largest int64). Throws Error when
// they are negative or out of order.
std::pair<int64_t, int64_t> array_bounds(const json& s) {
  int64_t lo = 0, hi = std::numeric_limits<int64_t>::max();
  if (auto m = s.find("minItems"); m != s.end()) lo = m->get<int64_t>();
  if (auto m = s.find("maxItems"); m != s.end()) hi = m->get<int64_t>();
  if (lo < 0 || hi < lo) throw Error("json schema: bad minItems / maxItems");
  return {lo, hi};
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}
  const Node* compile(const json& s, int depth = 0) {
    if (depth > 32) throw BeyondAutomaton("json schema: nested deeper than 32 levels (or a recursive $ref)");
    check_keywords(s);
    if (auto r = s.find("$ref"); r != s.end()) return compile(resolve(*r), depth + 1);
    if (auto e = s.find("enum"); e != s.end()) return enum_node(*e, "enum");
    if (auto c = s.find("const"); c != s.end()) return enum_node(json::array({*c}), "const");
    for (const char* key : {"anyOf", "oneOf"})
      if (auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty()) throw Error(std::string("json schema: ") + key + " must be a non-empty array");
        std::vector<const Node*> alts;
        for (const json& x : *a) alts.push_back(compile(x, depth + 1));
        return any_of(std::move(alts));
      }
    auto t = s.find("type");
    if (t == s.end()) throw Error("json schema: a schema without \"type\" (any value) is not supported: " + s.dump());
    if (t->is_array()) {
      std::vector<const Node*> alts;
      for (const json& x : *t) {
        json one = s;
        one["type"] = x;
        alts.push_back(compile(one, depth + 1));
      }
      return any_of(std::move(alts));
    }
    if (!t->is_string()) throw Error("json schema: \"type\" must be a string or an array of strings");
    const std::string type = t->get<std::string>();
    Node* n = make();
    if (type == "object") {
      n->kind = Kind::Object;
      n->first.set('{');
      for (const Property& p : object_properties(s)) {
        const std::string quoted = json(p.key).dump();
        n->keys.push_back(quoted.substr(1, quoted.size() - 2));
        n->values.push_back(compile(*p.schema, depth + 1));
        n->required.push_back(p.required);
      }
    } else if (type == "array") {
      n->kind = Kind::Array;
      n->first.set('[');
      auto it = s.find("items");
      if (it == s.end()) throw Error("json schema: an array needs \"items\"");
      n->items = compile(*it, depth + 1);
      std::tie(n->min_items, n->max_items) = array_bounds(s);
    } else if (type == "string") {
      if (s.contains("minLength") || s.contains("maxLength"))
        throw BeyondAutomaton("json schema: string length bounds");
      n->kind = Kind::String;
      n->first.set('"');
    } else if (type == "integer" || type == "number") {
      n->kind = type == "integer" ? Kind::Integer : Kind::Number;
      n->first.set('-');
      for (char c = '0'; c <= '9'; ++c) n->first.set(uint8_t(c));
    } else if (type == "boolean") {
      return enum_node(json::array({true, false}), "boolean");
    } else if (type == "null") {
      return enum_node(json::array({nullptr}), "null");
    } else {
      throw Error("json schema: type \"" + type + "\" is not supported");
    }
    return n;
  }

 private:
  Node* make() {
    nodes_.push_back(std::make_unique<Node>());
    return nodes_.back().get();
  }
  const json& resolve(const json& ref) { return resolve_ref(root_, ref); }
  const Node* enum_node(const json& values, const std::string& what) {
    if (!values.is_array() || values.empty() || values.size() > kMaxEnum)
      throw Error("json schema: " + what + " must be a non-empty array of at most 64 values");
    Node* n = make();
    n->kind = Kind::Enum;
    for (const json& v : values) {
      n->texts.push_back(v.dump());
      n->first.set(uint8_t(n->texts.back()[0]));
    }
    return n;
  }
  const Node* any_of(std::vector<const Node*> alts) {
    Node* n = make();
    n->kind = Kind::AnyOf;
    for (const Node* a : alts) {
      if ((n->first & a->first).any())
        throw BeyondAutomaton("json schema: anyOf / oneOf / a list of types whose alternatives can start with the same "
                    "character is not supported");
      n->first |= a->first;
    }
    n->alts = std::move(alts);
    return n;
  }

  const json& root_;

 public:
  std::vector<std::unique_ptr<Node>> nodes_;
};

// One value being read. Object phases: 0 '{', 1 key or '}' (after '{') / key (after ','), 2 in a
// key, 3 ':', 4 the value, 5 ',' or '}'. Array: 0 '[', 1 item or ']', 2 ',' or ']', 3 item.
// String: 0 '"', 1 its body (str). Number: num. Enum: candidates.
struct Frame {
  const Node* node = nullptr;
  uint8_t phase = 0;
  JsonStringLex str;
  JsonNumberLex num;
  uint16_t pos = 0;      // enum / key: bytes matched
  uint16_t next = 0;     // object: the first property that may still come
  uint16_t chosen = 0;   // object: the property whose value is being read
  int64_t count = 0;     // array: items so far
  uint64_t cand = 0;     // enum / key: candidates still possible
};

enum class Step { Consumed, Reject, Done, DonePass };

class SchemaState {
 public:
  explicit SchemaState(const Node* root) {
    frames_[0].node = root;
    depth_ = 1;
  }
  bool complete() const { return depth_ == 0; }
  // A free string's text (not in an escape or a multi-byte character): plain tokens pass.
  bool in_string() const {
    if (depth_ == 0) return false;
    const Frame& f = frames_[depth_ - 1];
    return f.node->kind == Kind::String && f.phase == 1 && f.str.between_chars();
  }
  bool push(uint8_t c) {
    while (true) {
      if (depth_ == 0) return false;
      Frame& f = frames_[depth_ - 1];
      const Step r = step(f, c);
      if (r == Step::Consumed) return true;
      if (r == Step::Reject) return false;
      --depth_;
      if (depth_ > 0) child_done(frames_[depth_ - 1]);
      if (r == Step::Done) return true;
      // DonePass: the byte belongs to the parent.
    }
  }
  bool push(std::string_view s) {
    for (char c : s)
      if (!push(uint8_t(c))) return false;
    return true;
  }

 private:
  bool open_child(const Node* n, uint8_t c) {
    if (!n->first.test(c) || depth_ >= kMaxFrames) return false;
    if (n->kind == Kind::AnyOf)
      for (const Node* a : n->alts)
        if (a->first.test(c)) return open_child(a, c);
    Frame& f = frames_[depth_++];
    f = Frame{};
    f.node = n;
    return push(c);
  }
  static void child_done(Frame& parent) {
    if (parent.node->kind == Kind::Object) {
      parent.phase = 5;
    } else {
      parent.phase = 2;
      ++parent.count;
    }
  }
  static bool required_from(const Frame& f, size_t from) {
    for (size_t i = from; i < f.node->keys.size(); ++i)
      if (f.node->required[i]) return true;
    return false;
  }
  // Keys that may come next: from `next` up to and including the first required one.
  static uint64_t key_candidates(const Frame& f) {
    uint64_t m = 0;
    for (size_t i = f.next; i < f.node->keys.size(); ++i) {
      m |= uint64_t(1) << i;
      if (f.node->required[i]) break;
    }
    return m;
  }
  // Matches c against candidate texts at f.pos; the texts of an enum or the keys of an object.
  static bool match(Frame& f, const std::vector<std::string>& texts, uint8_t c) {
    uint64_t keep = 0;
    for (size_t i = 0; i < texts.size(); ++i)
      if (((f.cand >> i) & 1) && f.pos < texts[i].size() && uint8_t(texts[i][f.pos]) == c) keep |= uint64_t(1) << i;
    if (!keep) return false;
    f.cand = keep;
    ++f.pos;
    return true;
  }
  // The candidate that is exactly f.pos long, or -1.
  static int complete_candidate(const Frame& f, const std::vector<std::string>& texts) {
    for (size_t i = 0; i < texts.size(); ++i)
      if (((f.cand >> i) & 1) && texts[i].size() == f.pos) return int(i);
    return -1;
  }

  Step step(Frame& f, uint8_t c) {
    const Node& n = *f.node;
    switch (n.kind) {
      case Kind::Object:
        switch (f.phase) {
          case 0:
            if (c != '{') return Step::Reject;
            f.phase = 1;
            return Step::Consumed;
          case 1:
            // Right after '{' (no property read yet, so next is 0), '}' closes an object without
            // required properties.
            if (c == '}' && f.next == 0 && !required_from(f, 0)) return Step::Done;
            if (c != '"') return Step::Reject;
            f.cand = key_candidates(f);
            if (!f.cand) return Step::Reject;
            f.pos = 0;
            f.phase = 2;
            return Step::Consumed;
          case 2:
            if (c == '"') {
              const int k = complete_candidate(f, n.keys);
              if (k < 0) return Step::Reject;
              f.chosen = uint16_t(k);
              f.phase = 3;
              return Step::Consumed;
            }
            return match(f, n.keys, c) ? Step::Consumed : Step::Reject;
          case 3:
            if (c != ':') return Step::Reject;
            f.phase = 4;
            return Step::Consumed;
          case 4:
            return open_child(n.values[f.chosen], c) ? Step::Consumed : Step::Reject;
          case 5:
            f.next = uint16_t(f.chosen + 1);
            if (c == '}' && !required_from(f, f.next)) return Step::Done;
            if (c == ',' && f.next < n.keys.size()) {
              f.phase = 1;
              return Step::Consumed;
            }
            return Step::Reject;
        }
        return Step::Reject;
      case Kind::Array:
        switch (f.phase) {
          case 0:
            if (c != '[') return Step::Reject;
            f.phase = 1;
            return Step::Consumed;
          case 1:
            if (c == ']' && n.min_items == 0) return Step::Done;
            [[fallthrough]];
          case 3:
            if (f.count >= n.max_items) return Step::Reject;
            return open_child(n.items, c) ? Step::Consumed : Step::Reject;
          case 2:
            if (c == ']' && f.count >= n.min_items) return Step::Done;
            if (c == ',' && f.count < n.max_items) {
              f.phase = 3;
              return Step::Consumed;
            }
            return Step::Reject;
        }
        return Step::Reject;
      case Kind::String:
        if (f.phase == 0) {
          if (c != '"') return Step::Reject;
          f.phase = 1;
          return Step::Consumed;
        }
        switch (f.str.push(c)) {
          case JsonStringLex::kMore:
            return Step::Consumed;
          case JsonStringLex::kClosed:
            return Step::Done;
          case JsonStringLex::kBad:
            return Step::Reject;
        }
        return Step::Reject;
      case Kind::Integer:
      case Kind::Number:
        switch (f.num.push(c, n.kind == Kind::Integer)) {
          case JsonNumberLex::kMore:
            return Step::Consumed;
          case JsonNumberLex::kEnd:
            return Step::DonePass;
          case JsonNumberLex::kBad:
            return Step::Reject;
        }
        return Step::Reject;
      case Kind::Enum: {
        if (f.pos == 0) f.cand = (n.texts.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.texts.size()) - 1);
        if (match(f, n.texts, c)) {
          // Done at once when the only candidate left is complete (strings, literals, objects).
          if (std::popcount(f.cand) == 1 && complete_candidate(f, n.texts) >= 0) return Step::Done;
          return Step::Consumed;
        }
        return complete_candidate(f, n.texts) >= 0 && f.pos > 0 ? Step::DonePass : Step::Reject;
      }
      case Kind::AnyOf:
        return Step::Reject;  // never a frame: open_child picks the alternative
    }
    return Step::Reject;
  }

  Frame frames_[kMaxFrames];
  size_t depth_ = 0;
};

class SchemaConstraint final : public OutputConstraint, public std::enable_shared_from_this<SchemaConstraint> {
 public:
  SchemaConstraint(std::shared_ptr<const TokenBytes> v, std::vector<std::unique_ptr<Node>> nodes, const Node* root)
      : vocab_(std::move(v)), nodes_(std::move(nodes)), root_(root), plain_(plain_string_tokens(*vocab_)) {}
  class S final : public State {
   public:
    explicit S(std::shared_ptr<const SchemaConstraint> c) : c_(std::move(c)), state_(c_->root_) {}
    void mask(std::span<float> logits, std::span<const int32_t> eos_ids) const override {
      // The bytes that may come first (one probe each), then only tokens that start with one.
      std::bitset<256> first;
      for (int b = 0; b < 256; ++b) {
        SchemaState p = state_;
        first[size_t(b)] = p.push(uint8_t(b));
      }
      const bool in_string = state_.in_string();
      mask_tokens(logits, *c_->vocab_, &first, state_.complete(), eos_ids, [&](std::string_view bytes, size_t t) {
        if (in_string && c_->plain_[t]) return true;
        SchemaState p = state_;
        return p.push(bytes);
      });
    }
    void accept(int32_t token) override {
      const TokenBytes& vocab = *c_->vocab_;
      if (token >= 0 && size_t(token) < vocab.size()) state_.push(vocab[size_t(token)]);
    }
    bool complete() const override { return state_.complete(); }
    bool must_end() const override { return state_.complete(); }

   private:
    std::shared_ptr<const SchemaConstraint> c_;
    SchemaState state_;
  };
  // A state holds its constraint (the nodes it points into).
  std::unique_ptr<State> start() const override { return std::make_unique<S>(shared_from_this()); }

 private:
  std::shared_ptr<const TokenBytes> vocab_;
  std::vector<std::unique_ptr<Node>> nodes_;
  const Node* root_;
  std::vector<uint8_t> plain_;
};

// The same subset as Compiler, written as a grammar (grammar.cpp) for what the automaton
// cannot follow: alternatives that start with the same character (a union of objects) and
// recursive $refs (one rule per definition).
class GrammarWriter {
 public:
  explicit GrammarWriter(const json& root) : root_(root) {}
  std::string write() {
    if (!container(root_, 0)) throw Error("json schema: the top level must be an object or an array");
    const std::string top = value(root_, 0);
    return "root ::= " + top + "\n" + rules_ +
           "jstr ::= \"\\\"\" jchar* \"\\\"\"\n"
           "jchar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
           "jint ::= \"-\"? (\"0\" | [1-9] [0-9]*)\n"
           "jnum ::= jint (\".\" [0-9]+)? ([eE] [+-]? [0-9]+)?\n";
  }

 private:
  const json& resolve(const json& ref) const { return resolve_ref(root_, ref); }
  // Whether every value of s is an object or an array.
  bool container(const json& s, int depth) const {
    if (depth > 64 || !s.is_object()) return false;
    if (auto r = s.find("$ref"); r != s.end()) return container(resolve(*r), depth + 1);
    if (s.contains("enum") || s.contains("const")) return false;
    for (const char* key : {"anyOf", "oneOf"})
      if (auto a = s.find(key); a != s.end() && a->is_array()) {
        for (const json& x : *a)
          if (!container(x, depth + 1)) return false;
        return !a->empty();
      }
    auto t = s.find("type");
    if (t == s.end()) return false;
    if (t->is_string()) return *t == "object" || *t == "array";
    if (!t->is_array() || t->empty()) return false;
    for (const json& x : *t)
      if (x != "object" && x != "array") return false;
    return true;
  }
  std::string fresh(const std::string& stem) { return stem + std::to_string(++n_); }
  void rule(const std::string& name, const std::string& body) { rules_ += name + " ::= " + body + "\n"; }

  std::string value(const json& s, int depth) {
    if (depth > 256) throw Error("json schema: nested deeper than 256 levels");
    check_keywords(s);
    if (auto r = s.find("$ref"); r != s.end()) {
      const std::string key = r->is_string() ? r->get<std::string>() : r->dump();
      if (auto it = refs_.find(key); it != refs_.end()) return it->second;
      // A chain of $refs that comes back to itself before any value has no value at all.
      std::set<std::string> chain{key};
      for (const json* at = &resolve(*r); at->is_object() && at->contains("$ref");) {
        const json& next = (*at)["$ref"];
        if (!chain.insert(next.is_string() ? next.get<std::string>() : next.dump()).second)
          throw Error("json schema: $ref " + key + " only refers to itself, with no value");
        at = &resolve(next);
      }
      const std::string name = fresh("def");
      refs_[key] = name;  // before the body: a recursive reference names the rule
      rule(name, value(resolve(*r), depth + 1));
      return name;
    }
    if (auto e = s.find("enum"); e != s.end()) return literals(*e, "enum");
    if (auto c = s.find("const"); c != s.end()) return literals(json::array({*c}), "const");
    for (const char* key : {"anyOf", "oneOf"})
      if (auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty()) throw Error(std::string("json schema: ") + key + " must be a non-empty array");
        std::string alts;
        for (const json& x : *a) alts += (alts.empty() ? "" : " | ") + value(x, depth + 1);
        return "(" + alts + ")";
      }
    auto t = s.find("type");
    if (t == s.end()) throw Error("json schema: a schema without \"type\" (any value) is not supported: " + s.dump());
    if (t->is_array()) {
      std::string alts;
      for (const json& x : *t) {
        json one = s;
        one["type"] = x;
        alts += (alts.empty() ? "" : " | ") + value(one, depth + 1);
      }
      return "(" + alts + ")";
    }
    if (!t->is_string()) throw Error("json schema: \"type\" must be a string or an array of strings");
    const std::string type = t->get<std::string>();
    if (type == "string") {
      if (!s.contains("minLength") && !s.contains("maxLength")) return "jstr";
      auto bound = [&](const char* key, int64_t dflt) {
        auto it = s.find(key);
        if (it == s.end()) return dflt;
        if (!it->is_number_integer() || it->get<int64_t>() < 0) throw Error(std::string("json schema: ") + key + " must be a non-negative integer");
        return it->get<int64_t>();
      };
      const int64_t lo = bound("minLength", 0), hi = bound("maxLength", -1);
      if (hi >= 0 && hi < lo) throw Error("json schema: maxLength below minLength");
      if (lo > 256 || hi > 256) throw Error("json schema: minLength / maxLength above 256 are not supported");
      const std::string count = hi < 0 ? "{" + std::to_string(lo) + ",}" : "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
      return "\"\\\"\" jchar" + count + " \"\\\"\"";
    }
    if (type == "integer") return "jint";
    if (type == "number") return "jnum";
    if (type == "boolean") return "(\"true\" | \"false\")";
    if (type == "null") return "\"null\"";
    if (type == "object") return object(s, depth);
    if (type == "array") {
      auto it = s.find("items");
      if (it == s.end()) throw Error("json schema: an array needs \"items\"");
      const std::string item = value(*it, depth + 1);
      const auto [lo, max] = array_bounds(s);
      const bool bounded = max != std::numeric_limits<int64_t>::max();
      if (lo > 257 || (bounded && max > 257))
        throw Error("json schema: minItems / maxItems above 257 are not supported with this schema");
      if (max == 0) return "\"[]\"";
      const std::string more = "(\",\" " + item + ")";
      const std::string rest = !bounded ? (lo > 1 ? more + "{" + std::to_string(lo - 1) + ",}" : more + "*")
                                        : more + "{" + std::to_string(lo > 0 ? lo - 1 : 0) + "," + std::to_string(max - 1) + "}";
      const std::string body = item + " " + rest;
      return "\"[\" " + (lo == 0 ? "(" + body + ")?" : body) + " \"]\"";
    }
    throw Error("json schema: type \"" + type + "\" is not supported");
  }
  std::string literals(const json& values, const std::string& what) {
    if (!values.is_array() || values.empty() || values.size() > kMaxEnum)
      throw Error("json schema: " + what + " must be a non-empty array of at most 64 values");
    std::string alts;
    for (const json& v : values) alts += (alts.empty() ? "" : " | ") + ebnf_literal(v.dump());
    return "(" + alts + ")";
  }
  // Properties in declared order, the required ones present: rule i (first or not) reads the
  // properties from i on, with a comma before each but the object's first.
  std::string object(const json& s, int depth) {
    std::vector<std::pair<std::string, std::string>> props;  // "key": literal, value expression
    std::vector<bool> required;
    for (const Property& p : object_properties(s)) {
      props.push_back({ebnf_literal(json(p.key).dump() + ":"), value(*p.schema, depth + 1)});
      required.push_back(p.required);
    }
    const std::string stem = fresh("obj");
    auto name = [&](size_t i, bool first) { return stem + "_" + std::to_string(i) + (first ? "f" : "n"); };
    for (size_t i = props.size() + 1; i-- > 0;) {
      for (bool first : {true, false}) {
        if (i == props.size()) {
          rule(name(i, first), "\"\"");
          continue;
        }
        const std::string item = std::string(first ? "" : "\",\" ") + props[i].first + " " + props[i].second + " " + name(i + 1, false);
        rule(name(i, first), required[i] ? item : item + " | " + name(i + 1, first));
      }
    }
    return "\"{\" " + name(0, true) + " \"}\"";
  }

  const json& root_;
  std::map<std::string, std::string> refs_;
  std::string rules_;
  int n_ = 0;
};

}  // namespace

std::string json_schema_grammar(const std::string& schema_json) {
  json schema;
  try {
    schema = json::parse(schema_json);
  } catch (const json::exception& e) {
    throw Error(std::string("json schema: not valid JSON: ") + e.what());
  }
  return GrammarWriter(schema).write();
}

std::shared_ptr<const OutputConstraint> json_schema_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                               const std::string& schema_json) {
  json schema;
  try {
    schema = json::parse(schema_json);
  } catch (const json::exception& e) {
    throw Error(std::string("json schema: not valid JSON: ") + e.what());
  }
  Compiler comp(schema);
  const Node* root = nullptr;
  try {
    root = comp.compile(schema);
  } catch (const BeyondAutomaton&) {
    return grammar_constraint(std::move(vocab), GrammarWriter(schema).write());
  }
  if (root->kind != Kind::Object && root->kind != Kind::Array)
    throw Error("json schema: the top level must be an object or an array");
  return std::make_shared<SchemaConstraint>(std::move(vocab), std::move(comp.nodes_), root);
}

}  // namespace sieve::guided
