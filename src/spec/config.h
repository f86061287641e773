// --speculative-config: vLLM's flag and field names. Parsed and checked once, before any weights
// load, so a mistake in it is one clear line (the CLI exits 2).
#pragma once

#include <cstdint>
#include <string>

namespace sieve::spec {

enum class Method { None, Ngram, Eagle3 };
const char* method_name(Method m);  // "none", "ngram", "eagle3"

// Largest num_speculative_tokens accepted: a verification step has K + 1 rows per sequence.
constexpr int kMaxSpeculativeTokens = 16;

struct SpeculativeConfig {
  Method method = Method::None;
  std::string model;               // eagle3: the draft's directory
  int num_speculative_tokens = 0;  // K
  // ngram (vLLM's defaults: both 5 when neither is given, else the one given for both)
  int prompt_lookup_min = 0;
  int prompt_lookup_max = 0;
  // Speculation pauses while more than this many requests run (vLLM's disable_by_batch_size);
  // 0: never for that reason.
  int disable_by_batch_size = 0;
  // Turns speculation down by itself when it does not pay (docs/serving.md, "Speculative
  // decoding"); off only in tests that need every step to speculate.
  bool adaptive = true;

  bool enabled() const { return method != Method::None; }
};

// Parses --speculative-config: a JSON object, or the path of a file holding one (whose relative
// "model" is taken from the file's folder). Throws Error (one line, naming
// --speculative-config and the field) for malformed JSON, an unknown method or field, or a value
// out of range. Empty text: speculation off. `draft_optional`: an eagle3 config may leave out
// "model" (`sieve bench step` then makes a draft of the published shape with dummy weights).
SpeculativeConfig parse_speculative_config(const std::string& json_text,
                                           bool draft_optional = false);

}  // namespace sieve::spec
