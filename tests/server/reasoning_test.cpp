// The reasoning splitters of --reasoning-parser: MiniMax-M3's <mm:think> rules (a block only at
// the start, one stray leading closer dropped, the prompt opening the block), the <think> toggle
// of the other parsers, markers split across pieces at every position.
#include "server/reasoning.h"

#include <gtest/gtest.h>

#include <string>

namespace sieve::server {
namespace {

const ReasoningFormat& m3() {
  return reasoning_format("minimax_m3");
}
const ReasoningFormat& think() {
  return reasoning_format("qwen3");
}

// Feeds `text` in pieces cut at `cuts` (ascending positions), then finishes.
ReasoningSplitter::Piece split(const ReasoningFormat& f, const std::string& text, bool start_in_reasoning,
                               const std::vector<size_t>& cuts) {
  ReasoningSplitter s(f, start_in_reasoning);
  ReasoningSplitter::Piece all;
  size_t at = 0;
  auto add = [&](const ReasoningSplitter::Piece& p) {
    all.reasoning += p.reasoning;
    all.content += p.content;
  };
  for (size_t c : cuts) {
    add(s.push(std::string_view(text).substr(at, c - at)));
    at = c;
  }
  add(s.push(std::string_view(text).substr(at)));
  add(s.finish());
  return all;
}

// Every split of `text` into three pieces gives `reasoning` and `content`.
void expect_split(const ReasoningFormat& f, const std::string& text, bool start, const std::string& reasoning,
                  const std::string& content) {
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      auto p = split(f, text, start, {i, j});
      ASSERT_EQ(p.reasoning, reasoning) << text << " @" << i << "," << j;
      ASSERT_EQ(p.content, content) << text << " @" << i << "," << j;
    }
}

TEST(ReasoningM3, ThinkingEnabledThePromptOpensTheBlock) {
  expect_split(m3(), "plan: a<b, <mm:think> x</mm:think>The answer </mm:think> is 4 </mm:thi", true,
               "plan: a<b, <mm:think> x", "The answer </mm:think> is 4 </mm:thi");
  expect_split(m3(), "</mm:think>direct", true, "", "direct");
  expect_split(m3(), "cut short </mm:th", true, "cut short </mm:th", "");
}

TEST(ReasoningM3, AdaptiveABlockOnlyAtTheStart) {
  expect_split(m3(), "<mm:think>steps</mm:think>Answer <mm:think>x</mm:think>", false, "steps",
               "Answer <mm:think>x</mm:think>");
  // A reply that does not think may open with one stray closer: dropped, a second one stays.
  expect_split(m3(), "</mm:think></mm:think>Hi", false, "", "</mm:think>Hi");
  expect_split(m3(), "Hi <mm:think>not reasoning</mm:think>", false, "", "Hi <mm:think>not reasoning</mm:think>");
  expect_split(m3(), " <mm:think>x</mm:think>", false, "", " <mm:think>x</mm:think>");
  expect_split(m3(), "<mm:thin", false, "", "<mm:thin");  // a marker never finished is text
  expect_split(m3(), "<mm:think>cut short", false, "cut short", "");
  expect_split(m3(), "", false, "", "");
  // <think> means nothing to M3.
  expect_split(m3(), "<think>a</think>b", false, "", "<think>a</think>b");
}

TEST(ReasoningThink, TagsToggleWherever) {
  expect_split(think(), "plan: a<b, then </think>\n\nThe answer is 4 </thin", true, "plan: a<b, then ",
               "\n\nThe answer is 4 </thin");
  expect_split(think(), "Hi <think>hmm</think>done", false, "hmm", "Hi done");
  expect_split(think(), "still thinking <", true, "still thinking <", "");
  for (const char* name : {"minimax_m2", "deepseek_r1", "qwen3"}) EXPECT_EQ(reasoning_format(name).open, "<think>");
  EXPECT_EQ(reasoning_format("minimax_m3").open, "<mm:think>");
  EXPECT_EQ(reasoning_parser_names().front(), "minimax_m3");
}

TEST(Reasoning, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning(m3(), "]~b]ai\n<mm:think>"));
  EXPECT_TRUE(prompt_opens_reasoning(m3(), "]~b]ai\n<mm:think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(m3(), "]~b]ai\n</mm:think>"));
  EXPECT_FALSE(prompt_opens_reasoning(m3(), "]~b]ai\n"));
  // The markers in the system turn's instructions or a user's text open nothing.
  EXPECT_FALSE(prompt_opens_reasoning(m3(), "wrap it in <mm:think></mm:think> ]~b]user\nwhat is <mm:think>?[e~[\n]~b]ai\n"));
  EXPECT_FALSE(prompt_opens_reasoning(m3(), "]~b]ai\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning(think(), "]~b]ai\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(think(), "<think>\nx\n</think>\n\n]~b]ai\n"));
  EXPECT_TRUE(prompt_opens_reasoning(think(), "<think>a</think> ]~b]ai\n<think>\n"));
  // The guard's message says how to turn thinking off.
  EXPECT_NE(guided_in_reasoning_message(m3()).find("chat_template_kwargs.thinking_mode"), std::string::npos);
  EXPECT_NE(guided_in_reasoning_message(think()).find("enable_thinking"), std::string::npos);
}

}  // namespace
}  // namespace sieve::server
