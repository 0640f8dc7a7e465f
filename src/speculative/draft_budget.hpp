// How many drafts a sequence may propose next step, from how its recent drafts fared: doubles
// after a step that accepted every draft, falls to what was accepted plus one after a partial
// one, halves after a miss, and after repeated misses sits out 2, 4, ... 64 steps (the skip
// resets on any accept). A miss costs verify rows; at batch 16 they are not free (issue 54).
#pragma once

namespace deepfuse::speculative {

class DraftBudget {
 public:
  explicit DraftBudget(int max_draft);

  // Drafts allowed this step (0 while backing off); a call is one step.
  int allowance();
  // The verify's result for a step that drafted `drafted` (> 0) tokens.
  void record(int drafted, int accepted);

  int cap() const { return cap_; }

 private:
  int max_draft_;
  int cap_;
  int misses_ = 0;  // consecutive verify steps that accepted nothing
  int skip_ = 0;    // steps left to sit out
};

}  // namespace deepfuse::speculative
