// The parts of a loaded Tokenizer, shared by the loader (tokenizer_loader.cpp) and the
// encode/decode paths (tokenizer.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepfuse/tokenizer.hpp"
#include "tokenizer/added_tokens.hpp"
#include "tokenizer/bpe_model.hpp"
#include "tokenizer/decoder.hpp"
#include "tokenizer/normalizer.hpp"
#include "tokenizer/post_processor.hpp"
#include "tokenizer/pre_tokenizer.hpp"

namespace deepfuse {

struct Tokenizer::Impl {
  tokenizer::BpeModel model;
  std::unique_ptr<tokenizer::Normalizer> normalizer;
  std::unique_ptr<tokenizer::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tokenizer::Decoder> decoder;
  tokenizer::SpecialTokenFrame frame;  // added around the ids when add_special_tokens is on

  std::unordered_map<TokenId, tokenizer::AddedToken> added_by_id;
  std::unordered_map<std::string, TokenId> added_by_content;
  tokenizer::AddedTokenMatcher raw_matcher;         // added tokens with normalized == false
  tokenizer::AddedTokenMatcher normalized_matcher;  // added tokens with normalized == true

  std::optional<TokenId> bos_id, eos_id;
  std::string bos_token, eos_token;
  std::vector<TokenId> stop_ids;
  std::string chat_template;
};

}  // namespace deepfuse
