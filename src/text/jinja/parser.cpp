#include "text/jinja/parser.h"

#include <algorithm>

#include "text/jinja/error.h"
#include "text/jinja/lexer.h"

namespace sieve::text::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t k_ = 0;
  int depth_ = 0;  // nesting of expressions and blocks: bounded so deep input cannot overflow

  struct Nest {
    Parser& p;
    Nest(Parser& parser, size_t pos) : p(parser) {
      if (++p.depth_ > 200) fail(pos, "template nested too deeply (more than 200 levels)");
    }
    ~Nest() { --p.depth_; }
  };

  const Token& cur() const { return t_[k_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(k_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Tok::kName && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur().pos, std::string("expected '") + op + "'" + got());
    ++k_;
  }
  std::string got() const {
    switch (cur().kind) {
      case Tok::kEof:
        return ", got end of template";
      case Tok::kBlockEnd:
        return ", got end of statement block";
      case Tok::kVarEnd:
        return ", got end of print statement";
      default:
        return ", got '" + cur().text + "'";
    }
  }
  std::string expect_name() {
    if (cur().kind != Tok::kName) fail(cur().pos, "expected a name" + got());
    return t_[k_++].text;
  }
  void expect_block_end() {
    if (cur().kind != Tok::kBlockEnd) fail(cur().pos, "expected end of statement block" + got());
    ++k_;
  }

  // Parses nodes until a block tag whose keyword is in `ends`; that keyword goes to `end` and
  // the parser stays after the keyword (the rest of that tag is the caller's).
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.kind == Tok::kEof) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "" : " or ") + e;
          fail(tk.pos, "unexpected end of template, expected " + list);
        }
        return body;
      }
      if (tk.kind == Tok::kText) {
        auto n = std::make_shared<Node>();
        n->kind = Node::kText;
        n->pos = tk.pos;
        n->text = tk.text;
        body.push_back(n);
        ++k_;
        continue;
      }
      if (tk.kind == Tok::kVarBegin) {
        ++k_;
        auto n = std::make_shared<Node>();
        n->kind = Node::kOutput;
        n->pos = tk.pos;
        n->expr = parse_tuple_or_expr();
        if (cur().kind != Tok::kVarEnd) fail(cur().pos, "expected end of print statement" + got());
        ++k_;
        body.push_back(n);
        continue;
      }
      if (tk.kind != Tok::kBlockBegin) fail(tk.pos, "unexpected token" + got());
      ++k_;
      if (cur().kind != Tok::kName) fail(cur().pos, "expected a statement name" + got());
      std::string kw = cur().text;
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        ++k_;
        end = kw;
        return body;
      }
      body.push_back(parse_statement());
    }
  }

  NodeP parse_statement() {
    Nest nest(*this, cur().pos);
    const Token& tk = cur();
    std::string kw = tk.text;
    size_t pos = tk.pos;
    ++k_;
    auto n = std::make_shared<Node>();
    n->pos = pos;
    if (kw == "if") {
      n->kind = Node::kIf;
      ExprP c = parse_expr();
      expect_block_end();
      while (true) {
        std::string end;
        Body b = parse_body({"elif", "else", "endif"}, end);
        n->branches.emplace_back(c, std::move(b));
        if (end == "endif") {
          expect_block_end();
          break;
        }
        if (end == "else") {
          expect_block_end();
          std::string e2;
          Body eb = parse_body({"endif"}, e2);
          n->branches.emplace_back(nullptr, std::move(eb));
          expect_block_end();
          break;
        }
        c = parse_expr();
        expect_block_end();
      }
    } else if (kw == "for") {
      n->kind = Node::kFor;
      n->targets = parse_targets();
      if (!is_name("in")) fail(cur().pos, "expected 'in'" + got());
      ++k_;
      n->expr = parse_expr(/*no_cond=*/true);
      if (is_name("if")) {
        ++k_;
        n->cond = parse_expr();
      }
      if (is_name("recursive")) fail(cur().pos, "recursive loops are not supported");
      expect_block_end();
      std::string end;
      n->body = parse_body({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
    } else if (kw == "set") {
      std::string first = expect_name();
      if (is_op(".")) {
        ++k_;
        n->kind = Node::kSet;
        n->targets = {first};
        n->attr = expect_name();
        expect_op("=");
        n->expr = parse_tuple_or_expr();
        expect_block_end();
      } else {
        n->targets = {first};
        while (is_op(",")) {
          ++k_;
          n->targets.push_back(expect_name());
        }
        if (is_op("=")) {
          ++k_;
          n->kind = Node::kSet;
          n->expr = parse_tuple_or_expr();
          expect_block_end();
        } else {
          n->kind = Node::kSetBlock;
          while (is_op("|")) {
            ++k_;
            n->filters.push_back(parse_filter_call(nullptr));
          }
          expect_block_end();
          std::string end;
          n->body = parse_body({"endset"}, end);
          expect_block_end();
        }
      }
    } else if (kw == "macro") {
      n->kind = Node::kMacro;
      n->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        ExprP def;
        if (is_op("=")) {
          ++k_;
          def = parse_expr();
        }
        n->params.emplace_back(p, def);
        if (!is_op(")")) expect_op(",");
      }
      ++k_;
      expect_block_end();
      std::string end;
      n->body = parse_body({"endmacro"}, end);
      if (cur().kind == Tok::kName) ++k_;  // {% endmacro name %}
      expect_block_end();
    } else if (kw == "filter") {
      n->kind = Node::kFilterBlock;
      n->filters.push_back(parse_filter_call(nullptr));
      while (is_op("|")) {
        ++k_;
        n->filters.push_back(parse_filter_call(nullptr));
      }
      expect_block_end();
      std::string end;
      n->body = parse_body({"endfilter"}, end);
      expect_block_end();
    } else if (kw == "call") {
      n->kind = Node::kCallBlock;
      n->expr = parse_expr();
      expect_block_end();
      std::string end;
      n->body = parse_body({"endcall"}, end);
      expect_block_end();
    } else if (kw == "generation") {
      // transformers' AssistantTracker tag: renders its body unchanged.
      n->kind = Node::kIf;
      expect_block_end();
      std::string end;
      Body b = parse_body({"endgeneration"}, end);
      expect_block_end();
      auto t = std::make_shared<Expr>();
      t->kind = Expr::kLiteral;
      t->pos = pos;
      t->lit = Value::boolean(true);
      n->branches.emplace_back(t, std::move(b));
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::kBreak : Node::kContinue;
      expect_block_end();
    } else {
      fail(pos, "unknown or unsupported statement '" + kw + "'");
    }
    return n;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) ++k_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++k_;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  ExprP make(Expr::Kind kind, size_t pos) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // A bare tuple (`a, b`) where Jinja allows one: print statements and set values.
  ExprP parse_tuple_or_expr() {
    size_t pos = cur().pos;
    ExprP e = parse_expr();
    if (!is_op(",")) return e;
    auto t = make(Expr::kTuple, pos);
    t->a.push_back(e);
    while (is_op(",")) {
      ++k_;
      if (cur().kind == Tok::kBlockEnd || cur().kind == Tok::kVarEnd) break;
      t->a.push_back(parse_expr());
    }
    return t;
  }

  ExprP parse_expr(bool no_cond = false) {
    if (no_cond) return parse_or();
    ExprP e = parse_or();
    while (is_name("if")) {
      size_t pos = cur().pos;
      ++k_;
      auto c = make(Expr::kCond, pos);
      ExprP test = parse_or();
      ExprP other;
      if (is_name("else")) {
        ++k_;
        other = parse_expr();
      }
      c->a = {test, e, other};
      e = c;
    }
    return e;
  }

  ExprP parse_or() {
    ExprP l = parse_and();
    while (is_name("or")) {
      auto e = make(Expr::kOr, cur().pos);
      ++k_;
      e->a = {l, parse_and()};
      l = e;
    }
    return l;
  }
  ExprP parse_and() {
    ExprP l = parse_not();
    while (is_name("and")) {
      auto e = make(Expr::kAnd, cur().pos);
      ++k_;
      e->a = {l, parse_not()};
      l = e;
    }
    return l;
  }
  ExprP parse_not() {
    Nest nest(*this, cur().pos);
    if (is_name("not")) {
      auto e = make(Expr::kNot, cur().pos);
      ++k_;
      e->a = {parse_not()};
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    size_t pos = cur().pos;
    ExprP l = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().kind == Tok::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = cur().text;
        ++k_;
      } else if (is_name("in")) {
        op = "in";
        ++k_;
      } else if (is_name("not") && peek().kind == Tok::kName && peek().text == "in") {
        op = "notin";
        k_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::kCompare, pos);
        cmp->a.push_back(l);
      }
      cmp->ops.push_back(op);
      cmp->a.push_back(parse_math1());
    }
    return cmp ? cmp : l;
  }
  ExprP binary(const std::string& op, size_t pos, ExprP l, ExprP r) {
    auto e = make(Expr::kBinary, pos);
    e->name = op;
    e->a = {std::move(l), std::move(r)};
    return e;
  }
  ExprP parse_math1() {
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      size_t pos = cur().pos;
      ++k_;
      l = binary(op, pos, l, parse_concat());
    }
    return l;
  }
  ExprP parse_concat() {
    ExprP l = parse_math2();
    while (is_op("~")) {
      size_t pos = cur().pos;
      ++k_;
      l = binary("~", pos, l, parse_math2());
    }
    return l;
  }
  ExprP parse_math2() {
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      size_t pos = cur().pos;
      ++k_;
      l = binary(op, pos, l, parse_pow());
    }
    return l;
  }
  ExprP parse_pow() {
    ExprP l = parse_unary(true);
    while (is_op("**")) {
      size_t pos = cur().pos;
      ++k_;
      l = binary("**", pos, l, parse_unary(true));
    }
    return l;
  }
  ExprP parse_unary(bool with_filter) {
    Nest nest(*this, cur().pos);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::kNeg : Expr::kPos, cur().pos);
      ++k_;
      e->a = {parse_unary(false)};
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_expr(e);
    return e;
  }

  ExprP parse_primary() {
    const Token& tk = cur();
    size_t pos = tk.pos;
    if (tk.kind == Tok::kName) {
      ++k_;
      auto e = make(Expr::kLiteral, pos);
      if (tk.text == "true" || tk.text == "True")
        e->lit = Value::boolean(true);
      else if (tk.text == "false" || tk.text == "False")
        e->lit = Value::boolean(false);
      else if (tk.text == "none" || tk.text == "None")
        e->lit = Value::none();
      else {
        e->kind = Expr::kName;
        e->name = tk.text;
      }
      return e;
    }
    if (tk.kind == Tok::kString) {
      std::string s;
      while (cur().kind == Tok::kString) s += t_[k_++].text;  // adjacent literals join
      auto e = make(Expr::kLiteral, pos);
      e->lit = Value::string(s);
      return e;
    }
    if (tk.kind == Tok::kInt || tk.kind == Tok::kFloat) {
      ++k_;
      auto e = make(Expr::kLiteral, pos);
      e->lit = tk.kind == Tok::kInt ? Value::integer(tk.i) : Value::number(tk.f);
      return e;
    }
    if (is_op("(")) {
      ++k_;
      if (is_op(")")) {
        ++k_;
        return make(Expr::kTuple, pos);
      }
      ExprP e = parse_expr();
      if (is_op(",")) {
        auto t = make(Expr::kTuple, pos);
        t->a.push_back(e);
        while (is_op(",")) {
          ++k_;
          if (is_op(")")) break;
          t->a.push_back(parse_expr());
        }
        e = t;
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++k_;
      auto e = make(Expr::kList, pos);
      while (!is_op("]")) {
        e->a.push_back(parse_expr());
        if (!is_op("]")) expect_op(",");
      }
      ++k_;
      return e;
    }
    if (is_op("{")) {
      ++k_;
      auto e = make(Expr::kDict, pos);
      while (!is_op("}")) {
        e->a.push_back(parse_expr());
        expect_op(":");
        e->a.push_back(parse_expr());
        if (!is_op("}")) expect_op(",");
      }
      ++k_;
      return e;
    }
    fail(pos, "unexpected token" + got());
  }

  void parse_call_args(ExprP& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().kind == Tok::kName && peek().kind == Tok::kOp && peek().text == "=") {
        std::string name = t_[k_].text;
        k_ += 2;
        call->kw.emplace_back(name, parse_expr());
      } else {
        call->a.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++k_;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        size_t pos = cur().pos;
        ++k_;
        auto g = make(Expr::kAttr, pos);
        if (cur().kind == Tok::kInt) {
          g->kind = Expr::kItem;
          auto idx = make(Expr::kLiteral, cur().pos);
          idx->lit = Value::integer(cur().i);
          ++k_;
          g->a = {e, idx};
        } else {
          g->name = expect_name();
          g->a = {e};
        }
        e = g;
      } else if (is_op("[")) {
        size_t pos = cur().pos;
        ++k_;
        ExprP parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
          if (is_op(":")) {
            slice = true;
            ++k_;
            ++n;
            if (n > 2) fail(cur().pos, "bad slice");
            continue;
          }
          if (is_op("]")) break;
          parts[n] = parse_expr();
        }
        ++k_;
        auto g = make(slice ? Expr::kSlice : Expr::kItem, pos);
        g->a = {e, parts[0], parts[1], parts[2]};
        if (!slice) {
          if (!parts[0]) fail(pos, "empty subscript");
          g->a.resize(2);
        }
        e = g;
      } else if (is_op("(")) {
        auto c = make(Expr::kCall, e->pos);  // errors point at the callee
        c->a.push_back(e);
        parse_call_args(c);
        e = c;
      } else {
        return e;
      }
    }
  }

  // `name` or `name(args)` after '|'; the operand goes in a[0] (null inside filter blocks).
  ExprP parse_filter_call(ExprP operand) {
    auto f = make(Expr::kFilter, cur().pos);
    f->name = expect_name();
    if (is_op(".")) fail(cur().pos, "dotted filter names are not supported");
    f->a.push_back(operand);
    if (is_op("(")) {
      ExprP tmp = make(Expr::kCall, cur().pos);
      parse_call_args(tmp);
      for (auto& x : tmp->a) f->a.push_back(x);
      f->kw = std::move(tmp->kw);
    }
    return f;
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (is_op("|")) {
        ++k_;
        e = parse_filter_call(e);
      } else if (is_name("is")) {
        auto t = make(Expr::kTest, cur().pos);
        ++k_;
        if (is_name("not")) {
          t->negated = true;
          ++k_;
        }
        t->name = expect_name();
        t->a.push_back(e);
        if (is_op("(")) {
          ExprP tmp = make(Expr::kCall, cur().pos);
          parse_call_args(tmp);
          for (auto& x : tmp->a) t->a.push_back(x);
        } else if ((cur().kind == Tok::kString || cur().kind == Tok::kInt ||
                    cur().kind == Tok::kFloat || is_op("[") || is_op("{") ||
                    (cur().kind == Tok::kName && !is_name("else") && !is_name("or") &&
                     !is_name("and") && !is_name("if") && !is_name("in") && !is_name("not") &&
                     !is_name("is")))) {
          t->a.push_back(parse_postfix(parse_primary()));
        }
        e = t;
      } else {
        return e;
      }
    }
  }
};

// Jinja2 reads templates with universal newlines and drops one trailing newline
// (keep_trailing_newline=False).
std::string normalize_source(std::string s) {
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\r') {
      out += '\n';
      if (k + 1 < s.size() && s[k + 1] == '\n') ++k;
    } else {
      out += s[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::shared_ptr<Program> parse_program(std::string source) {
  auto prog = std::make_shared<Program>();
  prog->source = normalize_source(std::move(source));
  try {
    Parser ps(lex(prog->source));
    prog->body = ps.parse_all();
  } catch (const TemplateError& e) {
    rethrow(prog->source, e, "syntax error");
  }
  return prog;
}

}  // namespace sieve::text::jinja
