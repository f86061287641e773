// The Jinja syntax tree: expressions and statements as the parser builds them and the runtime
// walks them; a Program is a parsed template with its source (for error positions).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace sieve::text::jinja {

struct Expr;
using ExprP = std::shared_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kPos,
    kNot,
    kBinary,
    kCompare,
    kAnd,
    kOr,
    kCond,
    kList,
    kTuple,
    kDict
  };
  Kind kind;
  size_t pos;
  Value lit;
  std::string name;              // name, attribute, filter, test, operator
  std::vector<ExprP> a;          // operands / args / list items (dict: k, v, k, v ...)
  std::vector<std::string> ops;  // comparison operators
  std::vector<std::pair<std::string, ExprP>> kw;
  bool negated = false;  // `is not`
};

struct Node;
using NodeP = std::shared_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum Kind {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kFilterBlock,
    kBreak,
    kContinue,
    kCallBlock
  };
  Kind kind;
  size_t pos;
  std::string text;
  ExprP expr;                                    // output, set value, for iterable, call
  std::vector<std::pair<ExprP, Body>> branches;  // if/elif/else (else has null condition)
  std::vector<std::string> targets;              // for / set names
  std::string attr;                              // set ns.attr
  ExprP cond;                                    // for ... if cond
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro parameters with defaults
  std::vector<ExprP> filters;  // filter block / set block filters (kFilter exprs
                               // with a null operand)
};

struct Program {
  Body body;
  std::string source;
};

}  // namespace sieve::text::jinja
