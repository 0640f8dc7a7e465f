// Encoding and decoding: HF's pipeline of added-token split -> normalize -> (normalized
// added-token split) -> pre-tokenize -> BPE per word -> post-processor frame.
#include "deepfuse/tokenizer.hpp"

#include "deepfuse/error.hpp"
#include "tokenizer/tokenizer_impl.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t invalid = tokenizer::find_invalid_utf8(text);
  DF_CHECK(invalid == std::string_view::npos, "text to tokenize is not valid UTF-8 (bad byte at offset " + std::to_string(invalid) + ")");

  std::vector<tokenizer::Segment> raw_segments, segments;
  impl_->raw_matcher.split(text, true, raw_segments);
  for (tokenizer::Segment& segment : raw_segments) {
    if (segment.token) {
      segments.push_back(std::move(segment));
      continue;
    }
    if (impl_->normalizer) impl_->normalizer->normalize(segment.text);
    impl_->normalized_matcher.split(segment.text, segment.at_input_start, segments);
  }

  std::vector<TokenId> ids;
  if (add_special_tokens) ids = impl_->frame.prefix;
  std::vector<tokenizer::Piece> pieces;
  for (tokenizer::Segment& segment : segments) {
    if (segment.token) {
      ids.push_back(*segment.token);
      continue;
    }
    if (segment.text.empty()) continue;  // HF drops empty splits before pre-tokenizing
    pieces.clear();
    pieces.push_back({std::move(segment.text), segment.at_input_start});
    if (impl_->pre_tokenizer) impl_->pre_tokenizer->split(pieces);
    for (const tokenizer::Piece& piece : pieces) impl_->model.tokenize(piece.text, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), impl_->frame.suffix.begin(), impl_->frame.suffix.end());
  return ids;
}

std::vector<TokenId> Tokenizer::encode_rendered_chat(std::string_view rendered) const {
  std::vector<TokenId> ids = encode(rendered, /*add_special_tokens=*/false);
  const auto& prefix = impl_->frame.prefix;
  const bool adds_bos = impl_->bos_id && !prefix.empty() && prefix.front() == *impl_->bos_id;
  if (adds_bos && (ids.empty() || ids.front() != *impl_->bos_id)) ids.insert(ids.begin(), *impl_->bos_id);
  return ids;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const TokenId id : ids) {
    if (const auto added = impl_->added_by_id.find(id); added != impl_->added_by_id.end()) {
      if (!(skip_special_tokens && added->second.special)) tokens.push_back(added->second.content);
    } else if (const std::string* token = impl_->model.id_to_token(id)) {
      tokens.push_back(*token);
    }
  }
  return tokenizer::decode_tokens(impl_->decoder.get(), std::move(tokens));
}

std::vector<std::string> Tokenizer::token_bytes() const {
  // A token decoded after an anchor token, less the anchor's own bytes: decoders treat the first
  // token of a text apart (Metaspace drops its leading marker, Strip its leading space).
  std::string anchor;
  for (const char c : std::string("aeoxAEOX0")) {
    if (const auto id = impl_->model.token_to_id(std::string(1, c))) {
      anchor = std::string(1, c);
      break;
    }
  }
  DF_CHECK(!anchor.empty(), "tokenizer: no single-letter token to decode the vocabulary after");
  const std::string anchor_bytes = tokenizer::decode_tokens(impl_->decoder.get(), {anchor}, tokenizer::InvalidUtf8::keep);
  std::vector<std::string> out(vocab_size());
  for (size_t id = 0; id < out.size(); ++id) {
    const TokenId token_id = static_cast<TokenId>(id);
    std::string token;
    if (const auto added = impl_->added_by_id.find(token_id); added != impl_->added_by_id.end()) {
      if (added->second.special) continue;
      token = added->second.content;
    } else if (const std::string* model_token = impl_->model.id_to_token(token_id)) {
      token = *model_token;
    } else {
      continue;
    }
    std::string both = tokenizer::decode_tokens(impl_->decoder.get(), {anchor, token}, tokenizer::InvalidUtf8::keep);
    DF_CHECK(both.compare(0, anchor_bytes.size(), anchor_bytes) == 0,
             "tokenizer: token " + std::to_string(id) + " changes the text decoded before it");
    out[id] = both.substr(anchor_bytes.size());
  }
  return out;
}

size_t Tokenizer::vocab_size() const {
  size_t bound = impl_->model.id_bound();
  for (const auto& [id, token] : impl_->added_by_id) bound = std::max(bound, static_cast<size_t>(id) + 1);
  return bound;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) return it->second;
  return impl_->model.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return it->second.content;
  if (const std::string* token = impl_->model.id_to_token(id)) return *token;
  return std::nullopt;
}

bool Tokenizer::is_special(TokenId id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && it->second.special;
}

std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos_id; }
const std::vector<TokenId>& Tokenizer::stop_ids() const { return impl_->stop_ids; }
std::string Tokenizer::bos_token() const { return impl_->bos_token; }
std::string Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

// The window [prefix_offset_, end) is decoded on every push and compared with the part already
// emitted, [prefix_offset_, read_offset_): decoders that treat the first token specially (Metaspace
// stripping its space) see the same first token both times, so the difference is exactly the new
// text. A text ending in U+FFFD is an incomplete character: wait for more ids.
StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(TokenId id) {
  ids_.push_back(id);
  const std::vector<TokenId> emitted(ids_.begin() + prefix_offset_, ids_.begin() + read_offset_);
  const std::vector<TokenId> window(ids_.begin() + prefix_offset_, ids_.end());
  const std::string emitted_text = tokenizer_.decode(emitted, skip_special_tokens_);
  const std::string window_text = tokenizer_.decode(window, skip_special_tokens_);
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const bool incomplete = window_text.size() >= kReplacement.size() &&
                          window_text.compare(window_text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
  if (window_text.size() <= emitted_text.size() || incomplete) return {};
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return window_text.substr(emitted_text.size());
}

std::string StreamDecoder::flush() {
  const std::vector<TokenId> emitted(ids_.begin() + prefix_offset_, ids_.begin() + read_offset_);
  const std::vector<TokenId> window(ids_.begin() + prefix_offset_, ids_.end());
  const std::string emitted_text = tokenizer_.decode(emitted, skip_special_tokens_);
  const std::string window_text = tokenizer_.decode(window, skip_special_tokens_);
  prefix_offset_ = read_offset_ = ids_.size();
  return window_text.size() > emitted_text.size() ? window_text.substr(emitted_text.size()) : std::string();
}

}  // namespace deepfuse
