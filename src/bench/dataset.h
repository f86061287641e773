// Prompts for `sieve bench serve`: random token prompts (vLLM's and ATOM's length rules), GSM8K
// questions, or a JSONL file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sieve::bench {

// Text <-> token ids, when a tokenizer is available (built with sieve_text and --tokenizer).
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int>& ids) const = 0;
  virtual int vocab_size() const = 0;
};

// Loads `dir` (tokenizer.json and friends) with sieve_text; throws Error when this build has
// no tokenizer library or the directory cannot be read.
std::unique_ptr<TextCodec> load_tokenizer(const std::string& dir);
bool tokenizer_available();

struct SampleRequest {
  std::string text;            // the prompt when !use_ids
  std::vector<int> token_ids;  // the prompt when use_ids
  bool use_ids = false;
  int prompt_len = 0;  // 0 when unknown (text without a tokenizer: from usage)
  int output_len = 0;  // max_tokens
};

// atom: uniform integers in [int(L*r), L] (ATOM's benchmark_serving).
// vllm: [floor(L(1-r)), ceil(L(1+r))] for inputs, [max(1, floor(O(1-r))), ceil(O(1+r))] outputs.
enum class RangeMode { vllm, atom };
RangeMode parse_range_mode(const std::string& s);

struct LengthRange {
  int lo = 0, hi = 0;
};
LengthRange input_length_range(int len, double ratio, RangeMode mode);
LengthRange output_length_range(int len, double ratio, RangeMode mode);

struct RandomConfig {
  int input_len = 1024;
  int output_len = 128;
  int prefix_len = 0;
  double range_ratio = 0.0;
  RangeMode mode = RangeMode::vllm;
  int vocab_size = 1000;  // token ids drawn from [0, vocab) when there is no tokenizer
  int num_prompts = 1000;
  uint64_t seed = 0;
};

// Without a tokenizer the prompts are token ids (exact input lengths, prefix included in the
// length). With one they are the decoded text, and prompt_len is the re-encoded length.
std::vector<SampleRequest> random_dataset(const RandomConfig& c, const TextCodec* tok);

// "Question: {question}\nAnswer:" for each row of a GSM8K jsonl file, shuffled with `seed` and
// repeated when num_prompts exceeds the file.
std::vector<SampleRequest> gsm8k_dataset(const std::string& path, int num_prompts, int output_len,
                                         uint64_t seed, const TextCodec* tok);

// One JSON object per line: {"prompt": "text" | [ids], "output_len"?: N} (also "max_tokens").
std::vector<SampleRequest> jsonl_dataset(const std::string& path, int num_prompts, int output_len,
                                         uint64_t seed, const TextCodec* tok);

}  // namespace sieve::bench
