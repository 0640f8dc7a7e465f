// UTF-8 and Unicode helpers the tokenizer needs: code point iteration, lossy decoding with the
// same replacement rules as Rust's String::from_utf8_lossy (what Hugging Face's decoders use),
// character classes with Rust's definitions, normalization forms, and GPT-2's byte <-> code
// point map for byte-level BPE.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepfuse::tokenizer {

// Appends the UTF-8 encoding of code point cp.
void append_utf8(std::string& out, char32_t cp);

// Length in bytes of the valid UTF-8 character starting at text[pos], or 0 when the bytes there
// are not a valid character.
size_t valid_utf8_char_length(std::string_view text, size_t pos);

// Decodes the character at text[pos] (which must be valid) and advances pos past it.
char32_t next_code_point(std::string_view text, size_t& pos);

// Byte offset of the first invalid UTF-8 sequence, or npos when the text is valid.
size_t find_invalid_utf8(std::string_view text);

// Invalid sequences become U+FFFD, one per maximal invalid subpart (Rust's from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);

// Unicode White_Space (Rust's char::is_whitespace and its regex \s).
bool is_unicode_whitespace(char32_t cp);
// A word character as Rust's regex \w sees it (letters, marks, decimal digits, connector
// punctuation, joiners): HF's single_word added tokens test the neighbours with it.
bool is_word_char(char32_t cp);

enum class NormalizationForm { NFC, NFD, NFKC, NFKD };
std::string normalize_unicode(std::string_view text, NormalizationForm form);

// GPT-2's reversible map from the 256 byte values to printable code points (printable Latin-1
// bytes map to themselves, the others to U+0100 and up, in byte order).
const std::array<char32_t, 256>& byte_to_code_point();
// The inverse: code point -> byte, or -1 for code points outside the map.
int code_point_to_byte(char32_t cp);

}  // namespace deepfuse::tokenizer
