#include "speculative/verify.hpp"

namespace deepfuse::speculative {

std::vector<int32_t> accept_drafts(std::span<const int32_t> drafts, const std::function<int32_t(int row)>& choose) {
  std::vector<int32_t> emitted;
  for (int row = 0;; ++row) {
    emitted.push_back(choose(row));
    if (row == static_cast<int>(drafts.size()) || emitted.back() != drafts[row]) return emitted;
  }
}

std::vector<int32_t> verify_on_reference(const reference::Decoder& decoder, reference::KvCache& cache, int32_t last,
                                         std::span<const int32_t> drafts,
                                         const std::function<int32_t(int row, std::span<float> logits)>& choose) {
  std::vector<int32_t> fed{last};
  fed.insert(fed.end(), drafts.begin(), drafts.end());
  const int start = cache.length;
  std::vector<float> logits = decoder.forward(fed, cache);
  const size_t vocab = decoder.config().vocab_size;
  std::vector<int32_t> emitted = accept_drafts(drafts, [&](int row) {
    return choose(row, std::span<float>(logits.data() + row * vocab, vocab));
  });
  cache.truncate(start + 1 + accepted_count(emitted));
  return emitted;
}

}  // namespace deepfuse::speculative
