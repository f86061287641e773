// The Jinja renderer: lexer (with Jinja2's whitespace rules under trim_blocks and
// lstrip_blocks), a recursive-descent parser with Jinja2's operator precedence, and a
// tree-walking interpreter with Python's semantics for the values templates use.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/jinja_value.h"
#include "text/unicode.h"

namespace sieve::text {
namespace jinja {

namespace {

// ---------------------------------------------------------------- errors and positions

struct TemplateError {
  size_t pos;
  std::string msg;
};
[[noreturn]] void fail(size_t pos, std::string msg) {
  throw TemplateError{pos, std::move(msg)};
}
// For builtins that do not know where they were called: the caller fills in the position.
constexpr size_t kHere = std::string::npos;
[[noreturn]] void fail_here(std::string msg) {
  throw TemplateError{kHere, std::move(msg)};
}

struct RaiseException {
  std::string msg;
};

// Control flow of {% break %} / {% continue %}.
enum class Flow { kNormal, kBreak, kContinue };

// ---------------------------------------------------------------- lexer

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

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstrip_ws(const std::string& s) {
  size_t e = s.size();
  while (e > 0 && is_space(s[e - 1])) --e;
  return s.substr(0, e);
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      size_t k = find_tag(pos);
      std::string text = s_.substr(pos, (k == std::string::npos ? s_.size() : k) - pos);
      if (k == std::string::npos) {
        emit_text(text, pos);
        break;
      }
      char kind = s_[k + 1];  // '{', '%' or '#'
      char sign = k + 2 < s_.size() ? s_[k + 2] : 0;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between the start of the line and the tag.
        size_t l = text.rfind('\n');
        l = l == std::string::npos ? 0 : l + 1;
        if (l > 0 || line_starting) {
          bool ws = l < text.size();
          for (size_t q = l; q < text.size() && ws; ++q) ws = is_space(text[q]);
          if (ws) text.resize(l);
        }
      }
      emit_text(text, pos);
      size_t body = k + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        size_t e = s_.find("#}", body);
        if (e == std::string::npos) fail(k, "unterminated comment");
        pos = after_end(e > 0 ? s_[e - 1] : 0, e + 2, true, line_starting);
        continue;
      }
      if (kind == '%' && is_raw(body)) {
        pos = lex_raw(k, body, line_starting);
        continue;
      }
      toks_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", k});
      pos = lex_tag(body, kind == '{' ? '}' : '%', line_starting);
    }
    toks_.push_back({Tok::kEof, "", s_.size()});
    return std::move(toks_);
  }

 private:
  const std::string& s_;
  std::vector<Token> toks_;

  size_t find_tag(size_t from) const {
    for (size_t p = s_.find('{', from); p != std::string::npos; p = s_.find('{', p + 1))
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) return p;
    return std::string::npos;
  }

  void emit_text(const std::string& t, size_t pos) {
    if (!t.empty()) toks_.push_back({Tok::kText, t, pos});
  }

  // `e` is where the closing delimiter starts (its '-' or '+' is just before), `after` just past
  // it. Applies '-' (strip following whitespace) or trim_blocks (drop one newline).
  size_t after_end(char sign, size_t after, bool block_like, bool& line_starting) {
    if (sign == '-') {
      while (after < s_.size() && is_space(s_[after])) ++after;
    } else if (block_like && sign != '+' && after < s_.size() && s_[after] == '\n') {
      ++after;
    }
    line_starting = after > 0 && s_[after - 1] == '\n';
    return after;
  }

  bool is_raw(size_t p) const {
    while (p < s_.size() && is_space(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && is_space(s_[p])) ++p;
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0 ||
           s_.compare(p, 3, "+%}") == 0;
  }

  size_t lex_raw(size_t k, size_t body, bool& line_starting) {
    size_t e = s_.find("%}", body);
    if (e == std::string::npos) fail(k, "unterminated {% raw %}");
    size_t pos = after_end(s_[e - 1], e + 2, true, line_starting);
    for (size_t p = s_.find("{%", pos); p != std::string::npos; p = s_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = q < s_.size() ? s_[q] : 0;
      if (sign == '-' || sign == '+') ++q;
      while (q < s_.size() && is_space(s_[q])) ++q;
      if (s_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < s_.size() && is_space(s_[q])) ++q;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ++q;
      if (s_.compare(q, 2, "%}") != 0) continue;
      std::string text = s_.substr(pos, p - pos);
      if (sign == '-') text = rstrip_ws(text);
      emit_text(text, pos);
      return after_end(s_[q - 1], q + 2, true, line_starting);
    }
    fail(k, "missing {% endraw %}");
  }

  size_t lex_tag(size_t p, char close, bool& line_starting) {
    const size_t start = p;
    int depth = 0;  // open brackets: "}}" inside a dict literal does not end the tag
    while (true) {
      while (p < s_.size() && is_space(s_[p])) ++p;
      if (p >= s_.size())
        fail(start - 2, std::string("unterminated ") + (close == '}' ? "{{" : "{%"));
      // End delimiter, optionally with '-' (strip what follows) or '+' (keep the newline).
      char sign = 0;
      size_t q = p;
      if ((s_[p] == '-' || (s_[p] == '+' && close == '%')) && p + 2 < s_.size() &&
          s_[p + 1] == close && s_[p + 2] == '}') {
        sign = s_[p];
        q = p + 1;
      }
      if (depth == 0 && s_[q] == close && q + 1 < s_.size() && s_[q + 1] == '}') {
        toks_.push_back({close == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", p});
        return after_end(sign, q + 2, close == '%', line_starting);
      }
      char c = s_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
        toks_.push_back({Tok::kName, s_.substr(p, e - p), p});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
        bool is_float = false;
        if (e + 1 < s_.size() && s_[e] == '.' &&
            std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
        }
        if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
          size_t x = e + 1;
          if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
          if (x < s_.size() && std::isdigit(static_cast<unsigned char>(s_[x]))) {
            is_float = true;
            e = x;
            while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = p; k < e; ++k)
          if (s_[k] != '_') num += s_[k];
        Token t{is_float ? Tok::kFloat : Tok::kInt, num, p};
        if (is_float)
          t.f = std::strtod(num.c_str(), nullptr);  // 1e999 is inf, as in Python
        else
          errno = 0;
        t.i = std::strtoll(num.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(p, "integer literal " + num + " is too large");
        toks_.push_back(t);
        p = e;
      } else if (c == '\'' || c == '"') {
        toks_.push_back({Tok::kString, lex_string(p), p});
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                    "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                    "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        bool found = false;
        for (const char* op : ops) {
          size_t n = std::char_traits<char>::length(op);
          if (s_.compare(p, n, op) == 0) {
            toks_.push_back({Tok::kOp, op, p});
            if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++depth;
            if (n == 1 && (*op == ')' || *op == ']' || *op == '}') && depth > 0) --depth;
            p += n;
            found = true;
            break;
          }
        }
        if (!found) fail(p, std::string("unexpected character '") + c + "'");
      }
    }
  }

  // Python string-literal escapes, as Jinja2 decodes its string tokens.
  std::string lex_string(size_t& p) {
    char q = s_[p];
    size_t start = p++;
    std::string out;
    while (true) {
      if (p >= s_.size()) fail(start, "unterminated string");
      char c = s_[p++];
      if (c == q) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p >= s_.size()) fail(start, "unterminated string");
      char e = s_[p++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '0':
          out += '\0';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + n > s_.size()) fail(p, "bad escape in string");
          uint32_t cp = 0;
          for (size_t d = 0; d < n; ++d) {
            char h = s_[p + d];
            int v = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                    : (h >= 'a' && h <= 'f')                    ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F')                    ? h - 'A' + 10
                                                                : -1;
            if (v < 0) fail(p - 2, "bad \\" + std::string(1, e) + " escape in string");
            cp = cp * 16 + static_cast<uint32_t>(v);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            fail(p - 2, "escape names no Unicode scalar value");
          p += n;
          append_utf8(out, cp);
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
  }
};

// ---------------------------------------------------------------- syntax tree

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

}  // namespace

struct Program {
  Body body;
  std::string source;
};

namespace {

// ---------------------------------------------------------------- parser

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

// ---------------------------------------------------------------- interpreter

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
  const Value* find(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(n);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

std::string type_name(const Value& v) {
  switch (v.type) {
    case Value::kUndefined:
      return "undefined";
    case Value::kNone:
      return "NoneType";
    case Value::kBool:
      return "bool";
    case Value::kInt:
      return "int";
    case Value::kFloat:
      return "float";
    case Value::kStr:
      return "str";
    case Value::kList:
      return "list";
    case Value::kMap:
      return "dict";
    case Value::kFunc:
      return "function";
  }
  return "?";
}

// Code points of a UTF-8 string (Python indexes strings by code point).
std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    next_code_point(s, j);
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

size_t str_len(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool py_space(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 ||
         cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// str.strip/lstrip/rstrip: `chars` null strips whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws)
    for (size_t i = 0; i < chars->s.size();) set.push_back(next_code_point(chars->s, i));
  auto strip_it = [&](uint32_t cp) {
    return ws ? py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::vector<std::pair<size_t, uint32_t>> cps;
  for (size_t i = 0; i < s.size();) {
    size_t st = i;
    cps.emplace_back(st, next_code_point(s, i));
  }
  size_t a = 0, b = cps.size();
  if (left)
    while (a < b && strip_it(cps[a].second)) ++a;
  if (right)
    while (b > a && strip_it(cps[b - 1].second)) --b;
  if (a == b) return "";
  size_t start = cps[a].first, end = b < cps.size() ? cps[b].first : s.size();
  return s.substr(start, end - start);
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    size_t i = 0;
    auto skip_ws = [&] {
      while (i < s.size()) {
        size_t j = i;
        if (!py_space(next_code_point(s, j))) break;
        i = j;
      }
    };
    skip_ws();
    while (i < s.size()) {
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        out.push_back(py_strip(rest, nullptr, false, true));
        return out;
      }
      size_t st = i;
      while (i < s.size()) {
        size_t j = i;
        if (py_space(next_code_point(s, j))) break;
        i = j;
      }
      out.push_back(s.substr(st, i - st));
      skip_ws();
    }
    return out;
  }
  const std::string& d = sep->s;
  if (d.empty()) fail_here("empty separator");
  size_t st = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    size_t p = s.find(d, st);
    if (p == std::string::npos) break;
    out.push_back(s.substr(st, p - st));
    st = p + d.size();
  }
  out.push_back(s.substr(st));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::string out;
    int64_t n = 0;
    auto cs = chars_of(s);
    for (const auto& c : cs) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += c;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  size_t st = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(from, st);
    if (p == std::string::npos) break;
    out += s.substr(st, p - st) + to;
    st = p + from.size();
    ++n;
  }
  return out + s.substr(st);
}

std::string ascii_upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (auto& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    bool alpha = std::isalpha(u) != 0;
    if (alpha) c = static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
    prev_cased = alpha;
  }
  return out;
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Value::kFloat && b.type != Value::kFloat) {
      int64_t x = a.type == Value::kBool ? a.b : a.i, y = b.type == Value::kBool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kStr:
      return a.s == b.s;
    case Value::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::kMap:
      if (a.map->items.size() != b.map->items.size()) return false;
      for (const auto& [k, v] : a.map->items) {
        const Value* o = b.map->find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    case Value::kFunc:
      return a.func == b.func;
    default:
      return false;
  }
}

// Python's < for the types templates compare; -1, 0, 1.
int compare_values(const Value& a, const Value& b, size_t pos) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_str() && b.is_str()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      if (values_equal((*a.list)[k], (*b.list)[k])) continue;
      return compare_values((*a.list)[k], (*b.list)[k], pos);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(pos, "cannot compare " + type_name(a) + " with " + type_name(b));
}

bool contains(const Value& hay, const Value& needle, size_t pos) {
  switch (hay.type) {
    case Value::kStr:
      if (!needle.is_str()) fail(pos, "'in <string>' requires string as left operand");
      return hay.s.find(needle.s) != std::string::npos;
    case Value::kList:
      for (const auto& x : *hay.list)
        if (values_equal(x, needle)) return true;
      return false;
    case Value::kMap:
      return needle.is_str() && hay.map->find(needle.s) != nullptr;
    case Value::kUndefined:
      fail(pos, "'" + hay.s + "' is undefined");
    default:
      fail(pos, "argument of type '" + type_name(hay) + "' is not iterable");
  }
}

// Items a for loop or a filter iterates: list items, dict keys, string characters.
List iterate(const Value& v, size_t pos) {
  switch (v.type) {
    case Value::kList:
      return *v.list;
    case Value::kMap: {
      List out;
      for (const auto& kv : v.map->items) out.push_back(Value::string(kv.first));
      return out;
    }
    case Value::kStr: {
      List out;
      for (auto& c : chars_of(v.s)) out.push_back(Value::string(c));
      return out;
    }
    case Value::kUndefined:
      return {};
    default:
      fail(pos, "'" + type_name(v) + "' object is not iterable");
  }
}

int64_t to_int(const Value& v, size_t pos, const char* what) {
  if (v.type == Value::kInt) return v.i;
  if (v.type == Value::kBool) return v.b;
  if (v.type == Value::kFloat) {
    if (!(std::fabs(v.f) < 9.2e18)) fail(pos, std::string(what) + " is out of range");
    return static_cast<int64_t>(v.f);
  }
  fail(pos, std::string(what) + " must be an integer, got " + type_name(v));
}

class Interpreter {
 public:
  Interpreter(const Program& prog, Scope& globals) : prog_(prog), globals_(globals) {}

  void exec_body(const Body& body, Scope& sc, std::string& out, Flow& flow) {
    for (const auto& n : body) {
      exec(*n, sc, out, flow);
      if (flow != Flow::kNormal) return;
    }
  }

 private:
  const Program& prog_;
  Scope& globals_;
  int depth_ = 0;

  void exec(const Node& n, Scope& sc, std::string& out, Flow& flow) {
    switch (n.kind) {
      case Node::kText:
        out += n.text;
        return;
      case Node::kOutput: {
        Value v = eval(*n.expr, sc);
        out += to_str(v);
        return;
      }
      case Node::kIf:
        for (const auto& [c, b] : n.branches) {
          if (!c || eval(*c, sc).truthy()) {
            exec_body(b, sc, out, flow);
            return;
          }
        }
        return;
      case Node::kFor:
        exec_for(n, sc, out, flow);
        return;
      case Node::kSet: {
        Value v = eval(*n.expr, sc);
        if (!n.attr.empty()) {
          const Value* ns = sc.find(n.targets[0]);
          if (!ns || !ns->is_map() || !ns->map->is_namespace)
            fail(n.pos, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
          ns->map->set(n.attr, v);
          return;
        }
        assign(n.targets, v, sc, n.pos);
        return;
      }
      case Node::kSetBlock: {
        std::string captured;
        Flow f = Flow::kNormal;
        exec_body(n.body, sc, captured, f);
        Value v = Value::string(captured);
        for (const auto& fe : n.filters) v = apply_filter(*fe, v, sc);
        assign(n.targets, v, sc, n.pos);
        return;
      }
      case Node::kMacro: {
        const Node* node = &n;
        Interpreter* self = this;
        sc.vars[n.text] = Value::function(
            [self, node](const CallArgs& args) { return self->call_macro(*node, args); });
        return;
      }
      case Node::kFilterBlock: {
        std::string captured;
        Flow f = Flow::kNormal;
        exec_body(n.body, sc, captured, f);
        Value v = Value::string(captured);
        for (const auto& fe : n.filters) v = apply_filter(*fe, v, sc);
        out += to_str(v);
        return;
      }
      case Node::kCallBlock:
        fail(n.pos, "{% call %} blocks are not supported");
      case Node::kBreak:
        flow = Flow::kBreak;
        return;
      case Node::kContinue:
        flow = Flow::kContinue;
        return;
    }
  }

  void assign(const std::vector<std::string>& targets, const Value& v, Scope& sc, size_t pos) {
    if (targets.size() == 1) {
      sc.vars[targets[0]] = v;
      return;
    }
    List items = iterate(v, pos);
    if (items.size() != targets.size())
      fail(pos, "cannot unpack " + std::to_string(items.size()) + " values into " +
                    std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) sc.vars[targets[k]] = items[k];
  }

  void exec_for(const Node& n, Scope& sc, std::string& out, Flow& outer_flow) {
    Value seq = eval(*n.expr, sc);
    if (seq.is_none()) fail(n.expr->pos, "'NoneType' object is not iterable");
    List items = iterate(seq, n.expr->pos);
    Scope loop_scope;
    loop_scope.parent = &sc;
    if (n.cond) {
      List kept;
      for (auto& it : items) {
        assign(n.targets, it, loop_scope, n.pos);
        if (eval(*n.cond, loop_scope).truthy()) kept.push_back(it);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      Flow f = Flow::kNormal;
      exec_body(n.else_body, sc, out, f);
      return;
    }
    size_t len = items.size();
    for (size_t k = 0; k < len; ++k) {
      assign(n.targets, items[k], loop_scope, n.pos);
      Value loop = Value::make_map();
      auto& m = *loop.map;
      m.set("index", Value::integer(static_cast<int64_t>(k + 1)));
      m.set("index0", Value::integer(static_cast<int64_t>(k)));
      m.set("revindex", Value::integer(static_cast<int64_t>(len - k)));
      m.set("revindex0", Value::integer(static_cast<int64_t>(len - k - 1)));
      m.set("first", Value::boolean(k == 0));
      m.set("last", Value::boolean(k + 1 == len));
      m.set("length", Value::integer(static_cast<int64_t>(len)));
      m.set("depth", Value::integer(1));
      m.set("depth0", Value::integer(0));
      m.set("previtem", k > 0 ? items[k - 1] : Value::undefined("previtem"));
      m.set("nextitem", k + 1 < len ? items[k + 1] : Value::undefined("nextitem"));
      m.set("cycle", Value::function([k](const CallArgs& a) {
              if (a.pos.empty()) return Value::undefined();
              return a.pos[k % a.pos.size()];
            }));
      loop_scope.vars["loop"] = loop;
      Flow f = Flow::kNormal;
      exec_body(n.body, loop_scope, out, f);
      if (f == Flow::kBreak) break;
    }
    (void)outer_flow;
  }

  Value call_macro(const Node& n, const CallArgs& args) {
    if (++depth_ > 200) fail(n.pos, "macro recursion too deep");
    Scope sc;
    sc.parent = &globals_;
    for (size_t k = 0; k < n.params.size(); ++k) {
      const auto& [name, def] = n.params[k];
      if (const Value* v = args.get(k, name))
        sc.vars[name] = *v;
      else if (def)
        sc.vars[name] = eval(*def, sc);
      else
        sc.vars[name] = Value::undefined(name);
    }
    if (args.pos.size() > n.params.size())
      fail(n.pos, "macro '" + n.text + "' takes " + std::to_string(n.params.size()) +
                      " arguments, got " + std::to_string(args.pos.size()));
    std::string out;
    Flow f = Flow::kNormal;
    exec_body(n.body, sc, out, f);
    --depth_;
    return Value::string(out);
  }

  // ------------------------------------------------------------ expressions

  Value eval(const Expr& e, Scope& sc) {
    switch (e.kind) {
      case Expr::kLiteral:
        return e.lit;
      case Expr::kName: {
        const Value* v = sc.find(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case Expr::kAttr: {
        Value obj = eval(*e.a[0], sc);
        return get_attr(obj, e.name, e.pos);
      }
      case Expr::kItem: {
        Value obj = eval(*e.a[0], sc);
        Value idx = eval(*e.a[1], sc);
        return get_item(obj, idx, e.pos);
      }
      case Expr::kSlice:
        return eval_slice(e, sc);
      case Expr::kCall:
        return eval_call(e, sc);
      case Expr::kFilter:
        return apply_filter(e, eval(*e.a[0], sc), sc);
      case Expr::kTest: {
        bool r = apply_test(e, sc);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::kNeg: {
        Value v = eval(*e.a[0], sc);
        if (v.type == Value::kInt || v.type == Value::kBool) {
          int64_t x = v.type == Value::kBool ? v.b : v.i;
          if (x == INT64_MIN) fail(e.pos, "integer overflow");
          return Value::integer(-x);
        }
        if (v.type == Value::kFloat) return Value::number(-v.f);
        fail(e.pos, "bad operand type for unary -: '" + type_name(v) + "'");
      }
      case Expr::kPos:
        return eval(*e.a[0], sc);
      case Expr::kNot:
        return Value::boolean(!eval(*e.a[0], sc).truthy());
      case Expr::kAnd: {
        Value l = eval(*e.a[0], sc);
        return l.truthy() ? eval(*e.a[1], sc) : l;
      }
      case Expr::kOr: {
        Value l = eval(*e.a[0], sc);
        return l.truthy() ? l : eval(*e.a[1], sc);
      }
      case Expr::kCond: {
        if (eval(*e.a[0], sc).truthy()) return eval(*e.a[1], sc);
        return e.a[2] ? eval(*e.a[2], sc) : Value::undefined();
      }
      case Expr::kList:
      case Expr::kTuple: {
        Value v = Value::make_list();
        v.tuple = e.kind == Expr::kTuple;
        for (const auto& x : e.a) v.list->push_back(eval(*x, sc));
        return v;
      }
      case Expr::kDict: {
        Value v = Value::make_map();
        for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
          Value key = eval(*e.a[k], sc);
          if (!key.is_str()) fail(e.a[k]->pos, "only string keys are supported in dict literals");
          v.map->set(key.s, eval(*e.a[k + 1], sc));
        }
        return v;
      }
      case Expr::kCompare: {
        Value l = eval(*e.a[0], sc);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.a[k + 1], sc);
          const std::string& op = e.ops[k];
          bool ok;
          size_t pos = e.a[k + 1]->pos;
          if (op == "==")
            ok = values_equal(l, r);
          else if (op == "!=")
            ok = !values_equal(l, r);
          else if (op == "in")
            ok = contains(r, l, pos);
          else if (op == "notin")
            ok = !contains(r, l, pos);
          else {
            int c = compare_values(l, r, pos);
            ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!ok) return Value::boolean(false);
          l = r;
        }
        return Value::boolean(true);
      }
      case Expr::kBinary:
        return eval_binary(e, sc);
    }
    fail(e.pos, "cannot evaluate expression");
  }

  Value eval_binary(const Expr& e, Scope& sc) {
    Value l = eval(*e.a[0], sc), r = eval(*e.a[1], sc);
    const std::string& op = e.name;
    if (op == "~") return Value::string(to_str(l) + to_str(r));
    if (l.is_undefined() || r.is_undefined())
      fail(e.pos, "'" + (l.is_undefined() ? l.s : r.s) + "' is undefined");
    if (op == "+") {
      if (l.is_str() && r.is_str()) return Value::string(l.s + r.s);
      if (l.is_list() && r.is_list()) {
        List x = *l.list;
        x.insert(x.end(), r.list->begin(), r.list->end());
        return Value::make_list(std::move(x));
      }
    }
    if (op == "*") {
      // Sequence repetition, either way round: 'ab' * 3 and 3 * 'ab'.
      const Value* seq = l.is_str() || l.is_list() ? &l : r.is_str() || r.is_list() ? &r : nullptr;
      const Value* cnt = seq == &l ? &r : &l;
      if (seq && (cnt->type == Value::kInt || cnt->type == Value::kBool)) {
        int64_t n = to_int(*cnt, e.pos, "count");
        if (n * static_cast<int64_t>(seq->is_str() ? seq->s.size() : seq->list->size()) > (1 << 24))
          fail(e.pos, "repetition result too large");
        if (seq->is_str()) {
          std::string out;
          for (int64_t k = 0; k < n; ++k) out += seq->s;
          return Value::string(out);
        }
        List out;
        for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::make_list(std::move(out));
      }
    }
    if (!l.is_number() || !r.is_number())
      fail(e.pos, "unsupported operand types for " + op + ": '" + type_name(l) + "' and '" +
                      type_name(r) + "'");
    bool ints = l.type != Value::kFloat && r.type != Value::kFloat;
    int64_t li = l.type == Value::kBool ? l.b : l.i, ri = r.type == Value::kBool ? r.b : r.i;
    double lf = l.as_double(), rf = r.as_double();
    // Python ints do not overflow; Sieve's are 64-bit and overflow is an error.
    int64_t r64 = 0;
    if (op == "+") {
      if (!ints) return Value::number(lf + rf);
      if (__builtin_add_overflow(li, ri, &r64)) fail(e.pos, "integer overflow");
      return Value::integer(r64);
    }
    if (op == "-") {
      if (!ints) return Value::number(lf - rf);
      if (__builtin_sub_overflow(li, ri, &r64)) fail(e.pos, "integer overflow");
      return Value::integer(r64);
    }
    if (op == "*") {
      if (!ints) return Value::number(lf * rf);
      if (__builtin_mul_overflow(li, ri, &r64)) fail(e.pos, "integer overflow");
      return Value::integer(r64);
    }
    if (op == "/") {
      if (rf == 0) fail(e.pos, "division by zero");
      return Value::number(lf / rf);
    }
    if (op == "//" || op == "%") {
      if (rf == 0) fail(e.pos, "integer division or modulo by zero");
      if (ints) {
        if (li == INT64_MIN && ri == -1) fail(e.pos, "integer overflow");
        int64_t q = li / ri, m = li % ri;
        if (m != 0 && ((m < 0) != (ri < 0))) {
          --q;
          m += ri;
        }
        return Value::integer(op == "//" ? q : m);
      }
      double q = std::floor(lf / rf);
      return Value::number(op == "//" ? q : lf - q * rf);
    }
    if (op == "**") {
      if (ints && ri >= 0) {
        int64_t x = 1, b = li;
        for (int64_t k = ri; k > 0; k >>= 1) {  // square and multiply, overflow checked
          if ((k & 1) && __builtin_mul_overflow(x, b, &x)) fail(e.pos, "integer overflow");
          if (k > 1 && __builtin_mul_overflow(b, b, &b)) fail(e.pos, "integer overflow");
        }
        return Value::integer(x);
      }
      return Value::number(std::pow(lf, rf));
    }
    fail(e.pos, "unknown operator " + op);
  }

  Value eval_slice(const Expr& e, Scope& sc) {
    Value obj = eval(*e.a[0], sc);
    auto opt = [&](int k) -> std::optional<int64_t> {
      if (!e.a[k]) return std::nullopt;
      Value v = eval(*e.a[k], sc);
      if (v.is_none()) return std::nullopt;
      return to_int(v, e.a[k]->pos, "slice index");
    };
    std::optional<int64_t> start = opt(1), stop = opt(2), step_o = opt(3);
    int64_t step = step_o.value_or(1);
    if (step == 0) fail(e.pos, "slice step cannot be zero");
    List items;
    bool is_str = obj.is_str();
    if (is_str) {
      for (auto& c : chars_of(obj.s)) items.push_back(Value::string(c));
    } else if (obj.is_list()) {
      items = *obj.list;
    } else {
      fail(e.pos, "'" + type_name(obj) + "' object is not subscriptable");
    }
    int64_t n = static_cast<int64_t>(items.size());
    auto norm = [&](std::optional<int64_t> x, int64_t def_pos, int64_t def_neg) {
      if (!x) return step > 0 ? def_pos : def_neg;
      int64_t v = *x;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    int64_t a = norm(start, 0, n - 1), b = norm(stop, n, -1);
    List out;
    if (step > 0)
      for (int64_t k = a; k < b; k += step) out.push_back(items[k]);
    else
      for (int64_t k = a; k > b; k += step) out.push_back(items[k]);
    if (is_str) {
      std::string s;
      for (auto& v : out) s += v.s;
      return Value::string(s);
    }
    return Value::make_list(std::move(out));
  }

  Value get_item(const Value& obj, const Value& idx, size_t pos) {
    switch (obj.type) {
      case Value::kUndefined:
        fail(pos, "'" + obj.s + "' is undefined");
      case Value::kMap: {
        if (idx.is_str()) {
          if (const Value* v = obj.map->find(idx.s)) return *v;
          return method_or_undefined(obj, idx.s);
        }
        return Value::undefined();
      }
      case Value::kList:
      case Value::kStr: {
        if (!idx.is_number()) {
          if (idx.is_str()) return method_or_undefined(obj, idx.s);
          return Value::undefined();
        }
        int64_t k = to_int(idx, pos, "index");
        if (obj.is_list()) {
          int64_t n = static_cast<int64_t>(obj.list->size());
          if (k < 0) k += n;
          if (k < 0 || k >= n) return Value::undefined("[" + std::to_string(k) + "]");
          return (*obj.list)[k];
        }
        auto cs = chars_of(obj.s);
        int64_t n = static_cast<int64_t>(cs.size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined();
        return Value::string(cs[k]);
      }
      default:
        return Value::undefined();
    }
  }

  Value get_attr(const Value& obj, const std::string& name, size_t pos) {
    if (obj.is_undefined()) fail(pos, "'" + obj.s + "' is undefined");
    // Jinja2 tries the Python attribute first (so dict.items is the method), then the item.
    Value m = method_or_undefined(obj, name);
    if (!m.is_undefined()) return m;
    if (obj.is_map()) {
      if (const Value* v = obj.map->find(name)) return *v;
    }
    return Value::undefined(name);
  }

  // Python methods of str, dict and list that templates call, bound to `obj`.
  Value method_or_undefined(const Value& obj, const std::string& name) {
    static const char* str_methods[] = {
        "startswith", "endswith", "split",      "rsplit",  "strip",      "lstrip",  "rstrip",
        "replace",    "upper",    "lower",      "title",   "capitalize", "find",    "rfind",
        "count",      "join",     "format",     "isdigit", "isalpha",    "isspace", "isalnum",
        "islower",    "isupper",  "splitlines", "index"};
    static const char* map_methods[] = {"items", "keys", "values", "get"};
    static const char* list_methods[] = {"index", "count"};
    auto has = [&](auto& arr) {
      for (const char* m : arr)
        if (name == m) return true;
      return false;
    };
    if ((obj.is_str() && has(str_methods)) ||
        (obj.is_map() && !obj.map->is_namespace && has(map_methods)) ||
        (obj.is_list() && has(list_methods))) {
      Interpreter* self = this;
      Value bound = obj;
      return Value::function(
          [self, bound, name](const CallArgs& a) { return self->call_method(bound, name, a); });
    }
    return Value::undefined(name);
  }

  size_t call_pos_ = 0;  // position of the call being evaluated, for errors inside builtins

  Value call_method(const Value& obj, const std::string& name, const CallArgs& a) {
    size_t pos = call_pos_;
    auto arg_str = [&](size_t i, const char* kw) -> const Value* {
      const Value* v = a.get(i, kw);
      if (v && !v->is_str() && !v->is_none())
        fail(pos, name + "() argument must be str, not " + type_name(*v));
      return v;
    };
    if (obj.is_str()) {
      const std::string& s = obj.s;
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.get(0, "prefix");
        if (!p) fail(pos, name + "() takes at least 1 argument");
        List opts = p->is_list() ? *p->list : List{*p};
        for (const auto& o : opts) {
          if (!o.is_str()) fail(pos, name + "() argument must be str or a tuple of str");
          bool hit = name == "startswith"
                         ? s.compare(0, o.s.size(), o.s) == 0
                         : s.size() >= o.s.size() &&
                               s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
          if (hit) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split" || name == "rsplit") {
        const Value* sep = arg_str(0, "sep");
        const Value* ms = a.get(1, "maxsplit");
        int64_t maxsplit = ms ? to_int(*ms, pos, "maxsplit") : -1;
        if (name == "rsplit" && maxsplit >= 0) {
          // rsplit with a limit: split fully, then join the leading parts back.
          auto parts = py_split(s, sep, -1);
          if (static_cast<int64_t>(parts.size()) > maxsplit + 1 && sep && sep->is_str()) {
            size_t keep = parts.size() - maxsplit;
            std::string head;
            for (size_t k = 0; k < keep; ++k) head += (k ? sep->s : "") + parts[k];
            std::vector<std::string> r{head};
            r.insert(r.end(), parts.begin() + keep, parts.end());
            parts = r;
          }
          List out;
          for (auto& p : parts) out.push_back(Value::string(p));
          return Value::make_list(out);
        }
        List out;
        for (auto& p : py_split(s, sep, maxsplit)) out.push_back(Value::string(p));
        return Value::make_list(out);
      }
      if (name == "splitlines") {
        List out;
        size_t st = 0;
        for (size_t k = 0; k < s.size(); ++k)
          if (s[k] == '\n' || s[k] == '\r') {
            out.push_back(Value::string(s.substr(st, k - st)));
            if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
            st = k + 1;
          }
        if (st < s.size()) out.push_back(Value::string(s.substr(st)));
        return Value::make_list(out);
      }
      if (name == "strip") return Value::string(py_strip(s, arg_str(0, "chars"), true, true));
      if (name == "lstrip") return Value::string(py_strip(s, arg_str(0, "chars"), true, false));
      if (name == "rstrip") return Value::string(py_strip(s, arg_str(0, "chars"), false, true));
      if (name == "replace") {
        const Value* from = a.get(0, "old");
        const Value* to = a.get(1, "new");
        if (!from || !to || !from->is_str() || !to->is_str())
          fail(pos, "replace() takes two string arguments");
        const Value* c = a.get(2, "count");
        return Value::string(py_replace(s, from->s, to->s, c ? to_int(*c, pos, "count") : -1));
      }
      if (name == "upper") return Value::string(ascii_upper(s));
      if (name == "lower") return Value::string(ascii_lower(s));
      if (name == "title") return Value::string(py_title(s));
      if (name == "capitalize") {
        std::string r = ascii_lower(s);
        if (!r.empty()) r[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(r[0])));
        return Value::string(r);
      }
      if (name == "find" || name == "rfind" || name == "index") {
        const Value* sub = arg_str(0, "sub");
        if (!sub || !sub->is_str()) fail(pos, name + "() takes a string");
        size_t p = name == "rfind" ? s.rfind(sub->s) : s.find(sub->s);
        if (p == std::string::npos) {
          if (name == "index") fail(pos, "substring not found");
          return Value::integer(-1);
        }
        return Value::integer(static_cast<int64_t>(str_len(s.substr(0, p))));
      }
      if (name == "count") {
        const Value* sub = arg_str(0, "sub");
        if (!sub || !sub->is_str()) fail(pos, "count() takes a string");
        if (sub->s.empty()) return Value::integer(static_cast<int64_t>(str_len(s) + 1));
        int64_t n = 0;
        for (size_t p = s.find(sub->s); p != std::string::npos;
             p = s.find(sub->s, p + sub->s.size()))
          ++n;
        return Value::integer(n);
      }
      if (name == "join") {
        const Value* it = a.get(0, "iterable");
        if (!it) fail(pos, "join() takes one argument");
        std::string r;
        bool first = true;
        for (const auto& x : iterate(*it, pos)) {
          if (!x.is_str())
            fail(pos, "sequence item: expected str instance, " + type_name(x) + " found");
          r += (first ? "" : s) + x.s;
          first = false;
        }
        return Value::string(r);
      }
      if (name == "format") {
        // Positional {} and {0} only: enough for the templates that use it.
        std::string r;
        size_t auto_idx = 0;
        for (size_t k = 0; k < s.size(); ++k) {
          if (s[k] == '{' && k + 1 < s.size() && s[k + 1] == '{') {
            r += '{';
            ++k;
          } else if (s[k] == '}' && k + 1 < s.size() && s[k + 1] == '}') {
            r += '}';
            ++k;
          } else if (s[k] == '{') {
            size_t e = s.find('}', k);
            if (e == std::string::npos) fail(pos, "format(): unmatched '{'");
            std::string field = s.substr(k + 1, e - k - 1);
            const Value* v = nullptr;
            if (field.empty())
              v = a.get(auto_idx++, "");
            else if (std::isdigit(static_cast<unsigned char>(field[0])))
              v = field.size() < 6 && std::all_of(field.begin(), field.end(), ::isdigit)
                      ? a.get(std::stoul(field), "")
                      : nullptr;
            else
              v = a.kwarg(field);
            if (!v) fail(pos, "format(): no value for {" + field + "}");
            r += to_str(*v);
            k = e;
          } else {
            r += s[k];
          }
        }
        return Value::string(r);
      }
      auto all_of = [&](auto pred) {
        if (s.empty()) return Value::boolean(false);
        for (unsigned char c : s)
          if (!pred(c)) return Value::boolean(false);
        return Value::boolean(true);
      };
      if (name == "isdigit") return all_of([](unsigned char c) { return std::isdigit(c) != 0; });
      if (name == "isalpha")
        return all_of([](unsigned char c) { return std::isalpha(c) != 0 || c >= 0x80; });
      if (name == "isalnum")
        return all_of([](unsigned char c) { return std::isalnum(c) != 0 || c >= 0x80; });
      if (name == "isspace") return all_of([](unsigned char c) { return std::isspace(c) != 0; });
      if (name == "islower") return Value::boolean(ascii_lower(s) == s && ascii_upper(s) != s);
      if (name == "isupper") return Value::boolean(ascii_upper(s) == s && ascii_lower(s) != s);
    }
    if (obj.is_map()) {
      const Map& m = *obj.map;
      if (name == "items") {
        List out;
        for (const auto& [k, v] : m.items) out.push_back(Value::make_tuple({Value::string(k), v}));
        return Value::make_list(out);
      }
      if (name == "keys") {
        List out;
        for (const auto& kv : m.items) out.push_back(Value::string(kv.first));
        return Value::make_list(out);
      }
      if (name == "values") {
        List out;
        for (const auto& kv : m.items) out.push_back(kv.second);
        return Value::make_list(out);
      }
      if (name == "get") {
        const Value* k = a.get(0, "key");
        if (!k) fail(pos, "get() takes at least 1 argument");
        if (k->is_str())
          if (const Value* v = m.find(k->s)) return *v;
        const Value* d = a.get(1, "default");
        return d ? *d : Value::none();
      }
    }
    if (obj.is_list()) {
      const Value* x = a.get(0, "value");
      if (!x) fail(pos, name + "() takes one argument");
      int64_t n = 0, k = 0;
      for (const auto& v : *obj.list) {
        if (values_equal(v, *x)) {
          if (name == "index") return Value::integer(k);
          ++n;
        }
        ++k;
      }
      if (name == "index") fail(pos, "value is not in list");
      return Value::integer(n);
    }
    fail(pos, "'" + type_name(obj) + "' object has no attribute '" + name + "'");
  }

  CallArgs eval_args(const Expr& e, Scope& sc, size_t first) {
    CallArgs args;
    for (size_t k = first; k < e.a.size(); ++k) args.pos.push_back(eval(*e.a[k], sc));
    for (const auto& [k, x] : e.kw) args.kw.emplace_back(k, eval(*x, sc));
    return args;
  }

  Value eval_call(const Expr& e, Scope& sc) {
    Value fn = eval(*e.a[0], sc);
    CallArgs args = eval_args(e, sc, 1);
    if (fn.type != Value::kFunc) {
      if (fn.is_undefined()) fail(e.pos, "'" + fn.s + "' is undefined");
      fail(e.pos, "'" + type_name(fn) + "' object is not callable");
    }
    size_t saved = call_pos_;
    call_pos_ = e.pos;
    Value r;
    try {
      r = (*fn.func)(args);
    } catch (const RaiseException& x) {
      fail(e.pos, "raise_exception: " + x.msg);
    } catch (TemplateError& t) {
      if (t.pos == kHere) t.pos = e.pos;
      throw;
    }
    call_pos_ = saved;
    return r;
  }

  // ------------------------------------------------------------ filters

  Value apply_filter(const Expr& f, const Value& v, Scope& sc) {
    CallArgs a = eval_args(f, sc, 1);
    const std::string& name = f.name;
    size_t pos = f.pos;
    size_t saved = call_pos_;
    call_pos_ = pos;
    Value r;
    try {
      r = filter(name, v, a, pos, sc);
    } catch (TemplateError& t) {
      if (t.pos == kHere) t.pos = pos;
      throw;
    }
    call_pos_ = saved;
    return r;
  }

  Value attr_of(const Value& v, const std::string& path, size_t pos) {
    Value cur = v;
    size_t st = 0;
    while (true) {
      size_t d = path.find('.', st);
      std::string part = path.substr(st, d == std::string::npos ? std::string::npos : d - st);
      if (cur.is_undefined()) return cur;
      if (!part.empty() && std::isdigit(static_cast<unsigned char>(part[0])))
        cur = part.size() < 12 && std::all_of(part.begin(), part.end(), ::isdigit)
                  ? get_item(cur, Value::integer(std::stoll(part)), pos)
                  : Value::undefined(part);
      else
        cur = cur.is_map() ? (cur.map->find(part) ? *cur.map->find(part) : Value::undefined(part))
                           : get_attr(cur, part, pos);
      if (d == std::string::npos) return cur;
      st = d + 1;
    }
  }

  Value filter(const std::string& name, const Value& v, const CallArgs& a, size_t pos, Scope& sc) {
    if (name == "safe") return v;  // no autoescaping, so nothing to mark
    if (name == "trim") {
      if (!v.is_str()) return Value::string(py_strip(to_str(v), a.get(0, "chars"), true, true));
      return Value::string(py_strip(v.s, a.get(0, "chars"), true, true));
    }
    if (name == "tojson") {
      const Value* ind = a.get(0, "indent");
      int indent = ind && !ind->is_none() ? static_cast<int>(to_int(*ind, pos, "indent")) : -1;
      std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
      if (const Value* sp = a.kwarg("separators")) {
        if (sp->is_list() && sp->list->size() == 2) {
          isep = (*sp->list)[0].s;
          ksep = (*sp->list)[1].s;
        }
      }
      const Value* sk = a.kwarg("sort_keys");
      return Value::string(to_json(v, indent, isep, ksep, sk && sk->truthy()));
    }
    if (name == "length" || name == "count") {
      switch (v.type) {
        case Value::kStr:
          return Value::integer(static_cast<int64_t>(str_len(v.s)));
        case Value::kList:
          return Value::integer(static_cast<int64_t>(v.list->size()));
        case Value::kMap:
          return Value::integer(static_cast<int64_t>(v.map->items.size()));
        case Value::kUndefined:
          return Value::integer(0);
        default:
          fail(pos, "object of type '" + type_name(v) + "' has no len()");
      }
    }
    if (name == "default" || name == "d") {
      const Value* def = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      if (use) return def ? *def : Value::string("");
      return v;
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      std::string r;
      bool first = true;
      for (const auto& x : iterate(v, pos)) {
        Value item = attr ? attr_of(x, to_str(*attr), pos) : x;
        r += (first ? "" : (sep ? to_str(*sep) : "")) + to_str(item);
        first = false;
      }
      return Value::string(r);
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::make_list();
      if (!v.is_map()) fail(pos, "items filter expects a mapping, got " + type_name(v));
      return call_method(v, "items", {});
    }
    if (name == "dictsort") {
      if (!v.is_map()) fail(pos, "dictsort expects a mapping");
      auto items = v.map->items;
      std::stable_sort(items.begin(), items.end(), [](auto& x, auto& y) {
        return ascii_lower(x.first) < ascii_lower(y.first);
      });
      List out;
      for (auto& [k, x] : items) out.push_back(Value::make_tuple({Value::string(k), x}));
      return Value::make_list(out);
    }
    if (name == "string") return Value::string(to_str(v));
    if (name == "lower") return Value::string(ascii_lower(to_str(v)));
    if (name == "upper") return Value::string(ascii_upper(to_str(v)));
    if (name == "title") return Value::string(py_title(to_str(v)));
    if (name == "capitalize") return call_method(Value::string(to_str(v)), "capitalize", {});
    if (name == "replace") {
      const Value* from = a.get(0, "old");
      const Value* to = a.get(1, "new");
      if (!from || !to) fail(pos, "replace needs two arguments");
      const Value* c = a.get(2, "count");
      return Value::string(
          py_replace(to_str(v), to_str(*from), to_str(*to), c ? to_int(*c, pos, "count") : -1));
    }
    if (name == "first" || name == "last") {
      List items = iterate(v, pos);
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::make_list(iterate(v, pos));
    if (name == "reverse") {
      if (v.is_str()) {
        auto cs = chars_of(v.s);
        std::string r;
        for (auto it = cs.rbegin(); it != cs.rend(); ++it) r += *it;
        return Value::string(r);
      }
      List items = iterate(v, pos);
      std::reverse(items.begin(), items.end());
      return Value::make_list(items);
    }
    if (name == "unique") {
      List out;
      for (const auto& x : iterate(v, pos)) {
        bool seen = false;
        for (const auto& y : out) seen = seen || values_equal(x, y);
        if (!seen) out.push_back(x);
      }
      return Value::make_list(out);
    }
    if (name == "sort") {
      const Value* rev = a.get(0, "reverse");
      const Value* attr = a.get(2, "attribute");
      List items = iterate(v, pos);
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        Value kx = attr ? attr_of(x, to_str(*attr), pos) : x;
        Value ky = attr ? attr_of(y, to_str(*attr), pos) : y;
        if (kx.is_str() && ky.is_str()) {
          kx.s = ascii_lower(kx.s);
          ky.s = ascii_lower(ky.s);
        }
        return compare_values(kx, ky, pos) < 0;
      });
      if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
      return Value::make_list(items);
    }
    if (name == "map") {
      List out;
      const Value* attr = a.kwarg("attribute");
      for (const auto& x : iterate(v, pos)) {
        if (attr) {
          Value r = attr_of(x, to_str(*attr), pos);
          if (r.is_undefined())
            if (const Value* d = a.kwarg("default")) r = *d;
          out.push_back(r);
        } else {
          if (a.pos.empty()) fail(pos, "map needs a filter name or attribute=");
          CallArgs rest;
          rest.pos.assign(a.pos.begin() + 1, a.pos.end());
          out.push_back(filter(to_str(a.pos[0]), x, rest, pos, sc));
        }
      }
      return Value::make_list(out);
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      bool by_attr = name == "selectattr" || name == "rejectattr";
      bool keep_if = name == "select" || name == "selectattr";
      size_t k0 = by_attr ? 1 : 0;
      if (by_attr && a.pos.empty()) fail(pos, name + " needs an attribute name");
      List out;
      for (const auto& x : iterate(v, pos)) {
        Value item = by_attr ? attr_of(x, to_str(a.pos[0]), pos) : x;
        bool r;
        if (a.pos.size() > k0) {
          std::vector<Value> targs(a.pos.begin() + k0 + 1, a.pos.end());
          r = test(to_str(a.pos[k0]), item, targs, pos);
        } else {
          r = item.truthy();
        }
        if (r == keep_if) out.push_back(x);
      }
      return Value::make_list(out);
    }
    if (name == "abs") {
      if (v.type == Value::kFloat) return Value::number(std::fabs(v.f));
      int64_t x = to_int(v, pos, "abs");
      if (x == INT64_MIN) fail(pos, "integer overflow");
      return Value::integer(x < 0 ? -x : x);
    }
    if (name == "int") {
      if (v.is_str()) {
        try {
          size_t used = 0;
          std::string t = py_strip(v.s, nullptr, true, true);
          long long x = std::stoll(t, &used);
          if (used == t.size()) return Value::integer(x);
          double d = std::stod(t);
          if (!(std::fabs(d) < 9.2e18)) throw std::out_of_range(t);
          return Value::integer(static_cast<int64_t>(d));
        } catch (...) {
          const Value* d = a.get(0, "default");
          return d ? *d : Value::integer(0);
        }
      }
      if (v.is_number()) return Value::integer(to_int(v, pos, "int"));
      const Value* d = a.get(0, "default");
      return d ? *d : Value::integer(0);
    }
    if (name == "float") {
      if (v.is_number()) return Value::number(v.as_double());
      if (v.is_str()) {
        try {
          return Value::number(std::stod(v.s));
        } catch (...) {
        }
      }
      const Value* d = a.get(0, "default");
      return d ? *d : Value::number(0);
    }
    if (name == "round") {
      const Value* p = a.get(0, "precision");
      int64_t prec = p ? to_int(*p, pos, "precision") : 0;
      double m = std::pow(10.0, static_cast<double>(prec));
      return Value::number(std::nearbyint(v.as_double() * m) / m);
    }
    if (name == "sum") {
      const Value* attr = a.get(0, "attribute");
      const Value* start = a.get(1, "start");
      Value acc = start ? *start : Value::integer(0);
      for (const auto& x : iterate(v, pos)) {
        Value item = attr ? attr_of(x, to_str(*attr), pos) : x;
        if (acc.type == Value::kFloat || item.type == Value::kFloat)
          acc = Value::number(acc.as_double() + item.as_double());
        else
          acc = Value::integer(to_int(acc, pos, "sum") + to_int(item, pos, "sum"));
      }
      return acc;
    }
    if (name == "min" || name == "max") {
      List items = iterate(v, pos);
      if (items.empty()) return Value::undefined(name);
      Value best = items[0];
      for (const auto& x : items) {
        int c = compare_values(x, best, pos);
        if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = x;
      }
      return best;
    }
    if (name == "indent") {
      const Value* w = a.get(0, "width");
      const Value* first = a.get(1, "first");
      const Value* blank = a.get(2, "blank");
      std::string pad =
          w && w->is_str() ? w->s : std::string(w ? to_int(*w, pos, "width") : 4, ' ');
      std::string s = to_str(v), out;
      std::vector<std::string> ls;
      size_t st = 0;
      for (size_t k = 0; k <= s.size(); ++k)
        if (k == s.size() || s[k] == '\n') {
          ls.push_back(s.substr(st, k - st));
          st = k + 1;
        }
      for (size_t k = 0; k < ls.size(); ++k) {
        if (k) out += "\n";
        bool do_pad =
            (k > 0 || (first && first->truthy())) && (!ls[k].empty() || (blank && blank->truthy()));
        out += (do_pad ? pad : "") + ls[k];
      }
      return Value::string(out);
    }
    if (name == "wordcount")
      return Value::integer(static_cast<int64_t>(py_split(to_str(v), nullptr, -1).size()));
    if (name == "e" || name == "escape" || name == "forceescape") {
      std::string r;
      for (char c : to_str(v)) {
        switch (c) {
          case '&':
            r += "&amp;";
            break;
          case '<':
            r += "&lt;";
            break;
          case '>':
            r += "&gt;";
            break;
          case '"':
            r += "&#34;";
            break;
          case '\'':
            r += "&#39;";
            break;
          default:
            r += c;
        }
      }
      return Value::string(r);
    }
    if (name == "attr") {
      const Value* n = a.get(0, "name");
      if (!n) fail(pos, "attr needs a name");
      return get_attr(v, to_str(*n), pos);
    }
    if (name == "batch" || name == "slice" || name == "groupby")
      fail(pos, "filter '" + name + "' is not supported");
    fail(pos, "unknown filter '" + name + "'");
  }

  // ------------------------------------------------------------ tests

  bool apply_test(const Expr& e, Scope& sc) {
    // `defined` must not fail on a chain through undefined values.
    Value v;
    if (e.name == "defined" || e.name == "undefined") {
      try {
        v = eval(*e.a[0], sc);
      } catch (const TemplateError&) {
        v = Value::undefined();
      }
    } else {
      v = eval(*e.a[0], sc);
    }
    std::vector<Value> args;
    for (size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k], sc));
    return test(e.name, v, args, e.pos);
  }

  bool test(const std::string& name, const Value& v, const std::vector<Value>& args, size_t pos) {
    auto arg = [&](size_t k) -> const Value& {
      if (k >= args.size()) fail(pos, "test '" + name + "' needs an argument");
      return args[k];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_str();
    if (name == "mapping") return v.is_map();
    if (name == "boolean") return v.type == Value::kBool;
    if (name == "true") return v.type == Value::kBool && v.b;
    if (name == "false") return v.type == Value::kBool && !v.b;
    if (name == "integer") return v.type == Value::kInt;
    if (name == "float") return v.type == Value::kFloat;
    if (name == "number") return v.is_number();
    if (name == "iterable") return v.is_list() || v.is_map() || v.is_str();
    if (name == "sequence") return v.is_list() || v.is_map() || v.is_str();
    if (name == "callable") return v.type == Value::kFunc;
    if (name == "odd") return to_int(v, pos, "value") % 2 != 0;
    if (name == "even") return to_int(v, pos, "value") % 2 == 0;
    if (name == "divisibleby") return to_int(v, pos, "value") % to_int(arg(0), pos, "divisor") == 0;
    if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg(0));
    if (name == "ne" || name == "!=") return !values_equal(v, arg(0));
    if (name == "lt" || name == "lessthan") return compare_values(v, arg(0), pos) < 0;
    if (name == "le") return compare_values(v, arg(0), pos) <= 0;
    if (name == "gt" || name == "greaterthan") return compare_values(v, arg(0), pos) > 0;
    if (name == "ge") return compare_values(v, arg(0), pos) >= 0;
    if (name == "in") return contains(arg(0), v, pos);
    if (name == "sameas") return values_equal(v, arg(0)) && v.type == arg(0).type;
    if (name == "lower") return v.is_str() && ascii_lower(v.s) == v.s;
    if (name == "upper") return v.is_str() && ascii_upper(v.s) == v.s;
    fail(pos, "unknown test '" + name + "'");
  }
};

std::pair<int, int> line_col(const std::string& src, size_t pos) {
  int line = 1, col = 1;
  for (size_t k = 0; k < pos && k < src.size(); ++k) {
    if (src[k] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(src[k]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return {line, col};
}

[[noreturn]] void rethrow(const std::string& src, const TemplateError& e, const char* stage) {
  auto [line, col] = line_col(src, e.pos);
  throw Error(std::string("chat template ") + stage + " at line " + std::to_string(line) +
              ", column " + std::to_string(col) + ": " + e.msg);
}

void add_globals(Scope& g) {
  g.vars["raise_exception"] = Value::function([](const CallArgs& a) -> Value {
    throw RaiseException{a.pos.empty() ? "" : to_str(a.pos[0])};
  });
  g.vars["range"] = Value::function([](const CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    auto num = [&](size_t k) {
      if (a.pos[k].type == Value::kInt) return a.pos[k].i;
      if (a.pos[k].type == Value::kBool) return static_cast<int64_t>(a.pos[k].b);
      fail_here("range() arguments must be integers");
    };
    if (a.pos.size() == 1)
      stop = num(0);
    else if (a.pos.size() >= 2) {
      start = num(0);
      stop = num(1);
      if (a.pos.size() >= 3) step = num(2);
    }
    if (step == 0) fail_here("range() step must not be zero");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      out.push_back(Value::integer(k));
      if (out.size() > 1000000) fail_here("range() too large");
    }
    return Value::make_list(out);
  });
  g.vars["namespace"] = Value::function([](const CallArgs& a) {
    Value ns = Value::make_map();
    ns.map->is_namespace = true;
    for (const auto& p : a.pos)
      if (p.is_map())
        for (const auto& [k, v] : p.map->items) ns.map->set(k, v);
    for (const auto& [k, v] : a.kw) ns.map->set(k, v);
    return ns;
  });
  g.vars["dict"] = Value::function([](const CallArgs& a) {
    Value d = Value::make_map();
    for (const auto& p : a.pos)
      if (p.is_map())
        for (const auto& [k, v] : p.map->items) d.map->set(k, v);
    for (const auto& [k, v] : a.kw) d.map->set(k, v);
    return d;
  });
  g.vars["strftime_now"] = Value::function([](const CallArgs& a) {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    std::string fmt = a.pos.empty() ? "%Y-%m-%d" : to_str(a.pos[0]);
    size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace

std::string render_program(const Program& p, const Value& context) {
  Scope globals;
  add_globals(globals);
  if (context.is_map())
    for (const auto& [k, v] : context.map->items) globals.vars[k] = v;
  Scope top;
  top.parent = &globals;
  std::string out;
  Interpreter in(p, top);
  try {
    Flow f = Flow::kNormal;
    in.exec_body(p.body, top, out, f);
  } catch (const TemplateError& e) {
    rethrow(p.source, e, "error");
  }
  return out;
}

}  // namespace jinja

namespace {

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

JinjaTemplate JinjaTemplate::parse(std::string source) {
  auto prog = std::make_shared<jinja::Program>();
  prog->source = normalize_source(std::move(source));
  try {
    jinja::Lexer lx(prog->source);
    jinja::Parser ps(lx.run());
    prog->body = ps.parse_all();
  } catch (const jinja::TemplateError& e) {
    jinja::rethrow(prog->source, e, "syntax error");
  }
  JinjaTemplate t;
  t.prog_ = prog;
  return t;
}

}  // namespace sieve::text
