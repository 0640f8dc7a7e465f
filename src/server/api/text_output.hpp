// One choice's text as it streams: token ids in, text out, never half a UTF-8 character (the
// tokenizer's StreamDecoder), special tokens left out, and stop strings honoured across token
// boundaries: text that could be the start of a stop string is held back until the next tokens
// show it is not, and a stop string found ends the choice with the text before it, so the stop
// string itself never reaches the client. Without a tokenizer (random weights), each token's text
// is its id, space-separated, as `deepfuse generate` prints it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "deepfuse/tokenizer.hpp"

namespace deepfuse::server {

class TextOutput {
 public:
  // `kept_specials`: special tokens whose text is kept (a tool call format's marker, such as
  // Mistral's [TOOL_CALLS]); every other special token is left out.
  TextOutput(const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
             std::vector<int32_t> kept_specials = {});

  // The text that is safe to send after this token (may be empty). After a stop string matched,
  // stopped() is true and nothing more comes out.
  std::string push(int32_t id);
  // What is still held back, at the end of generation (not after a stop string).
  std::string finish();
  bool stopped() const { return stopped_; }
  // Everything sent so far.
  const std::string& text() const { return text_; }

 private:
  // Emits what of pending_ is safe, keeping back a tail that may start a stop string.
  std::string release(bool at_end);

  const Tokenizer* tokenizer_;
  std::optional<StreamDecoder> decoder_;
  std::vector<std::string> stops_;
  std::vector<int32_t> kept_specials_;
  std::string pending_;
  std::string text_;
  bool stopped_ = false;
  bool any_token_ = false;
};

}  // namespace deepfuse::server
