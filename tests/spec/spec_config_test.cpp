// --speculative-config: vLLM's fields, defaults and one clear error per mistake.
#include "spec/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace sieve::spec {
namespace {

std::string error_of(const std::string& text, bool draft_optional = false) {
  try {
    parse_speculative_config(text, draft_optional);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpeculativeConfig, EmptyIsOff) {
  EXPECT_FALSE(parse_speculative_config("").enabled());
}

TEST(SpeculativeConfig, Ngram) {
  SpeculativeConfig c =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3})");
  EXPECT_EQ(c.method, Method::Ngram);
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_EQ(c.prompt_lookup_min, 5);  // vLLM: both 5 when neither is given
  EXPECT_EQ(c.prompt_lookup_max, 5);
  c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})");
  EXPECT_EQ(c.prompt_lookup_min, 4);
  EXPECT_EQ(c.prompt_lookup_max, 4);
  c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 6})");
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 6);
}

TEST(SpeculativeConfig, Eagle3) {
  const SpeculativeConfig c = parse_speculative_config(
      R"({"method": "eagle3", "model": "/d", "num_speculative_tokens": 3})");
  EXPECT_EQ(c.method, Method::Eagle3);
  EXPECT_EQ(c.model, "/d");
}

// sieve bench step makes a draft itself when none is named; "model" given is still checked.
TEST(SpeculativeConfig, Eagle3DraftOptionalForTheBench) {
  const SpeculativeConfig c =
      parse_speculative_config(R"({"method": "eagle3", "num_speculative_tokens": 3})", true);
  EXPECT_EQ(c.method, Method::Eagle3);
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_TRUE(c.model.empty());
  EXPECT_EQ(parse_speculative_config(
                R"({"method": "eagle3", "model": "/d", "num_speculative_tokens": 2})", true)
                .model,
            "/d");
  for (const char* bad : {R"({"method": "eagle3", "model": "", "num_speculative_tokens": 3})",
                          R"({"method": "eagle3", "model": 7, "num_speculative_tokens": 3})"})
    EXPECT_NE(error_of(bad, true).find("needs \"model\""), std::string::npos) << bad;
}

TEST(SpeculativeConfig, FromAFile) {
  const std::string dir = ::testing::TempDir() + "sieve_spec_cfg";
  std::filesystem::create_directories(dir + "/d");
  std::ofstream(dir + "/d/speculative.json")
      << R"({"method": "eagle3", "model": ".", "num_speculative_tokens": 2})";
  const SpeculativeConfig c = parse_speculative_config(dir + "/d/speculative.json");
  EXPECT_EQ(c.num_speculative_tokens, 2);
  EXPECT_EQ(std::filesystem::path(c.model), std::filesystem::path(dir + "/d").lexically_normal());
  EXPECT_NE(error_of(dir + "/missing.json").find("not a file"), std::string::npos);
}

TEST(SpeculativeConfig, BadInputNamesTheFlagAndField) {
  struct Case {
    const char* json;
    const char* says;
  } cases[] = {
      {"{", "not valid JSON"},
      {"[1]", "JSON object"},
      {R"({"method": "medusa", "num_speculative_tokens": 3})", "unknown method \"medusa\""},
      {R"({"num_speculative_tokens": 3})", "method is required"},
      {R"({"method": "ngram"})", "num_speculative_tokens is required"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})",
       "num_speculative_tokens must be in 1..16"},
      {R"({"method": "ngram", "num_speculative_tokens": 17})",
       "num_speculative_tokens must be in 1..16"},
      {R"({"method": "ngram", "num_speculative_tokens": "3"})", "must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2})",
       "prompt_lookup_min (5) is larger than prompt_lookup_max (2)"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0})",
       "prompt_lookup_min must be in"},
      {R"({"method": "eagle3", "num_speculative_tokens": 3})", "needs \"model\""},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "colour": 1})",
       "unknown field \"colour\""},
      {R"({"method": "eagle3", "model": "d", "num_speculative_tokens": 3, "prompt_lookup_max": 2})",
       "ngram\" only"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of(c.json);
    EXPECT_NE(e.find("--speculative-config"), std::string::npos) << c.json << " -> " << e;
    EXPECT_NE(e.find(c.says), std::string::npos) << c.json << " -> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
  }
}

}  // namespace
}  // namespace sieve::spec
