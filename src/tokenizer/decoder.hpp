// tokenizer.json "decoder": turns token strings back into text (ByteLevel's byte map, Metaspace's
// marker, Llama 2's Replace + ByteFallback + Fuse + Strip chain). Each step maps a list of
// token strings to a new list, as HF's decode_chain does; the final list is concatenated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepfuse::tokenizer {

// What decoding does with bytes that are not valid UTF-8: Hugging Face replaces them (U+FFFD);
// a grammar engine needs the bytes themselves (a token can hold part of a character).
enum class InvalidUtf8 { replace, keep };

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 invalid) const = 0;
};

// nullptr for a JSON null (tokens are then joined with spaces, as HF does).
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec);

// The text for `tokens` through `decoder` (which may be null).
std::string decode_tokens(const Decoder* decoder, std::vector<std::string> tokens,
                          InvalidUtf8 invalid = InvalidUtf8::replace);

}  // namespace deepfuse::tokenizer
