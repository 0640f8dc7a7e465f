// How many drafts a sequence may propose next step, from how its recent drafts fared: doubles
// after a step that accepted every draft, falls to what was accepted plus one after a partial
// one, halves after a miss, and after repeated misses sits out the next 2, 4, ... 64 tokens (the
// back-off resets on any accept). A miss costs verify rows; at batch 16 they are not free (issue 54).
// So does a step the engine read back before launching the next (instead of launching it ahead)
// because the sequence might draft, when it then proposed nothing: record_empty counts it as a
// miss toward sitting out (docs/runtime.md, "Launched ahead while nothing drafts").
//
// The sit-out is counted in the sequence's tokens, not in calls: a step that sits out emits one
// token, and steps that never ask (launched ahead of the host) still count.
#pragma once

namespace deepfuse::speculative {

class DraftBudget {
 public:
  explicit DraftBudget(int max_draft);

  // Drafts allowed at a step that drafts after the sequence's first `length` tokens (0 while
  // sitting out). Never decreases as `length` grows.
  int allowance(int length) const;
  // The verify's result for `drafted` (> 0) drafts proposed after `length` tokens, `accepted` of them.
  void record(int length, int drafted, int accepted);
  // A step after `length` tokens that was waited for and proposed nothing: a miss, the cap kept.
  void record_empty(int length);

  int cap() const { return cap_; }

 private:
  // One more miss in a row; the step after it drafts after `next_length` tokens.
  void missed(int next_length);

  int max_draft_;
  int cap_;
  int misses_ = 0;     // consecutive steps that cost something and accepted nothing
  int resume_at_ = 0;  // sitting out while the sequence is shorter than this
};

}  // namespace deepfuse::speculative
