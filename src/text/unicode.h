// UTF-8 and Unicode helpers the tokenizer needs: validation, decoding, the lossy conversion
// Hugging Face uses when decoded bytes are not UTF-8, and NFC normalization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sieve::text {

// Byte offset of the first invalid UTF-8 sequence (overlong forms, surrogates and code points
// above U+10FFFF are invalid), or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

// Throws sieve::Error naming `what` and the byte offset when `s` is not valid UTF-8.
void require_utf8(std::string_view s, const char* what);

// Length of the UTF-8 sequence starting at s[i] when it is complete and valid, 0 when it is
// invalid, and -1 when s ends in the middle of a sequence that could still become valid.
int utf8_sequence_length(std::string_view s, size_t i);

// Replaces each maximal invalid subsequence by U+FFFD (what Rust's String::from_utf8_lossy
// and Python's bytes.decode(errors="replace") do). Incomplete sequences at the end too.
std::string utf8_lossy(std::string_view bytes);

// Decodes one code point at s[i] of a valid UTF-8 string and advances i.
uint32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, uint32_t cp);

// Unicode Normalization Form C. Input must be valid UTF-8. Strings that cannot change (the
// usual case) are returned after one scan.
std::string nfc(std::string_view s);

}  // namespace sieve::text
