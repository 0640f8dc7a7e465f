#include "speculative/draft_budget.hpp"

#include <algorithm>
#include <string>

#include "deepfuse/error.hpp"

namespace deepfuse::speculative {

DraftBudget::DraftBudget(int max_draft) : max_draft_(max_draft), cap_(max_draft) {
  DF_CHECK(max_draft >= 0, "draft budget: max_draft must not be negative, got " + std::to_string(max_draft));
}

int DraftBudget::allowance(int length) const { return length < resume_at_ ? 0 : cap_; }

void DraftBudget::record(int length, int drafted, int accepted) {
  DF_CHECK(drafted > 0 && accepted >= 0 && accepted <= drafted,
           "draft budget: " + std::to_string(accepted) + " of " + std::to_string(drafted) + " drafts accepted");
  if (accepted == drafted) {
    cap_ = std::min(max_draft_, std::max(1, cap_) * 2);
    misses_ = 0;
  } else if (accepted > 0) {
    cap_ = std::min(max_draft_, accepted + 1);
    misses_ = 0;
  } else {
    cap_ = std::max(1, cap_ / 2);
    missed(length + 1);  // the verify emitted one token
  }
}

void DraftBudget::record_empty(int length) { missed(length + 1); }

void DraftBudget::missed(int next_length) {
  ++misses_;
  if (misses_ >= 2) resume_at_ = next_length + std::min(64, 1 << std::min(misses_ - 1, 6));
}

}  // namespace deepfuse::speculative
