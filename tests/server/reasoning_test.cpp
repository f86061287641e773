// The reasoning splitter of --reasoning-parser: tags anywhere in the stream, split across pieces
// at every position, and the start state taken from the prompt.
#include "server/reasoning.h"

#include <gtest/gtest.h>

#include <string>

namespace sieve::server {
namespace {

// Feeds `text` in pieces cut at `cuts` (ascending positions), then finishes.
ReasoningSplitter::Piece split(const std::string& text, bool start_in_reasoning, const std::vector<size_t>& cuts) {
  ReasoningSplitter s(start_in_reasoning);
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

TEST(Reasoning, SplitsWhereverThePiecesEnd) {
  const std::string text = "plan: a<b, then </think>\n\nThe answer is 4 </thin";
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); j += 3) {
      auto p = split(text, true, {i, j});
      EXPECT_EQ(p.reasoning, "plan: a<b, then ") << i << " " << j;
      EXPECT_EQ(p.content, "\n\nThe answer is 4 </thin") << i << " " << j;  // an unfinished tag is text
    }
}

TEST(Reasoning, ContentUntilAThinkTagOpensReasoning) {
  auto p = split("Hi <think>hmm</think>done", false, {5, 12});
  EXPECT_EQ(p.content, "Hi done");
  EXPECT_EQ(p.reasoning, "hmm");
  p = split("no tags at all", false, {});
  EXPECT_EQ(p.content, "no tags at all");
  EXPECT_EQ(p.reasoning, "");
  p = split("still thinking <", true, {15});
  EXPECT_EQ(p.reasoning, "still thinking <");  // held back, then released by finish()
  EXPECT_EQ(p.content, "");
}

TEST(Reasoning, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("]~b]ai\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("]~b]ai\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<think>\nx\n</think>\n\n]~b]ai\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>a</think> ]~b]ai\n<think>\n"));
}

}  // namespace
}  // namespace sieve::server
