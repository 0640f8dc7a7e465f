#include "speculative/reference_sequence.hpp"

#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "speculative/verify.hpp"

namespace deepfuse::speculative {

ReferenceSequence::ReferenceSequence(const reference::Decoder& decoder, std::vector<int32_t> prompt,
                                     SamplingParams sampling, SequenceDrafter* drafter)
    : decoder_(decoder),
      sampling_(sampling),
      drafter_(drafter),
      cache_(decoder.new_cache()),
      tokens_(std::move(prompt)),
      prompt_length_(static_cast<int>(tokens_.size())) {
  DF_CHECK(!tokens_.empty(), "reference sequence: the prompt is empty");
}

int32_t ReferenceSequence::choose(std::span<const float> logits) {
  const int32_t id = reference::sample(logits, sampling_, tokens_, static_cast<uint64_t>(generated()));
  tokens_.push_back(id);
  return id;
}

std::span<const int32_t> ReferenceSequence::step(int limit) {
  DF_CHECK(limit >= 1, "reference sequence: a step emits at least one token");
  const size_t before = tokens_.size();
  if (cache_.length == 0) {
    const std::vector<float> logits = decoder_.forward(tokens_, cache_);
    const size_t vocab = decoder_.config().vocab_size;
    choose(std::span(logits).subspan(logits.size() - vocab));
    return std::span(tokens_).subspan(before);
  }
  Proposal proposal;
  if (drafter_) proposal = drafter_->propose(tokens_, limit - 1);
  const int32_t last = tokens_.back();
  // choose() appends each row's token, so row i samples after the context and drafts[0, i).
  const std::vector<int32_t> emitted = verify_on_reference(
      decoder_, cache_, last, proposal.tokens, [&](int, std::span<float> logits) { return choose(logits); });
  if (!proposal.tokens.empty()) {
    drafted_ += static_cast<long>(proposal.tokens.size());
    accepted_ += accepted_count(emitted);
    drafter_->record(static_cast<int>(proposal.tokens.size()), accepted_count(emitted));
  }
  return std::span(tokens_).subspan(before);
}

}  // namespace deepfuse::speculative
