// One sequence generating on the reference decoder, one token per step or, with a drafter, a
// verify step of its drafts (verify.hpp): what `generate` runs on the CPU and what the tests
// compare speculative against non-speculative output with. Sampling is reference::sample with the
// sequence's params, the whole sequence as the repetition penalty's `previous`, draw index = tokens
// generated before.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/sampling_params.hpp"
#include "speculative/drafter.hpp"

namespace deepfuse::speculative {

class ReferenceSequence {
 public:
  // `drafter` (may be null: no speculation) must outlive the sequence.
  ReferenceSequence(const reference::Decoder& decoder, std::vector<int32_t> prompt, SamplingParams sampling,
                    SequenceDrafter* drafter);

  // The first call prefills the prompt and samples one token; each later call is a decode step
  // (a verify step when the drafter proposes) emitting 1 .. limit tokens, limit >= 1.
  std::span<const int32_t> step(int limit);

  const std::vector<int32_t>& tokens() const { return tokens_; }  // the prompt, then every emitted token
  int generated() const { return static_cast<int>(tokens_.size()) - prompt_length_; }
  long drafted() const { return drafted_; }
  long accepted() const { return accepted_; }

 private:
  int32_t choose(std::span<const float> logits);

  const reference::Decoder& decoder_;
  SamplingParams sampling_;
  SequenceDrafter* drafter_;
  reference::KvCache cache_;
  std::vector<int32_t> tokens_;
  int prompt_length_;
  long drafted_ = 0, accepted_ = 0;
};

}  // namespace deepfuse::speculative
