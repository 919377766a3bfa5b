// UTF-8 helpers and Unicode normalization for the tokenizer. Strings are UTF-8 in std::string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace qs::unicode {

constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point at s[pos] of *valid* UTF-8 and returns its byte length in *len.
char32_t decode_utf8(std::string_view s, size_t pos, int* len);
void append_utf8(std::string& out, char32_t cp);
std::string to_utf8(char32_t cp);
// Byte length of the UTF-8 sequence that starts with `lead` (1 for continuation bytes).
int utf8_sequence_length(uint8_t lead);

// Rust's String::from_utf8_lossy: every maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

// Unicode White_Space (Rust's char::is_whitespace and regex `\s`).
bool is_white_space(char32_t cp);
// Rust regex `\w` (Alphabetic, marks, decimal digits, connector punctuation, joiners).
bool is_word_char(char32_t cp);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string normalize(std::string_view s, NormalForm form);
const char* unicode_version();

}  // namespace qs::unicode
