// The Jinja lexer: template source to tokens, with Jinja2's whitespace rules as transformers
// configures them (trim_blocks, lstrip_blocks) applied to the text between tags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sieve::text::jinja {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok kind;
  std::string text;  // text, name, string value or operator
  size_t pos;
  int64_t i = 0;
  double f = 0;
};

// The tokens of `src` (already newline-normalized), ending with kEof. Throws TemplateError.
std::vector<Token> lex(const std::string& src);

}  // namespace sieve::text::jinja
