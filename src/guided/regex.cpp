// Regular-expression guided decoding (guided.h): the pattern is parsed into a tree, compiled into
// a byte-level Thompson NFA, and a request's state is the set of NFA states its output reaches.
// The whole output must match (as with ^...$).
#include <algorithm>
#include <bit>
#include <bitset>
#include <cctype>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "guided/guided.h"

namespace sieve::guided {

namespace {

constexpr size_t kMaxStates = 1024;
using ByteSet = std::bitset<256>;

// A set of NFA states as 16 words (iterated word by word).
struct StateSet {
  uint64_t w[kMaxStates / 64] = {};
  void set(size_t i) { w[i / 64] |= uint64_t(1) << (i % 64); }
  bool test(size_t i) const { return (w[i / 64] >> (i % 64)) & 1; }
  StateSet& operator|=(const StateSet& o) {
    for (size_t k = 0; k < std::size(w); ++k) w[k] |= o.w[k];
    return *this;
  }
  bool any() const {
    for (uint64_t x : w)
      if (x) return true;
    return false;
  }
  bool none() const { return !any(); }
  template <class F>
  void each(F&& f) const {
    for (size_t k = 0; k < std::size(w); ++k)
      for (uint64_t x = w[k]; x; x &= x - 1) f(k * 64 + size_t(std::countr_zero(x)));
  }
};

// The pattern as a tree.
struct Re {
  enum Kind { Bytes, Concat, Alt, Repeat, Empty } kind = Empty;
  ByteSet set;                      // Bytes: one byte out of the set
  std::vector<std::unique_ptr<Re>> kids;
  int min = 0, max = -1;            // Repeat: {min, max}, max -1: unbounded
};

class Parser {
 public:
  explicit Parser(const std::string& p) : p_(p) {}
  std::unique_ptr<Re> parse() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    auto r = alt();
    if (i_ < p_.size()) fail("unexpected ')'");
    return r;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("regex: " + what + " at offset " + std::to_string(i_) + " of \"" + p_ + "\"");
  }
  bool at_end() const { return i_ >= p_.size(); }
  std::unique_ptr<Re> alt() {
    auto first = concat();
    if (at_end() || p_[i_] != '|') return first;
    auto a = std::make_unique<Re>();
    a->kind = Re::Alt;
    a->kids.push_back(std::move(first));
    while (!at_end() && p_[i_] == '|') {
      ++i_;
      a->kids.push_back(concat());
    }
    return a;
  }
  std::unique_ptr<Re> concat() {
    auto c = std::make_unique<Re>();
    c->kind = Re::Concat;
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$' && i_ + 1 == p_.size()) {
        ++i_;
        break;
      }
      c->kids.push_back(repeat());
    }
    return c;
  }
  std::unique_ptr<Re> repeat() {
    auto a = atom();
    while (!at_end()) {
      int lo, hi;
      const char q = p_[i_];
      if (q == '*') {
        lo = 0, hi = -1, ++i_;
      } else if (q == '+') {
        lo = 1, hi = -1, ++i_;
      } else if (q == '?') {
        lo = 0, hi = 1, ++i_;
      } else if (q == '{') {
        size_t j = i_ + 1;
        auto num = [&](int& v) {
          const size_t s = j;
          v = 0;
          while (j < p_.size() && std::isdigit(uint8_t(p_[j]))) v = v * 10 + (p_[j++] - '0');
          if (v > 1000) fail("a repeat count above 1000");
          return j > s;
        };
        if (!num(lo)) fail("a repeat count expected");
        hi = lo;
        if (j < p_.size() && p_[j] == ',') {
          ++j;
          if (!num(hi)) hi = -1;
        }
        if (j >= p_.size() || p_[j] != '}') fail("'}' expected");
        if (hi >= 0 && hi < lo) fail("{m,n} with n < m");
        i_ = j + 1;
      } else {
        break;
      }
      if (!at_end() && (p_[i_] == '?' || p_[i_] == '+')) ++i_;  // lazy / possessive: the same language
      auto r = std::make_unique<Re>();
      r->kind = Re::Repeat;
      r->min = lo;
      r->max = hi;
      r->kids.push_back(std::move(a));
      a = std::move(r);
    }
    return a;
  }
  static ByteSet range(int a, int b) {
    ByteSet s;
    for (int c = a; c <= b; ++c) s.set(size_t(c));
    return s;
  }
  // \d \w \s and their negations, or one escaped byte.
  ByteSet escape() {
    if (at_end()) fail("a pattern cannot end in '\\'");
    const char c = p_[i_++];
    const ByteSet digit = range('0', '9');
    const ByteSet word = digit | range('a', 'z') | range('A', 'Z') | range('_', '_');
    ByteSet space;
    for (char s : {' ', '\t', '\n', '\r', '\f', '\v'}) space.set(uint8_t(s));
    switch (c) {
      case 'd': return digit;
      case 'D': return ~digit;
      case 'w': return word;
      case 'W': return ~word;
      case 's': return space;
      case 'S': return ~space;
      case 'n': return range('\n', '\n');
      case 't': return range('\t', '\t');
      case 'r': return range('\r', '\r');
      case 'f': return range('\f', '\f');
      case 'v': return range('\v', '\v');
      default:
        if (std::isalnum(uint8_t(c))) fail(std::string("the escape \\") + c + " is not supported");
        return range(uint8_t(c), uint8_t(c));
    }
  }
  std::unique_ptr<Re> atom() {
    auto r = std::make_unique<Re>();
    r->kind = Re::Bytes;
    const char c = p_[i_++];
    switch (c) {
      case '(': {
        if (!at_end() && p_[i_] == '?') {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
            i_ += 2;
          } else {
            fail("lookaround and named groups are not supported");
          }
        }
        auto inner = alt();
        if (at_end() || p_[i_] != ')') fail("')' expected");
        ++i_;
        return inner;
      }
      case '[': {
        bool neg = false;
        if (!at_end() && p_[i_] == '^') neg = true, ++i_;
        ByteSet s;
        bool first = true;
        while (!at_end() && (p_[i_] != ']' || first)) {
          first = false;
          ByteSet one;
          int lo;
          if (p_[i_] == '\\') {
            ++i_;
            one = escape();
            lo = -1;
            for (int b = 0; b < 256 && one.count() == 1; ++b)
              if (one.test(size_t(b))) lo = b;
          } else {
            lo = uint8_t(p_[i_++]);
            one.set(size_t(lo));
          }
          if (lo >= 0 && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
            ++i_;
            int hi;
            if (p_[i_] == '\\') {
              ++i_;
              ByteSet e = escape();
              if (e.count() != 1) fail("a class cannot end a range");
              hi = -1;
              for (int b = 0; b < 256; ++b)
                if (e.test(size_t(b))) hi = b;
            } else {
              hi = uint8_t(p_[i_++]);
            }
            if (hi < lo) fail("a range out of order");
            one = range(lo, hi);
          }
          s |= one;
        }
        if (at_end()) fail("']' expected");
        ++i_;
        r->set = neg ? ~s : s;
        return r;
      }
      case '.':
        r->set = ~range('\n', '\n');
        return r;
      case '\\':
        r->set = escape();
        return r;
      case '*':
      case '+':
      case '?':
      case '{':
        fail(std::string("nothing to repeat before '") + c + "'");
      case ')':
        fail("unexpected ')'");
      default:
        r->set.set(uint8_t(c));
        return r;
    }
  }

  const std::string& p_;
  size_t i_ = 0;
};

// Thompson NFA: a state either reads one byte of `set` and goes to `next`, or is a split
// (epsilon edges to `next` and `next2`, -1 when absent).
struct Nfa {
  struct St {
    ByteSet set;
    bool reads = false;
    int next = -1, next2 = -1;
  };
  std::vector<St> st;
  int start = -1, accept = -1;
  std::vector<StateSet> closure;

  int add() {
    if (st.size() >= kMaxStates) throw Error("regex: the pattern needs more than 1024 states (long repeats?)");
    st.emplace_back();
    return int(st.size()) - 1;
  }
  // Builds `r` between a fresh entry state and a fresh exit state (both epsilon).
  std::pair<int, int> build(const Re& r) {
    const int in = add(), out = add();
    switch (r.kind) {
      case Re::Empty:
        st[size_t(in)].next = out;
        break;
      case Re::Bytes:
        st[size_t(in)].reads = true;
        st[size_t(in)].set = r.set;
        st[size_t(in)].next = out;
        break;
      case Re::Concat: {
        int at = in;
        for (const auto& k : r.kids) {
          auto [a, b] = build(*k);
          st[size_t(at)].next = a;
          at = b;
        }
        st[size_t(at)].next = out;
        break;
      }
      case Re::Alt: {
        // A chain of splits, one per alternative.
        int at = in;
        for (size_t i = 0; i < r.kids.size(); ++i) {
          auto [a, b] = build(*r.kids[i]);
          st[size_t(b)].next = out;
          if (i + 1 == r.kids.size()) {
            st[size_t(at)].next = a;
          } else {
            const int split = add();
            st[size_t(at)].next = a;
            st[size_t(at)].next2 = split;
            at = split;
          }
        }
        break;
      }
      case Re::Repeat: {
        int at = in;
        for (int i = 0; i < r.min; ++i) {
          auto [a, b] = build(*r.kids[0]);
          st[size_t(at)].next = a;
          at = b;
        }
        if (r.max < 0) {
          auto [a, b] = build(*r.kids[0]);
          st[size_t(at)].next = a;
          st[size_t(at)].next2 = out;
          st[size_t(b)].next = a;
          st[size_t(b)].next2 = out;
        } else {
          for (int i = r.min; i < r.max; ++i) {
            auto [a, b] = build(*r.kids[0]);
            st[size_t(at)].next = a;
            st[size_t(at)].next2 = out;
            at = b;
          }
          st[size_t(at)].next = out;
        }
        break;
      }
    }
    return {in, out};
  }
  void finish() {
    closure.assign(st.size(), StateSet());
    for (size_t s = 0; s < st.size(); ++s) {
      std::vector<int> todo = {int(s)};
      StateSet& c = closure[s];
      while (!todo.empty()) {
        const int x = todo.back();
        todo.pop_back();
        if (x < 0 || c.test(size_t(x))) continue;
        c.set(size_t(x));
        if (!st[size_t(x)].reads) {
          todo.push_back(st[size_t(x)].next);
          todo.push_back(st[size_t(x)].next2);
        }
      }
    }
  }
  StateSet step(const StateSet& from, uint8_t c) const {
    StateSet to;
    from.each([&](size_t s) {
      if (st[s].reads && st[s].set.test(c)) to |= closure[size_t(st[s].next)];
    });
    return to;
  }
  bool can_read(const StateSet& from) const {
    bool r = false;
    from.each([&](size_t s) { r = r || st[s].reads; });
    return r;
  }
};

class RegexConstraint final : public OutputConstraint, public std::enable_shared_from_this<RegexConstraint> {
 public:
  RegexConstraint(std::shared_ptr<const TokenBytes> v, Nfa nfa) : vocab_(std::move(v)), nfa_(std::move(nfa)) {}
  class S final : public State {
   public:
    explicit S(std::shared_ptr<const RegexConstraint> c) : c_(std::move(c)), set_(c_->nfa_.closure[size_t(c_->nfa_.start)]) {}
    void mask(std::span<float> logits, std::span<const int32_t> eos_ids) const override {
      const Nfa& nfa = c_->nfa_;
      ByteSet first;
      for (int b = 0; b < 256; ++b) first[size_t(b)] = nfa.step(set_, uint8_t(b)).any();
      mask_tokens(logits, *c_->vocab_, &first, complete(), eos_ids, [&](std::string_view bytes, size_t) {
        StateSet s = set_;
        for (char ch : bytes)
          if ((s = nfa.step(s, uint8_t(ch))).none()) return false;
        return true;
      });
    }
    void accept(int32_t token) override {
      const TokenBytes& vocab = *c_->vocab_;
      if (token < 0 || size_t(token) >= vocab.size()) return;
      for (char ch : vocab[size_t(token)]) set_ = c_->nfa_.step(set_, uint8_t(ch));
    }
    bool complete() const override { return set_.test(size_t(c_->nfa_.accept)); }
    bool must_end() const override { return complete() && !c_->nfa_.can_read(set_); }

   private:
    std::shared_ptr<const RegexConstraint> c_;
    StateSet set_;
  };
  std::unique_ptr<State> start() const override { return std::make_unique<S>(shared_from_this()); }

 private:
  std::shared_ptr<const TokenBytes> vocab_;
  Nfa nfa_;
};

}  // namespace

std::shared_ptr<const OutputConstraint> regex_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                         const std::string& pattern) {
  Parser parser(pattern);
  auto tree = parser.parse();
  Nfa nfa;
  auto [in, out] = nfa.build(*tree);
  nfa.start = in;
  nfa.accept = out;
  nfa.finish();
  return std::make_shared<RegexConstraint>(std::move(vocab), std::move(nfa));
}

}  // namespace sieve::guided
