// Guided decoding by a context-free grammar (guided.h, grammar_constraint): the EBNF of vLLM's
// `guided_grammar` / llama.cpp's GBNF.
//
// The grammar is lowered to rules of alternatives, each a sequence of elements: a code-point
// class (literals become one class per code point) or a reference to a rule; groups, `?`, `*`,
// `+` and `{m,n}` become helper rules. Matching keeps every parse that is still possible as a
// stack of positions (rule, alternative, element), expanded until its top is a class (or the
// stack is empty: the root is complete). A code point advances the stacks whose top class holds
// it. The output's bytes are decoded as UTF-8 first; a token that ends inside a code point is
// allowed when some open parse accepts a code point that the bytes so far can still become.
// Left recursion is refused when the grammar is compiled (the expansion would not end); a loop that
// consumes nothing and does not grow the stack (x* with a nullable x) ends where it meets a stack
// it has expanded before.
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "guided/guided.h"

namespace sieve::guided {

namespace {

constexpr size_t kMaxStacks = 4096;  // open parses kept (an ambiguous grammar is cut here)
constexpr size_t kMaxDepth = 1024;   // positions on one stack (nesting)
constexpr int kMaxRepeat = 256;      // m, n of {m,n}
constexpr size_t kMaxElements = 1 << 16;

// The payload bits of a UTF-8 lead byte (its length marker removed).
uint32_t utf8_lead_bits(uint8_t b) { return b & (b >= 0xF0 ? 0x07 : b >= 0xE0 ? 0x0F : 0x1F); }

struct CpClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive, sorted (add_class)
  bool negated = false;
  bool test(uint32_t cp) const {
    bool in = false;
    for (const auto& [a, b] : ranges) in = in || (cp >= a && cp <= b);
    return in != negated;
  }
  // Some code point in [lo, hi] is in the class.
  bool meets(uint32_t lo, uint32_t hi) const {
    if (!negated) {
      for (const auto& [a, b] : ranges)
        if (a <= hi && b >= lo) return true;
      return false;
    }
    // The complement meets [lo, hi] unless the ranges cover all of it.
    uint32_t at = lo;
    for (const auto& [a, b] : ranges) {
      if (a > at) return true;
      if (b >= at) {
        if (b >= hi) return false;
        at = b + 1;
      }
    }
    return at <= hi;
  }
};

struct Elem {
  bool rule = false;
  int id = 0;  // rule index, or class index
};
using Alt = std::vector<Elem>;

struct Grammar {
  std::vector<std::vector<Alt>> rules;
  std::vector<std::string> names;  // "" for helper rules
  std::vector<CpClass> classes;
  int root = -1;
};

// EBNF text -> Grammar.
//   rule        ::= name "::=" alternatives          (a rule ends where the next "name ::=" begins)
//   alternatives::= sequence ("|" sequence)*
//   sequence    ::= (primary ("*" | "+" | "?" | "{" m ("," n?)? "}")?)*
//   primary     ::= name | "..." | '...' | [class] | [^class] | "." | "(" alternatives ")"
// Comments run from "#" to the end of the line. Escapes: \n \r \t \\ \" \' \[ \] \- \^ \xHH
// \uHHHH \UHHHHHHHH.
class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Grammar parse() {
    skip();
    if (at_end()) fail("the grammar is empty");
    while (!at_end()) {
      const size_t start = i_;
      const std::string name = read_name();
      if (name.empty()) fail("expected a rule name", start);
      skip();
      if (s_.compare(i_, 3, "::=") != 0)
        fail("expected \"::=\" after rule name \"" + name + "\" (EBNF rules \"name ::= ...\"; Lark's \"name: ...\" is not supported)");
      i_ += 3;
      const int id = rule_id(name);
      if (defined_[size_t(id)]) fail("rule \"" + name + "\" is defined twice", start);
      defined_[size_t(id)] = true;
      g_.rules[size_t(id)] = alternatives(0);
      skip();
    }
    for (size_t r = 0; r < g_.rules.size(); ++r)
      if (!defined_[r]) throw Error("grammar: rule \"" + g_.names[r] + "\" is used but not defined");
    const auto it = ids_.find("root");
    if (it == ids_.end()) throw Error("grammar: no \"root\" rule (the output must match root)");
    g_.root = it->second;
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(const std::string& what, size_t at = std::string::npos) const {
    if (at == std::string::npos) at = i_;
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < s_.size(); ++k) {
      if (s_[k] == '\n') ++line, col = 1;
      else ++col;
    }
    throw Error("grammar: " + what + " at line " + std::to_string(line) + ", column " + std::to_string(col));
  }
  bool at_end() const { return i_ >= s_.size(); }
  void skip() {
    while (!at_end()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (!at_end() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }
  std::string read_name() {
    const size_t b = i_;
    while (!at_end() && name_char(s_[i_])) ++i_;
    return s_.substr(b, i_ - b);
  }
  // At "name ::=": the next rule begins.
  bool rule_start() const {
    size_t k = i_;
    while (k < s_.size() && name_char(s_[k])) ++k;
    if (k == i_) return false;
    while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\n' || s_[k] == '\r')) ++k;
    return s_.compare(k, 3, "::=") == 0;
  }
  int rule_id(const std::string& name) {
    auto [it, added] = ids_.emplace(name, int(g_.rules.size()));
    if (added) {
      g_.rules.emplace_back();
      g_.names.push_back(name);
      defined_.push_back(false);
    }
    return it->second;
  }
  int helper(std::vector<Alt> alts) {
    g_.rules.push_back(std::move(alts));
    g_.names.emplace_back();
    defined_.push_back(true);
    return int(g_.rules.size()) - 1;
  }
  int add_class(CpClass c) {
    std::sort(c.ranges.begin(), c.ranges.end());
    g_.classes.push_back(std::move(c));
    return int(g_.classes.size()) - 1;
  }
  void count(size_t n) {
    elements_ += n;
    if (elements_ > kMaxElements) fail("the grammar is too large (more than 65536 elements after expansion)");
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (at_end()) fail("unfinished escape");
      const char c = s_[i_++];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("bad hex digit in an escape", i_ - 1);
      v = v * 16 + uint32_t(d);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) fail("escape outside Unicode scalar values");
    return v;
  }
  // One code point of a literal or class (escapes decoded; the text's own UTF-8 decoded).
  uint32_t code_point() {
    if (at_end()) fail("unfinished literal or class");
    const uint8_t c = uint8_t(s_[i_]);
    if (c == '\\') {
      ++i_;
      if (at_end()) fail("unfinished escape");
      const char e = s_[i_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return uint32_t(uint8_t(e));
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        default: fail(std::string("unknown escape \\") + e, i_ - 2);
      }
    }
    if (c < 0x80) {
      ++i_;
      return c;
    }
    Utf8Run run;
    uint32_t v = 0;
    const size_t b = i_;
    do {
      const uint8_t x = uint8_t(s_[i_]);
      if (!run.push(x)) fail("the grammar text is not valid UTF-8", b);
      v = i_ == b ? utf8_lead_bits(x) : (v << 6) | (x & 0x3F);
      ++i_;
    } while (run.need > 0 && !at_end());
    if (run.need > 0) fail("the grammar text is not valid UTF-8", b);
    return v;
  }

  std::vector<Alt> alternatives(int depth) {
    if (depth > 64) fail("groups nested more than 64 deep");
    std::vector<Alt> alts(1);
    while (true) {
      skip();
      if (at_end() || rule_start()) break;
      const char c = s_[i_];
      if (c == '|') {
        ++i_;
        alts.emplace_back();
        continue;
      }
      if (c == ')') {
        if (depth == 0) fail("unmatched ')'");
        break;
      }
      std::vector<Elem> item = primary(depth);
      postfix(item, alts.back());
    }
    return alts;
  }

  // The elements of one primary (a literal is one element per code point).
  std::vector<Elem> primary(int depth) {
    const char c = s_[i_];
    std::vector<Elem> out;
    if (c == '"' || c == '\'') {
      ++i_;
      while (true) {
        if (at_end()) fail("unterminated literal");
        if (s_[i_] == c) {
          ++i_;
          break;
        }
        const uint32_t cp = code_point();
        CpClass k;
        k.ranges.push_back({cp, cp});
        out.push_back({false, add_class(std::move(k))});
      }
      if (out.empty()) out.push_back({true, helper({Alt{}})});  // "" matches the empty text
    } else if (c == '[') {
      const size_t at = i_++;
      CpClass k;
      if (!at_end() && s_[i_] == '^') {
        k.negated = true;
        ++i_;
      }
      while (true) {
        if (at_end()) fail("unterminated class", at);
        if (s_[i_] == ']') {
          ++i_;
          break;
        }
        const uint32_t a = code_point();
        uint32_t b = a;
        if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
          ++i_;
          b = code_point();
          if (b < a) fail("a class range runs backwards", at);
        }
        k.ranges.push_back({a, b});
      }
      if (k.ranges.empty() && !k.negated) fail("an empty class matches nothing", at);
      out.push_back({false, add_class(std::move(k))});
    } else if (c == '.') {
      ++i_;
      CpClass k;
      k.negated = true;  // the complement of nothing: any code point
      out.push_back({false, add_class(std::move(k))});
    } else if (c == '(') {
      ++i_;
      std::vector<Alt> alts = alternatives(depth + 1);
      if (at_end() || s_[i_] != ')') fail("missing ')'");
      ++i_;
      out.push_back({true, helper(std::move(alts))});
    } else if (name_char(c)) {
      const std::string name = read_name();
      out.push_back({true, rule_id(name)});
    } else {
      fail(std::string("unexpected '") + c + "'");
    }
    count(out.size());
    return out;
  }

  // Applies a postfix operator to `item` (if one follows) and appends the result to `seq`.
  void postfix(std::vector<Elem> item, Alt& seq) {
    skip();
    // One element to repeat: a group of the item's elements when it has several.
    auto one = [&]() -> Elem { return item.size() == 1 ? item[0] : Elem{true, helper({Alt(item.begin(), item.end())})}; };
    auto star = [&](Elem x) {
      const int r = helper({});
      g_.rules[size_t(r)] = {Alt{x, Elem{true, r}}, Alt{}};
      return Elem{true, r};
    };
    if (at_end()) {
      seq.insert(seq.end(), item.begin(), item.end());
      return;
    }
    const char c = s_[i_];
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      const Elem x = one();
      if (c == '*') seq.push_back(star(x));
      if (c == '+') {
        seq.push_back(x);
        seq.push_back(star(x));
      }
      if (c == '?') seq.push_back({true, helper({Alt{x}, Alt{}})});
      count(2);
      return;
    }
    if (c == '{' && !rule_start()) {
      const size_t at = i_++;
      auto number = [&]() {
        skip();
        if (at_end() || s_[i_] < '0' || s_[i_] > '9') fail("expected a number in {m,n}", at);
        long v = 0;
        while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') {
          v = v * 10 + (s_[i_++] - '0');
          if (v > kMaxRepeat) fail("repetition counts above 256", at);
        }
        skip();
        return int(v);
      };
      const int m = number();
      int n = m;
      bool unbounded = false;
      if (!at_end() && s_[i_] == ',') {
        ++i_;
        skip();
        if (!at_end() && s_[i_] == '}') unbounded = true;
        else n = number();
      }
      if (at_end() || s_[i_] != '}') fail("expected '}'", at);
      ++i_;
      if (!unbounded && n < m) fail("{m,n} with n < m", at);
      const Elem x = one();
      for (int k = 0; k < m; ++k) seq.push_back(x);
      if (unbounded) {
        seq.push_back(star(x));
      } else if (n > m) {
        // opt_1 ::= x | ε; opt_k ::= x opt_{k-1} | ε
        int prev = helper({Alt{x}, Alt{}});
        for (int k = 2; k <= n - m; ++k) prev = helper({Alt{x, Elem{true, prev}}, Alt{}});
        seq.push_back({true, prev});
      }
      count(size_t(m) + size_t(2 * (n - m)) + 2);
      return;
    }
    seq.insert(seq.end(), item.begin(), item.end());
  }

  const std::string& s_;
  size_t i_ = 0;
  Grammar g_;
  std::map<std::string, int> ids_;
  std::vector<bool> defined_;
  size_t elements_ = 0;
};

// The rules with an alternative whose every element is a rule already found (or a class, when
// `classes` is set), to a fixpoint: without classes, the rules that derive the empty text; with
// them, the rules that derive some text.
std::vector<bool> some_alternative_all(const Grammar& g, bool classes) {
  std::vector<bool> in(g.rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); ++r) {
      if (in[r]) continue;
      for (const Alt& a : g.rules[r]) {
        bool all = true;
        for (const Elem& e : a) all = all && (e.rule ? bool(in[size_t(e.id)]) : classes);
        if (all) {
          in[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return in;
}

// Refuses left recursion (a rule that can reach itself before consuming anything, with more of
// its alternative to come) and rules that derive no text at all (x ::= x).
void check_left_recursion(const Grammar& g) {
  const size_t R = g.rules.size();

  const std::vector<bool> nullable = some_alternative_all(g, false);  // derive the empty text
  // left[r]: rules that can stand first in r with something of r's alternative after them. A
  // rule that can stand first as the alternative's last element is a tail call: the stack does
  // not grow, so a cycle of those (x* with a nullable x) only revisits a stack the expansion has
  // seen, which expand() prunes; only cycles that grow the stack are left recursion.
  std::vector<std::vector<int>> left(R);
  for (size_t r = 0; r < R; ++r)
    for (const Alt& a : g.rules[r])
      for (size_t i = 0; i < a.size(); ++i) {
        const Elem& e = a[i];
        if (!e.rule) break;
        if (i + 1 < a.size()) left[r].push_back(e.id);
        if (!nullable[size_t(e.id)]) break;
      }
  // A cycle in `left` is left recursion: depth-first search with colours.
  std::vector<uint8_t> colour(R, 0);
  auto name_of = [&](int r) {
    // A helper rule is named by the first named rule that uses it.
    return g.names[size_t(r)].empty() ? std::string("a group or repetition") : "rule \"" + g.names[size_t(r)] + "\"";
  };
  std::vector<std::pair<int, size_t>> st;
  for (size_t r0 = 0; r0 < R; ++r0) {
    if (colour[r0]) continue;
    st.push_back({int(r0), 0});
    colour[r0] = 1;
    while (!st.empty()) {
      auto& [r, k] = st.back();
      if (k < left[size_t(r)].size()) {
        const int n = left[size_t(r)][k++];
        if (colour[size_t(n)] == 1) throw Error("grammar: " + name_of(n) + " is left-recursive (it can begin with itself), which this matcher cannot follow");
        if (colour[size_t(n)] == 0) {
          colour[size_t(n)] = 1;
          st.push_back({n, 0});
        }
      } else {
        colour[size_t(r)] = 2;
        st.pop_back();
      }
    }
  }
  const std::vector<bool> productive = some_alternative_all(g, true);  // derive some text
  for (size_t r = 0; r < R; ++r)
    if (!productive[r])
      throw Error("grammar: " + (g.names[r].empty() ? std::string("a group or repetition") : "rule \"" + g.names[r] + "\"") +
                  " derives no text (every alternative leads back to itself)");
}

struct Pos {
  int rule, alt, idx;
  bool operator<(const Pos& o) const {
    return rule != o.rule ? rule < o.rule : alt != o.alt ? alt < o.alt : idx < o.idx;
  }
  bool operator==(const Pos& o) const { return rule == o.rule && alt == o.alt && idx == o.idx; }
};
using Stack = std::vector<Pos>;
using Stacks = std::vector<Stack>;

class GrammarConstraint final : public OutputConstraint, public std::enable_shared_from_this<GrammarConstraint> {
 public:
  GrammarConstraint(std::shared_ptr<const TokenBytes> v, Grammar g) : vocab_(std::move(v)), g_(std::move(g)) {}

  // Expands `s` until its top is a class, into `out` (one stack per way). `seen`: the stacks
  // with a rule on top already expanded since the last code point; meeting one again adds
  // nothing (a loop that consumed nothing), so that branch ends.
  void expand(Stack& s, Stacks& out, std::set<Stack>& seen) const {
    if (s.size() > kMaxDepth || out.size() > kMaxStacks) return;
    if (s.empty()) {
      out.push_back(s);
      return;
    }
    const Pos top = s.back();
    const Alt& a = g_.rules[size_t(top.rule)][size_t(top.alt)];
    if (size_t(top.idx) == a.size()) {
      s.pop_back();
      expand(s, out, seen);
      s.push_back(top);
      return;
    }
    const Elem& e = a[size_t(top.idx)];
    if (!e.rule) {
      out.push_back(s);
      return;
    }
    if (!seen.insert(s).second) return;
    // The caller's position moves past the reference; when that ends its alternative it is
    // dropped first (a tail call), so repetitions do not grow the stack.
    s.back().idx++;
    const bool tail = size_t(s.back().idx) == a.size();
    if (tail) s.pop_back();
    const auto& alts = g_.rules[size_t(e.id)];
    for (size_t j = 0; j < alts.size(); ++j) {
      s.push_back({e.id, int(j), 0});
      expand(s, out, seen);
      s.pop_back();
    }
    if (tail) s.push_back(top);
    else s.back().idx--;
  }
  static void normalise(Stacks& s) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    if (s.size() > kMaxStacks) s.resize(kMaxStacks);
  }
  const CpClass* top_class(const Stack& s) const {
    if (s.empty()) return nullptr;
    const Pos& p = s.back();
    return &g_.classes[size_t(g_.rules[size_t(p.rule)][size_t(p.alt)][size_t(p.idx)].id)];
  }
  Stacks advance(const Stacks& in, uint32_t cp) const {
    Stacks out;
    std::set<Stack> seen;
    for (const Stack& s : in) {
      const CpClass* k = top_class(s);
      if (!k || !k->test(cp)) continue;
      Stack t = s;
      t.back().idx++;
      expand(t, out, seen);
    }
    normalise(out);
    return out;
  }
  Stacks initial() const {
    Stacks out;
    std::set<Stack> seen;
    for (size_t j = 0; j < g_.rules[size_t(g_.root)].size(); ++j) {
      Stack s{{g_.root, int(j), 0}};
      expand(s, out, seen);
    }
    normalise(out);
    return out;
  }

  // The matcher's state: open parses plus a code point partly read.
  struct Cursor {
    Stacks stacks;
    Utf8Run utf8;
    uint32_t partial = 0;  // bits of the code point so far
    uint32_t least = 0;    // the smallest code point of the sequence's length
    bool push(const GrammarConstraint& c, uint8_t b) {
      if (utf8.need == 0 && b < 0x80) {
        stacks = c.advance(stacks, b);
        return !stacks.empty();
      }
      const bool lead = utf8.need == 0;
      if (!utf8.push(b)) return false;
      if (lead) least = utf8.need == 1 ? 0x80 : utf8.need == 2 ? 0x800 : 0x10000;
      partial = lead ? utf8_lead_bits(b) : (partial << 6) | (b & 0x3F);
      if (utf8.need == 0) {
        stacks = c.advance(stacks, partial);
        partial = 0;
        return !stacks.empty();
      }
      // Inside a code point: some open parse must accept one it can still become.
      const uint32_t lo = std::max(least, partial << (6 * utf8.need));
      const uint32_t hi = std::min<uint32_t>(0x10FFFF, (partial << (6 * utf8.need)) | ((1u << (6 * utf8.need)) - 1));
      for (const Stack& s : stacks)
        if (const CpClass* k = c.top_class(s); k && k->meets(lo, hi)) return true;
      return false;
    }
    bool complete() const {
      return utf8.need == 0 && !stacks.empty() && stacks.front().empty();  // sorted: the empty stack first
    }
  };

  // A request's matcher: the cursors it has met, interned as the states of a deterministic
  // automaton built lazily (state x byte -> state), so a mask walks each token by table lookups
  // once the states it passes have been seen.
  class S final : public State {
   public:
    explicit S(std::shared_ptr<const GrammarConstraint> c) : c_(std::move(c)) {
      Cursor start;
      start.stacks = c_->initial();
      at_ = intern(std::move(start));
    }
    void mask(std::span<float> logits, std::span<const int32_t> eos_ids) const override {
      if (states_.size() > kMaxStates) reset();
      std::bitset<256> first;
      for (int b = 0; b < 256; ++b) first[size_t(b)] = step(at_, uint8_t(b)) >= 0;
      mask_tokens(logits, *c_->vocab_, &first, complete(), eos_ids, [&](std::string_view bytes, size_t) {
        int s = at_;
        for (char ch : bytes)
          if ((s = step(s, uint8_t(ch))) < 0) return false;
        return true;
      });
    }
    void accept(int32_t token) override {
      const TokenBytes& vocab = *c_->vocab_;
      if (token < 0 || size_t(token) >= vocab.size() || at_ < 0) return;
      for (char ch : vocab[size_t(token)])
        if ((at_ = step(at_, uint8_t(ch))) < 0) break;  // a token the mask did not allow: nothing is open
    }
    bool complete() const override { return at_ >= 0 && states_[size_t(at_)].cur.complete(); }
    bool must_end() const override { return complete() && states_[size_t(at_)].cur.stacks.size() == 1; }

   private:
    static constexpr size_t kMaxStates = 1 << 14;
    struct DState {
      Cursor cur;
      std::array<int32_t, 256> next;  // -2 not yet known, -1 dead
    };
    static std::string key_of(const Cursor& c) {
      std::string k;
      k.reserve(16 + c.stacks.size() * 16);
      auto put = [&](uint32_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
      put(c.utf8.need), put(c.utf8.lo), put(c.utf8.hi), put(c.partial), put(c.least);
      for (const Stack& st : c.stacks) {
        put(uint32_t(st.size()));
        for (const Pos& p : st) put(uint32_t(p.rule)), put(uint32_t(p.alt)), put(uint32_t(p.idx));
      }
      return k;
    }
    int intern(Cursor c) const {
      std::string k = key_of(c);
      if (auto it = index_.find(k); it != index_.end()) return it->second;
      const int id = int(states_.size());
      DState d{std::move(c), {}};
      d.next.fill(-2);
      states_.push_back(std::move(d));
      index_.emplace(std::move(k), id);
      return id;
    }
    int step(int s, uint8_t b) const {
      const int32_t known = states_[size_t(s)].next[b];
      if (known != -2) return known;
      Cursor t = states_[size_t(s)].cur;
      const int n = t.push(*c_, b) ? intern(std::move(t)) : -1;
      states_[size_t(s)].next[b] = n;
      return n;
    }
    // Drops every state but the current one (a long, varied output met too many).
    void reset() const {
      Cursor cur = states_[size_t(at_)].cur;
      states_.clear();
      index_.clear();
      at_ = intern(std::move(cur));
    }

    std::shared_ptr<const GrammarConstraint> c_;
    mutable std::vector<DState> states_;
    mutable std::unordered_map<std::string, int> index_;
    mutable int at_ = -1;
  };
  std::unique_ptr<State> start() const override { return std::make_unique<S>(shared_from_this()); }

 private:
  std::shared_ptr<const TokenBytes> vocab_;
  Grammar g_;
};

}  // namespace

std::string ebnf_literal(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const uint8_t c = uint8_t(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::shared_ptr<const OutputConstraint> grammar_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                           const std::string& grammar) {
  Parser parser(grammar);
  Grammar g = parser.parse();
  check_left_recursion(g);
  return std::make_shared<GrammarConstraint>(std::move(vocab), std::move(g));
}

}  // namespace sieve::guided
