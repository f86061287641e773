// GSM8K 5-shot as lm-evaluation-harness's `gsm8k` task (v3) defines it: "Question: ...\nAnswer:"
// prompts with few-shot examples from the train split, greedy generation up to a stop string,
// two answer filters (strict-match, flexible-extract) and exact match after its normalisation.
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/http_client.h"

namespace sieve::eval {

struct Gsm8kDoc {
  std::string question, answer;  // answer: the worked solution ending in "#### N"
};

std::vector<Gsm8kDoc> load_gsm8k(const std::string& jsonl_path);

inline const char* kInvalid = "[invalid]";

// strict-match: the first "#### N" (regex `#### (\-?[0-9\.\,]+)`), else "[invalid]".
std::string extract_strict(const std::string& response);
// flexible-extract: the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`, else "[invalid]".
std::string extract_flexible(const std::string& response);
// exact_match's normalisation: drop ",", "$", everything through the last "#### ", a final ".",
// then lower-case.
std::string normalize_answer(const std::string& s);
bool exact_match(const std::string& prediction, const std::string& reference);

// The stop strings sent with each request, and the cut applied to the reply as well.
const std::vector<std::string>& gsm8k_stop_strings();
std::string cut_at_stop(const std::string& text);

// Few-shot examples for test document `index`: `k` distinct train documents drawn with a
// generator seeded by (seed, index), so a run is reproducible and independent of concurrency.
std::vector<size_t> fewshot_indices(size_t train_size, int k, uint64_t seed, size_t index);

// "Question: q1\nAnswer: a1\n\n...Question: q\nAnswer:" (lm-eval's target and few-shot delimiters).
std::string completion_prompt(const std::vector<Gsm8kDoc>& shots, const Gsm8kDoc& doc);
// Multi-turn chat: each example a user turn "Question: ...\nAnswer:" and an assistant turn.
nlohmann::json chat_messages(const std::vector<Gsm8kDoc>& shots, const Gsm8kDoc& doc);

// Mean and standard error (sample std / sqrt(n), lm-eval's mean_stderr) of 0/1 scores.
struct Score {
  double value = 0, stderr_ = 0;
  size_t n = 0;
};
Score mean_score(const std::vector<int>& correct);

// The lm-eval markdown table for the two filters.
std::string format_table(const Score& flexible, const Score& strict, int num_fewshot);

struct Gsm8kOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;     // empty: the first of /v1/models
  std::string data_dir;  // holds train.jsonl and test.jsonl
  int num_fewshot = 5;
  std::optional<int> limit;
  int num_concurrent = 32;
  bool chat = false;
  int max_gen_toks = 256;
  uint64_t seed = 1234;
  int retries = 2;
  std::string output_path;  // per-sample JSONL when set
  bool progress = false;
  bench::ClientOptions client;
};

struct Gsm8kResult {
  Score flexible, strict;
  int failed_requests = 0;  // scored as wrong
  std::vector<std::string> responses;
  std::string table;
};

// Runs the evaluation and prints the table (and notes) to `out`.
Gsm8kResult run_gsm8k(const Gsm8kOptions& o, std::atomic<bool>* stop, std::ostream& out);

}  // namespace sieve::eval
