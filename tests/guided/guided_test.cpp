// Guided decoding: the JSON automaton against JSON texts and their prefixes, the masks over a
// vocabulary, and the schema, regex and grammar compilers walked byte by byte.
#include "guided/guided.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <random>

#include "byte_walk.h"
#include "core/error.h"

namespace sieve::guided {
namespace {

bool accepts_prefix(const std::string& s) {
  JsonPrefix p;
  return p.push(s);
}
bool accepts_complete(const std::string& s) {
  JsonPrefix p;
  return p.push(s) && p.complete();
}

TEST(Guided, JsonAutomatonAcceptsObjectsAndTheirPrefixes) {
  for (const std::string ok : {R"({})", R"({"a":1})", R"({ "a" : [1, -2.5e+3, 0.0, true, false, null, "x\"\u00e9\n"] , "b":{"c":{}} })",
                               R"({"k":"caf\u00e9 \\ /","n":-0,"e":1E5,"arr":[[],[{}]]})", "{\"utf8\":\"\xc3\xa9\"}"}) {
    EXPECT_TRUE(accepts_complete(ok)) << ok;
    for (size_t i = 0; i < ok.size(); ++i) EXPECT_TRUE(accepts_prefix(ok.substr(0, i))) << ok.substr(0, i);
    EXPECT_TRUE(nlohmann::json::parse(ok).is_object()) << ok;
  }
  for (const std::string bad : {R"([1])", R"("s")", R"({a:1})", R"({"a" 1})", R"({"a":01})", R"({"a":1,})", R"({"a":tru })",
                                R"({"a":"\x"})", R"({"a":1}})", R"({} {})", R"({"a":.5})", R"({"a":1.})", R"({"a":-})",
                                "{\"a\":\"\x01\"}", R"({"a":[1 2]})", R"({"a":1e})", R"({"a":"\u12G4"})", R"( {})"}) {
    EXPECT_FALSE(accepts_complete(bad)) << bad;
  }
  // Strings are UTF-8: continuation bytes where they belong only.
  EXPECT_TRUE(accepts_complete("{\"a\":\"\xe2\x82\xac\xf0\x9f\x98\x80\"}"));
  EXPECT_FALSE(accepts_prefix("{\"\x80"));
  EXPECT_FALSE(accepts_prefix("{\"\xc3\""));
  EXPECT_FALSE(accepts_prefix("{\"\xff"));
  EXPECT_TRUE(accepts_prefix("{\"\xe2\x82"));
  EXPECT_FALSE(accepts_prefix("{\"\xe0\x80"));      // overlong
  EXPECT_FALSE(accepts_prefix("{\"\xed\xa0"));      // a surrogate
  EXPECT_FALSE(accepts_prefix("{\"\xf4\x90"));      // past U+10FFFF
  EXPECT_FALSE(accepts_prefix("{\"\xc0\xaf"));      // overlong lead
  // Whitespace runs are bounded, so a model cannot idle on it forever.
  EXPECT_TRUE(accepts_prefix("{" + std::string(16, ' ')));
  EXPECT_FALSE(accepts_prefix("{" + std::string(17, ' ')));
  // Nesting is bounded too.
  EXPECT_TRUE(accepts_prefix("{\"a\":" + std::string(63, '[')));
  EXPECT_FALSE(accepts_prefix("{\"a\":" + std::string(64, '[')));
}

// A small vocabulary: what each mask allows.
TEST(Guided, MasksOverAVocabulary) {
  auto vocab = std::make_shared<TokenBytes>(TokenBytes{"{", "}", "\"a\"", ":", "1", " ", "x", "", "\"b"});
  const std::vector<int32_t> eos = {7};
  auto allowed = [&](const OutputConstraint::State& st) {
    std::vector<float> l(vocab->size(), 1.0f);
    st.mask(l, eos);
    std::string s;
    for (size_t i = 0; i < l.size(); ++i)
      if (std::isfinite(l[i])) s += std::to_string(i);
    return s;
  };
  auto js = json_object_constraint(vocab)->start();
  EXPECT_EQ(allowed(*js), "0");  // "{" first, no whitespace before it
  for (int t : {0, 2, 3, 4}) js->accept(t);  // {"a":1
  EXPECT_EQ(allowed(*js), "145");           // "}", "1" (more digits), " "
  js->accept(1);
  EXPECT_TRUE(js->complete());
  EXPECT_EQ(allowed(*js), "7");  // only the end
  auto ch = choice_constraint(vocab, {"{}", "\"a\":1"})->start();
  EXPECT_EQ(allowed(*ch), "02");
  ch->accept(2);
  EXPECT_EQ(allowed(*ch), "3");
  ch->accept(3);
  ch->accept(4);
  EXPECT_TRUE(ch->complete());
  EXPECT_EQ(allowed(*ch), "7");
  EXPECT_THROW(choice_constraint(vocab, {}), Error);
  EXPECT_THROW(choice_constraint(vocab, {"a", ""}), Error);
}

// Inside a string the mask takes plain text tokens without walking them: it must agree with the
// walk for every token (quotes, escapes, control bytes, multi-byte UTF-8, mixed).
TEST(Guided, StringShortcutAgreesWithTheWalk) {
  auto vocab = std::make_shared<TokenBytes>(TokenBytes{"{", "\"", "abc", " x", "a\"", "\\n", "\\q", "\x01", "\xc3\xa9", "\"}",
                                                       "\":", "", "\\u00e9", "ok\"}", "\xe2\x82", "\xac", "x\xc3"});
  auto st = json_object_constraint(vocab)->start();
  st->accept(0);
  st->accept(1);  // {"  : inside a key
  std::vector<float> l(vocab->size(), 1.0f);
  st->mask(l, {});
  for (size_t t = 0; t < vocab->size(); ++t) {
    JsonPrefix p;
    const bool walk = !(*vocab)[t].empty() && p.push("{\"") && p.push((*vocab)[t]);
    EXPECT_EQ(std::isfinite(l[t]), walk) << t << " " << (*vocab)[t];
  }
}

// JSON schema and the others: a byte vocabulary walks a text through the mask, byte by byte.
using SchemaCheck = testing::ByteWalk;

TEST(Guided, JsonSchemaTexts) {
  SchemaCheck k;
  auto c = json_schema_constraint(k.vocab, R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"score":{"type":["number","null"]},
      "tags":{"type":"array","items":{"type":"string"},"maxItems":2},
      "kind":{"enum":["cat","dog",3]},"ok":{"type":"boolean"},"sub":{"$ref":"#/$defs/Sub"}},
      "required":["name","age"],
      "$defs":{"Sub":{"type":"object","properties":{"x":{"const":1}},"required":["x"]}}})");
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":30})"), 1);
  EXPECT_EQ(k.walk(c, R"({"name":"\u00e9\n","age":-0,"score":1.5e-3,"tags":["a","b"],"kind":3,"ok":false,"sub":{"x":1}})"), 1);
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":30,"score":null,"kind":"dog"})"), 1);
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":3)"), 0);
  EXPECT_EQ(k.walk(c, R"({"age":30})"), -1);                  // name is required and comes first
  EXPECT_EQ(k.walk(c, R"({"name":"Al"})"), -1);               // age is required
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":1.5})"), -1);     // an integer
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":1,"x":1})"), -1); // no other keys
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":1,"tags":["a","b","c"]})"), -1);  // maxItems
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":1,"kind":"cow"})"), -1);
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":1,"ok":fals)"), 0);
  EXPECT_EQ(k.walk(c, R"({ "name":"Al","age":1})"), -1);     // compact JSON
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":1,"sub":{"x":2}})"), -1);
  EXPECT_EQ(k.walk(c, R"({"name":"Al","age":1,"age":2})"), -1);  // properties once, in order
  EXPECT_EQ(k.walk(c, "{\"name\":\"\xc3\xa9\xe2\x82\xac\",\"age\":1}"), 1);  // UTF-8 text
  EXPECT_EQ(k.walk(c, "{\"name\":\"\xc3("), -1);                                  // a broken character
  auto arr = json_schema_constraint(k.vocab, R"({"type":"array","items":{"type":"number"},"minItems":1})");
  EXPECT_EQ(k.walk(arr, "[]"), -1);
  EXPECT_EQ(k.walk(arr, "[1,2.5,-3e2]"), 1);
  auto empty = json_schema_constraint(k.vocab, R"({"type":"object","properties":{"a":{"type":"string"}}})");
  EXPECT_EQ(k.walk(empty, "{}"), 1);
  EXPECT_EQ(k.walk(empty, R"({"a":""})"), 1);
}

// What the automaton cannot follow goes through the grammar matcher: alternatives that start
// alike (a union of objects, integer or number) and recursive definitions (a tree).
TEST(Guided, JsonSchemaUnionsAndRecursionThroughTheGrammar) {
  SchemaCheck k;
  auto uni = json_schema_constraint(k.vocab, R"({"type":"object","properties":{"x":{"anyOf":[
      {"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
      {"type":"object","properties":{"b":{"type":"string"},"c":{"type":"boolean"}},"required":["c"]}]},
      "n":{"anyOf":[{"type":"integer"},{"type":"number"}]}},"required":["x"]})");
  EXPECT_EQ(k.walk(uni, R"({"x":{"a":1}})"), 1);
  EXPECT_EQ(k.walk(uni, R"({"x":{"b":"s","c":true},"n":2.5})"), 1);
  EXPECT_EQ(k.walk(uni, R"({"x":{"c":false},"n":-3})"), 1);
  EXPECT_EQ(k.walk(uni, R"({"x":{"b":"s"}})"), -1);  // c is required in that branch
  EXPECT_EQ(k.walk(uni, R"({"x":{"a":1,"c":true}})"), -1);
  EXPECT_EQ(k.walk(uni, R"({"n":1})"), -1);
  EXPECT_EQ(k.walk(uni, R"({"x":{"a":1)"), 0);
  auto tree = json_schema_constraint(k.vocab, R"({"$defs":{"N":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/N"},"maxItems":2}},"required":["v"]}},
      "$ref":"#/$defs/N"})");
  EXPECT_EQ(k.walk(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"), 1);
  EXPECT_EQ(k.walk(tree, R"({"v":1,"kids":[{"v":2},{"v":3},{"v":4}]})"), -1);  // maxItems
  EXPECT_EQ(k.walk(tree, R"({"kids":[]})"), -1);
  // String length bounds (characters; an escape is one).
  auto len = json_schema_constraint(k.vocab, R"({"type":"object","properties":{
      "name":{"type":"string","minLength":2,"maxLength":4},"tag":{"type":"string","minLength":1}},"required":["name"]})");
  EXPECT_EQ(k.walk(len, R"({"name":"ab"})"), 1);
  EXPECT_EQ(k.walk(len, R"({"name":"\u00e9x\n!"})"), 1);
  EXPECT_EQ(k.walk(len, R"({"name":"a"})"), -1);
  EXPECT_EQ(k.walk(len, R"({"name":"abcde"})"), -1);
  EXPECT_EQ(k.walk(len, R"({"name":"ab","tag":""})"), -1);
  EXPECT_EQ(k.walk(len, R"({"name":"ab","tag":"xyz"})"), 1);
  for (const auto& [schema, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type":"object","properties":{"a":{"type":"string","minLength":3,"maxLength":2}}})", "below minLength"},
           {R"({"type":"object","properties":{"a":{"type":"string","maxLength":300}}})", "above 256"},
           {R"({"type":"object","properties":{"a":{"type":"string","minLength":-1}}})", "non-negative"}}) {
    try {
      json_schema_constraint(k.vocab, schema);
      ADD_FAILURE() << schema << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << schema << ": " << e.what();
    }
  }
  // The grammar writer agrees with the automaton on what both follow.
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"},
      "c":{"enum":["x",1,null]},"d":{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3}},
      "required":["c"]})";
  auto direct = json_schema_constraint(k.vocab, schema);
  auto via = grammar_constraint(k.vocab, json_schema_grammar(schema));
  for (const char* text : {R"({"c":"x"})", R"({"a":"\u00e9\n","b":-0,"c":1,"d":[1.5e3]})", R"({"b":2,"c":null,"d":[1,2,3]})",
                           R"({"c":1,"d":[]})", R"({"c":1,"d":[1,2,3,4]})", R"({"b":1})", R"({"d":[1],"c":1})",
                           R"({"a":"x","c":"y"})", R"({"c":"x"} )", R"({"c":1,"b":01})", R"({"c":)"})
    EXPECT_EQ(k.walk(direct, text), k.walk(via, text)) << text;
}

TEST(Guided, JsonSchemaRefusesWhatItCannotFollow) {
  SchemaCheck k;
  for (const auto& [schema, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type":"string"})", "top level"},
           {R"({"type":"object","properties":{"a":{}}})", "without \"type\""},
           {R"({"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}})", "\"pattern\""},
           {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/Nope"}}})", "not defined"},
           {R"({"type":"object","required":["b"],"properties":{"a":{"type":"string"}}})", "\"b\""},
           {R"({"anyOf":[{"type":"object"},{"type":"string"}]})", "top level"},
           {R"({"type":"object","properties":{"a":{"anyOf":[{"type":"integer"},{"type":"string","pattern":"x"}]}}})", "\"pattern\""},
           {R"({"$defs":{"A":{"$ref":"#/$defs/A"}},"type":"object","properties":{"a":{"$ref":"#/$defs/A"}}})", "only refers to itself"},
           {"not json", "not valid JSON"}}) {
    try {
      json_schema_constraint(k.vocab, schema);
      ADD_FAILURE() << schema << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << schema << ": " << e.what();
    }
  }
}

TEST(Guided, RegexTexts) {
  SchemaCheck k;
  auto date = regex_constraint(k.vocab, R"(\d{4}-\d{2}-\d{2})");
  EXPECT_EQ(k.walk(date, "2026-12-05"), 1);
  EXPECT_EQ(k.walk(date, "2026-1"), 0);
  EXPECT_EQ(k.walk(date, "2026-1x"), -1);
  EXPECT_EQ(k.walk(date, "2026-12-055"), -1);  // matched in full
  auto alt = regex_constraint(k.vocab, R"(^(?:yes|no(pe)?|[A-Z][a-z]*!+)$)");
  for (const char* ok : {"yes", "no", "nope", "Hi!", "Q!!!"}) EXPECT_EQ(k.walk(alt, ok), 1) << ok;
  EXPECT_EQ(k.walk(alt, "nop"), 0);
  for (const char* bad : {"ye!", "hi!", "Hi", "nopee"}) EXPECT_NE(k.walk(alt, bad), 1) << bad;
  auto cls = regex_constraint(k.vocab, R"([^\s,]+(,[\w.-]{1,3})*\.?)");
  EXPECT_EQ(k.walk(cls, "ab,c.d,e-f."), 1);
  EXPECT_EQ(k.walk(cls, "a b"), -1);
  EXPECT_EQ(k.walk(cls, "a,abcd"), -1);
  // The request ends when nothing may follow: after "yes" nothing can, after "no" "pe" can.
  auto st = alt->start();
  for (char ch : std::string("yes")) st->accept(uint8_t(ch));
  EXPECT_TRUE(st->must_end());
  st = alt->start();
  for (char ch : std::string("no")) st->accept(uint8_t(ch));
  EXPECT_TRUE(st->complete());
  EXPECT_FALSE(st->must_end());
  for (const auto& [pattern, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"((a)\1)", "\\1"}, {"(?=a)b", "lookaround"}, {"a{3,1}", "n < m"}, {"(ab", "')'"}, {"*a", "nothing to repeat"},
           {"a{1001}", "above 1000"}, {"(a{1000}){1000}", "1024 states"}, {R"(\p{L})", "\\p"}}) {
    try {
      regex_constraint(k.vocab, pattern);
      ADD_FAILURE() << pattern << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << pattern << ": " << e.what();
    }
  }
}

TEST(Guided, GrammarTexts) {
  SchemaCheck k;
  // Arithmetic over integers: recursion through parentheses, repetition, a class, alternatives.
  auto expr = grammar_constraint(k.vocab, R"g(
    # comments and rules over several lines
    root   ::= expr
    expr   ::= term (("+" | "-") term)*
    term   ::= factor ("*" factor)*
    factor ::= [0-9]+ | "(" expr ")"
  )g");
  for (const char* ok : {"1", "12+3", "(1+2)*3", "((7))", "1*2*3-4"}) EXPECT_EQ(k.walk(expr, ok), 1) << ok;
  EXPECT_EQ(k.walk(expr, "(1+"), 0);
  EXPECT_EQ(k.walk(expr, "((7)"), 0);
  for (const char* bad : {"+1", "1+*2", "(1))", "a", "1 + 2"}) EXPECT_EQ(k.walk(expr, bad), -1) << bad;
  // Bounded repetition, optional parts, escapes, a negated class over UTF-8 text, "." and ''.
  auto rec = grammar_constraint(k.vocab,
                                "root ::= key \"=\" val ( \";\" key \"=\" val ){0,2} '\\n'?\n"
                                "key ::= [a-z_] [a-z0-9_]{0,3}\n"
                                "val ::= \"\\\"\" [^\"\\n]* \"\\\"\" | \"#\" . | \"\\u00e9\"+");
  EXPECT_EQ(k.walk(rec, "a=\"x y\""), 1);
  EXPECT_EQ(k.walk(rec, "a=\"caf\xc3\xa9 \xe2\x82\xac\";b_1=#!;c=\xc3\xa9\xc3\xa9\n"), 1);
  EXPECT_EQ(k.walk(rec, "a=#\xf0\x9f\x98\x80"), 1);                // "." takes a 4-byte code point
  EXPECT_EQ(k.walk(rec, "a=\xc3"), 0);                             // inside a code point
  EXPECT_EQ(k.walk(rec, "a=\xc3\xa8"), -1);                        // U+00E8 is not U+00E9
  EXPECT_EQ(k.walk(rec, "a=\"x\n"), -1);
  EXPECT_EQ(k.walk(rec, "abcde=#x"), -1);                          // key of at most 4
  EXPECT_EQ(k.walk(rec, "a=#x;b=#x;c=#x;d=#x"), -1);               // at most 2 more pairs
  EXPECT_EQ(k.walk(rec, "a=\"\x80\""), -1);                        // not UTF-8
  // A lead byte is allowed only when a code point of its length can still match: U+00E9 is two
  // bytes, so no three- or four-byte lead may begin it.
  auto e_acute = grammar_constraint(k.vocab, "root ::= \"\u00e9\"");
  EXPECT_EQ(k.walk(e_acute, "\xc3"), 0);
  EXPECT_EQ(k.walk(e_acute, "\xe0"), -1);
  EXPECT_EQ(k.walk(e_acute, "\xf0"), -1);
  EXPECT_EQ(k.walk(grammar_constraint(k.vocab, "root ::= [0-9]"), "\xe0"), -1);
  // Long repetitions neither grow the parse nor slow it: 3000 bytes of a starred class.
  auto star = grammar_constraint(k.vocab, "root ::= [a-z]* \".\"");
  EXPECT_EQ(k.walk(star, std::string(3000, 'q') + "."), 1);
  // Loops that consume nothing but do not grow the parse are fine: a star of something
  // optional, a rule that calls itself last after an optional part.
  auto opt_star = grammar_constraint(k.vocab, "root ::= (\"a\"?)* \"b\"");
  EXPECT_EQ(k.walk(opt_star, "aab"), 1);
  EXPECT_EQ(k.walk(opt_star, "b"), 1);
  EXPECT_EQ(k.walk(opt_star, "ac"), -1);
  auto tail = grammar_constraint(k.vocab, "root ::= list \".\"\nlist ::= [xy]? list | \"\"");
  EXPECT_EQ(k.walk(tail, "xyx."), 1);
  EXPECT_EQ(k.walk(tail, "."), 1);
  EXPECT_EQ(k.walk(tail, "xz"), -1);
  // The request ends when nothing may follow.
  auto yn = grammar_constraint(k.vocab, "root ::= \"yes\" | \"no\" \"pe\"?");
  auto st = yn->start();
  for (char ch : std::string("yes")) st->accept(uint8_t(ch));
  EXPECT_TRUE(st->must_end());
  st = yn->start();
  for (char ch : std::string("no")) st->accept(uint8_t(ch));
  EXPECT_TRUE(st->complete());
  EXPECT_FALSE(st->must_end());
  // End of sequence only when the text is complete.
  std::vector<float> l(k.vocab->size(), 0.0f);
  st->mask(l, std::vector<int32_t>{256});
  EXPECT_TRUE(std::isfinite(l[256]));
  EXPECT_TRUE(std::isfinite(l['p']));
  EXPECT_FALSE(std::isfinite(l['x']));
  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {"", "empty"},
           {"expr ::= \"a\"", "root"},
           {"root ::= item", "\"item\" is used but not defined"},
           {"root ::= root \"a\" | \"b\"", "left-recursive"},
           {"root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"", "left-recursive"},
           {"root: \"a\"", "Lark"},
           {"root ::= \"a", "unterminated literal"},
           {"root ::= [b-a]", "backwards"},
           {"root ::= \"a\"{3,1}", "n < m"},
           {"root ::= \"a\"{300}", "above 256"},
           {"root ::= (\"a\"", "missing ')'"},
           {"root ::= \"a\" )", "unmatched ')'"},
           {"root ::= \"\\q\"", "unknown escape"},
           {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
           {"root ::= \"a\"\n  ~", "line 2, column 3"},
           {"root ::= \"a\" | loop\nloop ::= \"b\" loop", "\"loop\" derives no text"}}) {
    try {
      grammar_constraint(k.vocab, text);
      ADD_FAILURE() << text << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << text << ": " << e.what();
    }
  }
}

// The grammar matcher against the regex automaton (tested on its own above): random expressions
// over {a, b, c} written both ways must accept, reject and complete the same texts.
TEST(Guided, GrammarAgreesWithRegexOnRandomExpressions) {
  SchemaCheck k;
  std::mt19937 rng(20261205);
  auto pick = [&](int n) { return int(rng() % unsigned(n)); };
  // One random expression as {regex, grammar} text; depth bounds the nesting.
  std::function<std::pair<std::string, std::string>(int)> gen = [&](int depth) -> std::pair<std::string, std::string> {
    const int kind = depth <= 0 ? pick(2) : pick(8);
    switch (kind) {
      case 0: {
        const char c = char('a' + pick(3));
        return {std::string(1, c), "\"" + std::string(1, c) + "\""};
      }
      case 1: {
        static const char* classes[] = {"[ab]", "[^a]", "[bc]"};
        const std::string cls = classes[pick(3)];
        return {cls, cls};
      }
      case 2: {  // concatenation
        auto x = gen(depth - 1), y = gen(depth - 1);
        return {x.first + y.first, x.second + " " + y.second};
      }
      case 3: {  // alternation
        auto x = gen(depth - 1), y = gen(depth - 1);
        return {"(?:" + x.first + "|" + y.first + ")", "(" + x.second + " | " + y.second + ")"};
      }
      default: {  // a postfix operator on a group
        auto x = gen(depth - 1);
        static const char* ops[] = {"*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"};
        const char* op = ops[pick(7)];
        return {"(?:" + x.first + ")" + op, "(" + x.second + ")" + op};
      }
    }
  };
  int agreed = 0;
  for (int round = 0; round < 300; ++round) {
    auto [re, g] = gen(4);
    std::shared_ptr<const OutputConstraint> a, b;
    try {
      a = regex_constraint(k.vocab, re);
    } catch (const Error&) {
      continue;  // beyond the regex automaton's size: skip
    }
    b = grammar_constraint(k.vocab, "root ::= " + g);
    for (int t = 0; t < 40; ++t) {
      std::string text;
      const int n = pick(9);
      for (int i = 0; i < n; ++i) text += char('a' + pick(3));
      ASSERT_EQ(k.walk(a, text), k.walk(b, text)) << "regex " << re << "\ngrammar " << g << "\ntext " << text;
      ++agreed;
    }
  }
  EXPECT_GT(agreed, 8000);
}

}  // namespace
}  // namespace sieve::guided
