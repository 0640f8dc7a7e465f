#include "speculative/ngram_index.hpp"

#include <algorithm>
#include <string>

#include "deepfuse/error.hpp"

namespace deepfuse::speculative {

NgramIndex::NgramIndex(int max_ngram) : max_ngram_(max_ngram), last_end_(max_ngram) {
  DF_CHECK(max_ngram >= 1, "n-gram index: max_ngram must be at least 1, got " + std::to_string(max_ngram));
}

uint64_t NgramIndex::hash(std::span<const int32_t> gram) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the ids' 32 bits
  for (const int32_t id : gram) {
    h ^= static_cast<uint32_t>(id);
    h *= 0x100000001b3ull;
  }
  return h;
}

void NgramIndex::update(std::span<const int32_t> tokens) {
  const int last = static_cast<int>(tokens.size()) - 1;  // the suffix's end stays out
  DF_CHECK(indexed_ <= std::max(last, 0), "n-gram index: the sequence got shorter than what is indexed");
  for (; indexed_ < last; ++indexed_) {
    const int end = indexed_ + 1;
    for (int n = 1; n <= std::min(max_ngram_, end); ++n) last_end_[n - 1][hash(tokens.subspan(end - n, n))] = end;
  }
}

NgramIndex::Match NgramIndex::lookup(std::span<const int32_t> tokens, int max_length) const {
  const int size = static_cast<int>(tokens.size());
  for (int n = std::min(max_ngram_, size - 1); n >= 1; --n) {
    const auto& ends = last_end_[n - 1];
    const auto it = ends.find(hash(tokens.subspan(size - n, n)));
    if (it == ends.end()) continue;
    const int end = it->second;
    // Measure the match from the end backwards (a hash collision measures short and is skipped).
    int length = 0;
    while (length < std::min(max_length, end) && tokens[end - 1 - length] == tokens[size - 1 - length]) ++length;
    if (length >= n) return {length, end};
  }
  return {};
}

}  // namespace deepfuse::speculative
