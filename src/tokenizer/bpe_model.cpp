#include "tokenizer/bpe_model.hpp"

#include <cstdio>
#include <queue>

#include "deepfuse/error.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::tokenizer {
namespace {

[[noreturn]] void fail(const std::string& message) { throw Error("tokenizer.json: model: " + message); }

std::string optional_string(const nlohmann::json& model, const char* key) {
  const auto it = model.find(key);
  return it == model.end() || it->is_null() ? std::string() : it->get<std::string>();
}

bool optional_bool(const nlohmann::json& model, const char* key) {
  const auto it = model.find(key);
  return it != model.end() && it->is_boolean() && it->get<bool>();
}

// A merge is either "left right" (older files) or ["left", "right"] (tokenizers >= 0.20).
std::pair<std::string, std::string> parse_merge(const nlohmann::json& merge, size_t index) {
  if (merge.is_string()) {
    const std::string text = merge.get<std::string>();
    const auto space = text.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == text.size() ||
        text.find(' ', space + 1) != std::string::npos)
      fail("merge " + std::to_string(index) + " '" + text + "' is not two tokens separated by one space");
    return {text.substr(0, space), text.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  fail("merge " + std::to_string(index) + " is neither \"a b\" nor [\"a\", \"b\"]");
}

}  // namespace

BpeModel BpeModel::from_json(const nlohmann::json& model) {
  BpeModel bpe;
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) fail("\"vocab\" object missing");
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0) fail("vocab id of '" + token + "' is not a non-negative integer");
    const auto id = id_json.get<TokenId>();
    bpe.vocab_[token] = id;
    if (static_cast<size_t>(id) >= bpe.id_to_token_.size()) bpe.id_to_token_.resize(id + 1);
    bpe.id_to_token_[id] = token;
  }

  const auto merges = model.find("merges");
  if (merges != model.end() && !merges->is_null()) {
    if (!merges->is_array()) fail("\"merges\" is not an array");
    bpe.merges_.reserve(merges->size());
    uint32_t rank = 0;
    for (const auto& merge : *merges) {
      const auto [left, right] = parse_merge(merge, rank);
      const auto left_id = bpe.token_to_id(left), right_id = bpe.token_to_id(right);
      const auto merged_id = bpe.token_to_id(left + right);
      if (!left_id) fail("merge " + std::to_string(rank) + " names '" + left + "', which is not in the vocab");
      if (!right_id) fail("merge " + std::to_string(rank) + " names '" + right + "', which is not in the vocab");
      if (!merged_id) fail("merge " + std::to_string(rank) + " makes '" + left + right + "', which is not in the vocab");
      // Rank is the position in the list; a repeated pair keeps its last position, as in HF.
      bpe.merges_[pair_key(*left_id, *right_id)] = MergeResult{rank, *merged_id};
      ++rank;
    }
  }

  const std::string unk = optional_string(model, "unk_token");
  if (!unk.empty()) {
    bpe.unk_id_ = bpe.token_to_id(unk);
    if (!bpe.unk_id_) fail("unk_token '" + unk + "' is not in the vocab");
  }
  bpe.continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix");
  bpe.end_of_word_suffix_ = optional_string(model, "end_of_word_suffix");
  bpe.fuse_unk_ = optional_bool(model, "fuse_unk");
  bpe.byte_fallback_ = optional_bool(model, "byte_fallback");
  bpe.ignore_merges_ = optional_bool(model, "ignore_merges");
  if (const auto dropout = model.find("dropout"); dropout != model.end() && !dropout->is_null() && dropout->get<double>() > 0)
    fail("BPE dropout is not supported (inference tokenizers have none)");
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    bpe.byte_token_ids_[b] = bpe.token_to_id(name);
  }
  return bpe;
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  const std::string& token = id_to_token_[id];
  return token.empty() && vocab_.find(token) == vocab_.end() ? nullptr : &token;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  std::string piece;
  const auto push = [&](TokenId id) {
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, true});
  };
  // An unk waits here until a known character (or the end) comes, so that with fuse_unk a run
  // of unknown characters becomes one unk. As in HF, byte-fallback tokens do not end the run:
  // they are emitted while the unk keeps waiting.
  bool unk_pending = false;
  for (size_t pos = 0; pos < word.size();) {
    const size_t start = pos;
    next_code_point(word, pos);
    piece.clear();
    if (start > 0) piece += continuing_subword_prefix_;
    piece.append(word.substr(start, pos - start));
    if (pos == word.size()) piece += end_of_word_suffix_;

    if (const auto id = token_to_id(piece)) {
      if (unk_pending) push(*unk_id_);
      unk_pending = false;
      push(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes_known = true;
      for (size_t i = start; i < pos; ++i) all_bytes_known &= byte_token_ids_[static_cast<unsigned char>(word[i])].has_value();
      if (all_bytes_known) {
        for (size_t i = start; i < pos; ++i) push(*byte_token_ids_[static_cast<unsigned char>(word[i])]);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_pending && !fuse_unk_) push(*unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) push(*unk_id_);
}

void BpeModel::tokenize(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  initial_symbols(word, symbols);

  struct Candidate {
    uint32_t rank;
    int position;
    TokenId merged;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int left) {
    const int right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.merged});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.position];
    if (!left.alive || left.next < 0) continue;
    // Stale when either side changed since the pair was pushed.
    const auto it = merges_.find(pair_key(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.merged != top.merged) continue;

    Symbol& right = symbols[left.next];
    right.alive = false;
    left.id = top.merged;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.position;
    if (left.prev >= 0) consider(left.prev);
    consider(top.position);
  }
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace deepfuse::tokenizer
