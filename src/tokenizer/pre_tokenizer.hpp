// tokenizer.json "pre_tokenizer": splits normalized text into the words BPE merges within
// (Split regexes, ByteLevel, Metaspace, Sequence, ...).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepfuse::tokenizer {

struct Piece {
  std::string text;
  // True when the piece begins at the start of the whole input (not after an added token);
  // Metaspace's prepend_scheme "first" prepends its marker only there.
  bool at_input_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their split (and possibly rewritten) parts; empty parts are dropped.
  virtual void split(std::vector<Piece>& pieces) const = 0;
};

// nullptr for a JSON null. Throws deepfuse::Error for unsupported types or invalid regexes.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec);

}  // namespace deepfuse::tokenizer
