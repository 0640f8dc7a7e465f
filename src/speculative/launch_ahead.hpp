// Whether the engine's next decode step may verify drafts, from what each running sequence
// brings to it (docs/runtime.md, "Launched ahead while nothing drafts"). A verify step drafts
// after every fed row's last token, so it waits until the step in flight is read back; a step
// that can verify nothing is launched ahead of the host, as without speculation.
#pragma once

#include <span>

namespace deepfuse::speculative {

enum class NextStepDrafts {
  none,      // opted out, still prefilling, or its drafter cannot propose (may_propose_after_next)
  possible,  // its drafter may propose once it knows the token in flight
  blocks,    // penalties, logprobs or a grammar: a step feeding it verifies no drafts at all
};

// Some sequence possible and none blocking.
bool next_step_may_draft(std::span<const NextStepDrafts> sequences);

}  // namespace deepfuse::speculative
