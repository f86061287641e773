#include "text/jinja/runtime.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/string.h"

namespace sieve::text::jinja {

namespace {

// Control flow of {% break %} / {% continue %}.
enum class Flow { kNormal, kBreak, kContinue };

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
    try {
      return (*fn.func)(args);
    } catch (const RaiseException& x) {
      fail(e.pos, "raise_exception: " + x.msg);
    } catch (TemplateError& t) {
      if (t.pos == kHere) t.pos = e.pos;
      throw;
    }
  }

  // ------------------------------------------------------------ filters

  Value apply_filter(const Expr& f, const Value& v, Scope& sc) {
    CallArgs a = eval_args(f, sc, 1);
    try {
      return filter(f.name, v, a, f.pos);
    } catch (TemplateError& t) {
      if (t.pos == kHere) t.pos = f.pos;
      throw;
    }
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
};

}  // namespace

std::string render_program(const Program& p, const Value& context) {
  Scope globals;
  add_globals(globals.vars);
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

}  // namespace sieve::text::jinja
