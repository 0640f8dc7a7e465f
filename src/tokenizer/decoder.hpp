// tokenizer.json "decoder": turns token strings back into text (ByteLevel's byte map, Metaspace's
// marker, Llama 2's Replace + ByteFallback + Fuse + Strip chain). Each step maps a list of
// token strings to a new list, as HF's decode_chain does; the final list is concatenated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepfuse::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a JSON null (tokens are then joined with spaces, as HF does).
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec);

// The text for `tokens` through `decoder` (which may be null).
std::string decode_tokens(const Decoder* decoder, std::vector<std::string> tokens);

}  // namespace deepfuse::tokenizer
