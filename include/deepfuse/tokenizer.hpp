// Text <-> token ids, identical to Hugging Face `tokenizers` for the checkpoints deepfuse serves.
//
// A Tokenizer is loaded from a model directory's tokenizer.json (plus tokenizer_config.json when
// present) and covers the two BPE families of Llama, Qwen2 and Mistral checkpoints:
//   - byte-level BPE (Llama 3, Qwen2, GPT-2): Split regexes run with PCRE2 (UTF + UCP), bytes
//     mapped to printable code points before the merges;
//   - SentencePiece-converted BPE (Llama 2, Mistral): the "▁" space marker, byte fallback to
//     <0xNN> tokens, unk.
// Added and special tokens are matched in the raw text before anything else, as Hugging Face does.
// Malformed files throw deepfuse::Error with a one-line message naming the file and the problem.
// A loaded Tokenizer is immutable: encode/decode may be called from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepfuse {

using TokenId = int32_t;

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (BOS/EOS, add_bos_token,
  // chat template; DIR/chat_template.jinja also counts).
  static Tokenizer from_directory(const std::filesystem::path& dir);
  // From the JSON texts themselves (config_json may be empty).
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special_tokens: add what the post-processor adds (e.g. BOS). Special tokens written in
  // the text are recognised either way, like Hugging Face's encode(text, add_special_tokens).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const;
  // For text a chat template rendered: the template decides about BOS. Adds the BOS only when the
  // post-processor would and the text does not already start with it (never a double BOS).
  std::vector<TokenId> encode_rendered_chat(std::string_view rendered) const;

  // Text for the ids (lossy for invalid UTF-8, exactly as Hugging Face's decode).
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false) const;

  size_t vocab_size() const;  // highest id + 1 over the model vocab and the added tokens
  // Per id (vocab_size() of them), the bytes the token adds to a text it is appended to, raw (a
  // byte-level token may hold part of a UTF-8 character); empty for special tokens and unused ids.
  // What a grammar engine needs to know which tokens can continue a text (structured output).
  std::vector<std::string> token_bytes() const;
  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(TokenId id) const;
  bool is_special(TokenId id) const;

  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  // Every id that ends generation: eos_token plus the config's generation end markers.
  const std::vector<TokenId>& stop_ids() const;
  std::string bos_token() const;  // "" when the tokenizer has none
  std::string eos_token() const;
  // The chat_template source (empty when the checkpoint ships none).
  const std::string& chat_template() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental decoding for streaming: push ids one at a time and print what comes back. A piece
// never ends inside a UTF-8 character, and the concatenation of all pieces (including flush())
// equals tokenizer.decode(all ids). (One exception, shared with HF's DecodeStream: with <0xNN>
// byte fallback, an invalid byte run that follows already printed bytes of the same run turns
// those bytes into U+FFFD in the full decode, after they were printed.)
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(TokenId id);
  // What is still held back (an incomplete character at the end of the stream), as decode shows it.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<TokenId> ids_;
  size_t prefix_offset_ = 0;  // first id of the window re-decoded on every push
  size_t read_offset_ = 0;    // ids before this have been emitted
};

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json: a small valid byte-level BPE tokenizer
// with exactly vocab_size ids (the 256 byte tokens, merges of common English pairs, and the
// Llama-3-style specials <|begin_of_text|>, <|end_of_text|>, <|start_header_id|>,
// <|end_header_id|>, <|eot_id|> as the last five ids) and a Llama-3-style chat template.
// vocab_size must be at least 261. For `deepfuse make-model`, so tiny models take text.
void write_tiny_tokenizer(const std::filesystem::path& dir, int vocab_size);

// The smallest vocab_size write_tiny_tokenizer accepts: the 256 byte tokens and the five specials.
inline constexpr int kTinyTokenizerMinVocab = 261;

// The ids write_tiny_tokenizer(dir, vocab_size) gives its specials, so that a config.json written
// next to it names the same BOS and EOS. eot (<|eot_id|>) is the tokenizer's eos_token.
struct TinyTokenizerIds {
  TokenId begin_of_text, end_of_text, eot;
};
TinyTokenizerIds tiny_tokenizer_ids(int vocab_size);

}  // namespace deepfuse
