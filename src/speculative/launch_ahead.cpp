#include "speculative/launch_ahead.hpp"

#include <algorithm>

namespace deepfuse::speculative {

bool next_step_may_draft(std::span<const NextStepDrafts> sequences) {
  auto any = [&](NextStepDrafts what) { return std::find(sequences.begin(), sequences.end(), what) != sequences.end(); };
  return any(NextStepDrafts::possible) && !any(NextStepDrafts::blocks);
}

}  // namespace deepfuse::speculative
