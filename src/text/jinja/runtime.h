// The Jinja runtime: walks a parsed template with Jinja2's scoping (a `set` inside a loop stays
// in the loop; macros see the globals, not their caller's variables) and Python's semantics for
// operators; filters, tests and methods come from builtins.h.
#pragma once

#include <string>

#include "text/jinja/ast.h"

namespace sieve::text::jinja {

// Renders `p` with the keys of `context` (a map) as global variables. Throws sieve::Error
// "chat template error at line L, column C: ..." (the position of the failing expression).
std::string render_program(const Program& p, const Value& context);

}  // namespace sieve::text::jinja
