// A minimal byte-level tokenizer for tiny random models (`sieve make-tiny-model`): every byte
// is a token (id = byte value), then the MiniMax chat special tokens, then a few merges if the
// vocabulary has room. With the built-in MiniMax chat template, a random model can serve text.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sieve::text {

struct ByteLevelTokenizerInfo {
  int32_t bos_id;    // ]~!b[
  int32_t eos_id;    // [e~[
  int32_t used_ids;  // ids 0 .. used_ids-1 are taken; the rest of the vocabulary is unused
  std::vector<std::pair<std::string, int32_t>> special_tokens;  // content, id
};

// Writes tokenizer.json and tokenizer_config.json (bos/eos, the MiniMax chat template) into
// `dir` (created if needed). Throws sieve::Error when vocab_size cannot hold the 256 bytes and
// the special tokens. Merges are added while ids remain, up to `max_merges`.
ByteLevelTokenizerInfo write_byte_level_tokenizer(const std::string& dir, int32_t vocab_size,
                                                  int max_merges = 8);

}  // namespace sieve::text
