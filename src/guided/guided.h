// Guided decoding: constraints on a request's output tokens, applied by the sampler as a mask.
// A constraint is built once per request from the vocabulary's token bytes; its state advances
// with every sampled token (engine thread only). The kinds:
//  - json_object: one JSON object (RFC 8259), then end of sequence;
//  - json_schema: a JSON text that matches a schema (json_schema.cpp);
//  - regex: a text a regular expression matches in full (regex.cpp);
//  - grammar: a text an EBNF grammar derives (grammar.cpp);
//  - choice: exactly one of a list of strings, then end of sequence.
// A token is allowed when its bytes keep the output a prefix of something the constraint
// accepts; end-of-sequence ids only once the output is complete. Masking walks the whole
// vocabulary each step (bytes x tokens), so a guided request costs host time per token.
#pragma once

#include <bitset>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "guided/constraint.h"

namespace sieve::guided {

// The text starts with '{' at once; at most 64 levels of nesting; whitespace between tokens of
// the JSON text is allowed, at most 16 bytes in a row (so a model cannot loop on it).
std::shared_ptr<const OutputConstraint> json_object_constraint(std::shared_ptr<const TokenBytes> vocab);
// A JSON text that matches `schema` (JSON Schema), for the subset that fixes the text's shape
// token by token: "type" object (properties in their declared order, the required ones present,
// no others), array ("items", minItems, maxItems), string, integer, number, boolean, null, or a
// list of types; "enum" and "const" of any JSON values; "anyOf" / "oneOf"; "$ref" to
// "#/$defs/..." or "#/definitions/...". Annotations (title, description, default, examples,
// format) are ignored. The top level is an object or an array. Anything else throws Error naming
// it. No whitespace is allowed outside strings (compact JSON).
// Schemas whose anyOf alternatives start with the same character (a union of objects), whose
// $refs recurse (a tree) or whose strings have minLength / maxLength (up to 256) go through the
// grammar matcher instead (json_schema_grammar).
std::shared_ptr<const OutputConstraint> json_schema_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                               const std::string& schema_json);
// The same subset as a grammar (grammar_constraint's EBNF): anyOf alternatives may start alike
// and $refs may recurse; minItems / maxItems up to 257. Throws Error naming what it refuses.
std::string json_schema_grammar(const std::string& schema_json);
// `s` as a literal of grammar_constraint's EBNF ("..." with \" \\ and \xHH escapes).
std::string ebnf_literal(std::string_view s);
// A text the regular expression matches in full (as if anchored at both ends), byte by byte:
// literals and escaped bytes, `.` (any byte but a newline), classes (`[a-z]`, `[^...]`, `\d \w
// \s` and their negations), groups `(...)` and `(?:...)`, `|`, and `* + ? {m} {m,} {m,n}`
// (lazy forms match the same texts). Backreferences, lookaround and other escapes throw Error
// naming them, as does a pattern that needs more than 1024 automaton states.
std::shared_ptr<const OutputConstraint> regex_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                         const std::string& pattern);
// A text the grammar derives from its rule "root" (EBNF as in vLLM's guided_grammar and
// llama.cpp's GBNF): rules "name ::= alternatives"; "|", grouping "( )", "?", "*", "+",
// "{m}", "{m,}", "{m,n}" (m, n <= 256); literals "..." or '...'; classes [a-z], [^...] of code
// points; "." (any code point); comments from "#". Escapes \n \r \t \\ \" \' \[ \] \- \^ \xHH
// \uHHHH \UHHHHHHHH. Output bytes are matched as UTF-8 code points. Throws Error naming the
// problem (with its line and column) for bad syntax, an undefined or missing root rule, and left
// recursion (a rule that can begin with itself with more to follow; x* of a nullable x is fine).
// At most 4096 parses stay open at once (a more ambiguous grammar is cut there) and 1024 nested
// rules.
std::shared_ptr<const OutputConstraint> grammar_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                           const std::string& grammar);
// Throws Error when `choices` is empty or holds an empty string.
std::shared_ptr<const OutputConstraint> choice_constraint(std::shared_ptr<const TokenBytes> vocab,
                                                          std::vector<std::string> choices);

// Well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF), byte
// by byte: a lead byte fixes how many continuation bytes follow and the range of the first one.
struct Utf8Run {
  uint8_t need = 0;  // continuation bytes still to come
  uint8_t lo = 0x80, hi = 0xBF;
  // For a byte >= 0x80, or any byte while need > 0: whether it keeps the text well-formed.
  bool push(uint8_t c) {
    if (need > 0) {
      if (c < lo || c > hi) return false;
      --need;
      lo = 0x80;
      hi = 0xBF;
      return true;
    }
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    return true;
  }
};

// The body of a JSON string after its opening quote, byte by byte: escapes (`\uXXXX` too) and
// well-formed UTF-8.
struct JsonStringLex {
  enum Result : uint8_t { kMore, kClosed, kBad };
  Result push(uint8_t c);
  // Between characters, outside an escape: where plain text tokens may follow.
  bool between_chars() const { return !escape && hex == 0 && utf8.need == 0; }
  bool escape = false;
  uint8_t hex = 0;  // hex digits of a \u escape still to come
  Utf8Run utf8;
};

// A JSON number (an integer when `integer`), byte by byte. kEnd: the number was complete and
// ended before `c`, which belongs to what follows.
struct JsonNumberLex {
  enum Result : uint8_t { kMore, kEnd, kBad };
  Result push(uint8_t c, bool integer = false);
  // 0 start, 1 after '-', 2 after a leading 0, 3 integer digits, 4 after '.', 5 fraction
  // digits, 6 after 'e', 7 after the exponent's sign, 8 exponent digits.
  uint8_t state = 0;
};

// Per token: 1 when the token is plain string text (complete UTF-8 without '"', '\\' or control
// bytes), which inside a string, between characters, is always allowed and changes nothing.
std::vector<uint8_t> plain_string_tokens(const TokenBytes& vocab);

// The mask every constraint applies: -inf on each token that is empty (special), whose first
// byte `first` excludes (when given), or that `allowed(token bytes, token id)` rejects; then the
// end-of-sequence ids come back (at 0 if they were masked) when `complete`, or when nothing else
// is left, so that a request can always end.
template <class Allowed>
void mask_tokens(std::span<float> logits, const TokenBytes& vocab, const std::bitset<256>* first, bool complete,
                 std::span<const int32_t> eos_ids, Allowed&& allowed) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (size_t t = 0; t < logits.size(); ++t) {
    const bool ok = t < vocab.size() && !vocab[t].empty() && (!first || first->test(uint8_t(vocab[t][0]))) &&
                    allowed(std::string_view(vocab[t]), t);
    if (ok) {
      any = true;
    } else {
      logits[t] = neg_inf;
    }
  }
  if (complete || !any)
    for (int32_t e : eos_ids)
      if (e >= 0 && size_t(e) < logits.size() && logits[size_t(e)] == neg_inf) logits[size_t(e)] = 0.0f;
}

// The JSON automaton, exposed for tests: feeds bytes, false on the first one that cannot extend
// a JSON object text.
class JsonPrefix {
 public:
  bool push(uint8_t c);
  bool push(std::string_view s) {
    for (char c : s)
      if (!push(uint8_t(c))) return false;
    return true;
  }
  bool complete() const { return mode_ == kDone; }
  // Inside a string, between characters: plain string text (plain_string_tokens) may follow.
  bool in_string() const { return mode_ == kString && str_.between_chars(); }

 private:
  enum Mode : uint8_t { kStart, kObjOpen, kKeyExpect, kColon, kValue, kArrOpen, kAfter, kString, kNumber, kLiteral, kDone };
  bool value_start(uint8_t c);
  bool after_value(uint8_t c);
  bool whitespace(uint8_t c);
  Mode mode_ = kStart;
  uint8_t sub_ = 0;      // kLiteral: bytes matched
  uint8_t literal_ = 0;  // kLiteral: 0 true, 1 false, 2 null
  uint8_t ws_ = 0;       // consecutive whitespace bytes
  JsonStringLex str_;    // kString
  JsonNumberLex num_;    // kNumber
  bool key_ = false;     // kString: a key
  uint8_t depth_ = 0;
  char stack_[64] = {};
};

}  // namespace sieve::guided
