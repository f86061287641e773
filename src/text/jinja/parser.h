// The Jinja parser: tokens to a syntax tree by recursive descent with Jinja2's operator
// precedence. Nesting is bounded (200 levels) so hostile templates cannot overflow the stack.
#pragma once

#include <memory>
#include <string>

#include "text/jinja/ast.h"

namespace sieve::text::jinja {

// Parses a template as Jinja2 reads it (universal newlines, one trailing newline dropped).
// Throws sieve::Error "chat template syntax error at line L, column C: ...".
std::shared_ptr<Program> parse_program(std::string source);

}  // namespace sieve::text::jinja
