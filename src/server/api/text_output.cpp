#include "server/api/text_output.hpp"

#include <algorithm>

namespace deepfuse::server {

TextOutput::TextOutput(const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
                       std::vector<int32_t> kept_specials)
    : tokenizer_(tokenizer), stops_(std::move(stop_strings)), kept_specials_(std::move(kept_specials)) {
  if (tokenizer) decoder_.emplace(*tokenizer, /*skip_special_tokens=*/true);
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string TextOutput::push(int32_t id) {
  if (stopped_) return {};
  if (decoder_) {
    pending_ += decoder_->push(id);
    // The decoder skips a kept special (it is special) and keeps its window going; its text goes
    // in after what the decoder released.
    if (std::find(kept_specials_.begin(), kept_specials_.end(), id) != kept_specials_.end())
      pending_ += tokenizer_->decode({id});
  } else {
    pending_ += (any_token_ ? " " : "") + std::to_string(id);
  }
  any_token_ = true;
  return release(false);
}

std::string TextOutput::finish() {
  if (stopped_) return {};
  if (decoder_) pending_ += decoder_->flush();
  return release(true);
}

std::string TextOutput::release(bool at_end) {
  // The earliest stop string in what is pending ends the text there.
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) cut = std::min(cut, pending_.find(stop));
  std::string out;
  if (cut != std::string::npos) {
    out = pending_.substr(0, cut);
    pending_.clear();
    stopped_ = true;
  } else {
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t keep = 0;
    if (!at_end)
      for (const std::string& stop : stops_)
        for (size_t n = std::min(stop.size() - 1, pending_.size()); n > keep; --n)
          if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
            keep = n;
            break;
          }
    out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
  }
  text_ += out;
  return out;
}

}  // namespace deepfuse::server
