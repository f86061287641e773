#include "guided/guided.h"

#include <algorithm>
#include <limits>
#include <string_view>

#include "core/error.h"

namespace sieve::guided {

namespace {

constexpr uint8_t kMaxWs = 16;
constexpr const char* kLiterals[3] = {"true", "false", "null"};

bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

JsonStringLex::Result JsonStringLex::push(uint8_t c) {
  if (hex > 0) {
    if (!is_hex(c)) return kBad;
    --hex;
    return kMore;
  }
  if (escape) {
    escape = false;
    if (c == 'u') {
      hex = 4;
      return kMore;
    }
    const bool ok = c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
    return ok ? kMore : kBad;
  }
  if (utf8.need > 0 || c >= 0x80) return utf8.push(c) ? kMore : kBad;  // well-formed UTF-8
  if (c == '"') return kClosed;
  if (c == '\\') {
    escape = true;
    return kMore;
  }
  return c >= 0x20 ? kMore : kBad;
}

JsonNumberLex::Result JsonNumberLex::push(uint8_t c, bool integer) {
  const bool digit = is_digit(c);
  auto go = [&](uint8_t s) {
    state = s;
    return kMore;
  };
  const bool can_end = state == 2 || state == 3 || state == 5 || state == 8;
  switch (state) {
    case 0:
      if (c == '-') return go(1);
      [[fallthrough]];
    case 1:
      if (c == '0') return go(2);
      return digit ? go(3) : kBad;
    case 3:
      if (digit) return kMore;
      [[fallthrough]];
    case 2:
      if (!integer && c == '.') return go(4);
      if (!integer && (c == 'e' || c == 'E')) return go(6);
      break;
    case 4:
      return digit ? go(5) : kBad;
    case 5:
      if (digit) return kMore;
      if (c == 'e' || c == 'E') return go(6);
      break;
    case 6:
      if (c == '+' || c == '-') return go(7);
      [[fallthrough]];
    case 7:
      return digit ? go(8) : kBad;
    case 8:
      if (digit) return kMore;
      break;
  }
  return can_end ? kEnd : kBad;
}

std::vector<uint8_t> plain_string_tokens(const TokenBytes& vocab) {
  std::vector<uint8_t> out(vocab.size(), 0);
  for (size_t t = 0; t < vocab.size(); ++t) {
    JsonStringLex lex;
    bool ok = !vocab[t].empty();
    for (size_t i = 0; ok && i < vocab[t].size(); ++i) ok = lex.push(uint8_t(vocab[t][i])) == JsonStringLex::kMore;
    out[t] = ok && lex.between_chars();
  }
  return out;
}

bool JsonPrefix::whitespace(uint8_t c) {
  if (!is_ws(c) || ws_ >= kMaxWs) return false;
  ++ws_;
  return true;
}

bool JsonPrefix::value_start(uint8_t c) {
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= sizeof stack_) return false;
      stack_[depth_++] = char(c);
      mode_ = c == '{' ? kObjOpen : kArrOpen;
      return true;
    case '"':
      mode_ = kString;
      str_ = {};
      key_ = false;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = kLiteral;
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      sub_ = 1;
      return true;
    default: {
      JsonNumberLex n;
      if (n.push(c) != JsonNumberLex::kMore) return false;
      mode_ = kNumber;
      num_ = n;
      return true;
    }
  }
}

// After a complete value: a separator or the end of the container holding it.
bool JsonPrefix::after_value(uint8_t c) {
  mode_ = kAfter;
  if (depth_ == 0) {
    mode_ = kDone;
    return push(c);
  }
  const char top = stack_[depth_ - 1];
  if (c == ',') {
    mode_ = top == '{' ? kKeyExpect : kValue;
    return true;
  }
  if ((top == '{' && c == '}') || (top == '[' && c == ']')) {
    --depth_;
    if (depth_ == 0) mode_ = kDone;
    return true;
  }
  return whitespace(c);
}

bool JsonPrefix::push(uint8_t c) {
  if (!is_ws(c) || mode_ == kString) ws_ = 0;
  switch (mode_) {
    case kStart:
      return c == '{' && value_start(c);  // no whitespace first: models tend to idle on it
    case kObjOpen:
      if (c == '}') return after_value(c);  // an empty object closes like a full one
      [[fallthrough]];
    case kKeyExpect:
      if (c == '"') {
        mode_ = kString;
        str_ = {};
        key_ = true;
        return true;
      }
      return whitespace(c);
    case kColon:
      if (c == ':') {
        mode_ = kValue;
        return true;
      }
      return whitespace(c);
    case kArrOpen:
      if (c == ']') return after_value(c);
      [[fallthrough]];
    case kValue:
      if (value_start(c)) return true;
      return whitespace(c);
    case kAfter:
      return after_value(c);
    case kString:
      switch (str_.push(c)) {
        case JsonStringLex::kMore:
          return true;
        case JsonStringLex::kBad:
          return false;
        case JsonStringLex::kClosed:
          mode_ = key_ ? kColon : depth_ == 0 ? kDone : kAfter;
          return true;
      }
      return false;
    case kNumber:
      switch (num_.push(c)) {
        case JsonNumberLex::kMore:
          return true;
        case JsonNumberLex::kBad:
          return false;
        case JsonNumberLex::kEnd:
          return after_value(c);
      }
      return false;
    case kLiteral: {
      const char* lit = kLiterals[literal_];
      if (uint8_t(lit[sub_]) != c) return false;
      if (lit[++sub_] == '\0') mode_ = kAfter;
      return true;
    }
    case kDone:
      return false;  // only the end of the sequence
  }
  return false;
}

namespace {

class JsonConstraint final : public OutputConstraint, public std::enable_shared_from_this<JsonConstraint> {
 public:
  explicit JsonConstraint(std::shared_ptr<const TokenBytes> v)
      : vocab_(std::move(v)), plain_(plain_string_tokens(*vocab_)) {}
  class S final : public State {
   public:
    explicit S(std::shared_ptr<const JsonConstraint> c) : c_(std::move(c)) {}
    void mask(std::span<float> logits, std::span<const int32_t> eos_ids) const override {
      const bool in_string = state_.in_string();
      mask_tokens(logits, *c_->vocab_, nullptr, state_.complete(), eos_ids, [&](std::string_view bytes, size_t t) {
        if (in_string && c_->plain_[t]) return true;
        JsonPrefix p = state_;
        return p.push(bytes);
      });
    }
    void accept(int32_t token) override {
      if (token >= 0 && size_t(token) < c_->vocab_->size()) state_.push((*c_->vocab_)[size_t(token)]);
    }
    bool complete() const override { return state_.complete(); }
    bool must_end() const override { return state_.complete(); }

   private:
    std::shared_ptr<const JsonConstraint> c_;  // a state keeps its constraint's tables alive
    JsonPrefix state_;
  };
  std::unique_ptr<State> start() const override { return std::make_unique<S>(shared_from_this()); }

 private:
  std::shared_ptr<const TokenBytes> vocab_;
  std::vector<uint8_t> plain_;
};

// The output is one of `strings` and ends there (choices).
class LiteralConstraint final : public OutputConstraint, public std::enable_shared_from_this<LiteralConstraint> {
 public:
  LiteralConstraint(std::shared_ptr<const TokenBytes> v, std::vector<std::string> strings)
      : vocab_(std::move(v)), strings_(std::move(strings)) {}
  class S final : public State {
   public:
    explicit S(std::shared_ptr<const LiteralConstraint> c) : c_(std::move(c)) {}
    void mask(std::span<float> logits, std::span<const int32_t> eos_ids) const override {
      const std::vector<std::string_view> rest = continuations();
      mask_tokens(logits, *c_->vocab_, nullptr, complete(), eos_ids, [&](std::string_view tok, size_t) {
        return std::any_of(rest.begin(), rest.end(), [&](std::string_view r) { return r.substr(0, tok.size()) == tok; });
      });
    }
    void accept(int32_t token) override {
      if (token < 0 || size_t(token) >= c_->vocab_->size()) return;
      out_ += (*c_->vocab_)[size_t(token)];
    }
    bool complete() const override {
      return std::any_of(c_->strings_.begin(), c_->strings_.end(), [&](const std::string& s) { return out_ == s; });
    }
    bool must_end() const override { return complete() && continuations().empty(); }

   private:
    // What the strings that begin with the output so far still have to come.
    std::vector<std::string_view> continuations() const {
      std::vector<std::string_view> rest;
      for (const std::string& s : c_->strings_)
        if (s.size() > out_.size() && s.compare(0, out_.size(), out_) == 0) rest.push_back(std::string_view(s).substr(out_.size()));
      return rest;
    }
    std::shared_ptr<const LiteralConstraint> c_;
    std::string out_;
  };
  std::unique_ptr<State> start() const override { return std::make_unique<S>(shared_from_this()); }

 private:
  std::shared_ptr<const TokenBytes> vocab_;
  std::vector<std::string> strings_;
};

}  // namespace

std::shared_ptr<const OutputConstraint> json_object_constraint(std::shared_ptr<const TokenBytes> vocab) {
  return std::make_shared<JsonConstraint>(std::move(vocab));
}

std::shared_ptr<const OutputConstraint> choice_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                          std::vector<std::string> choices) {
  if (choices.empty()) throw Error("guided_choice: needs at least one choice");
  for (const auto& c : choices)
    if (c.empty()) throw Error("guided_choice: choices must not be empty strings");
  return std::make_shared<LiteralConstraint>(std::move(vocab), std::move(choices));
}

}  // namespace sieve::guided
