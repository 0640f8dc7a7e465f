// The verify step's acceptance rule and its run on the reference decoder.
//
// A verify pass feeds a sequence's last token and its k drafts; row i's logits give the token
// after the context and drafts[0, i). `choose(i)` picks row i's token with the sequence's own
// sampler and draw index (generated-so-far + i), exactly as a non-speculative step would; drafts
// are accepted while the chosen token equals them, and the first token that differs (or the
// token after the last draft) is emitted too. So a step emits 1 to k + 1 tokens.
//
// Greedy, this is "the longest prefix of drafts equal to the argmax". Sampled, it is exact
// rejection sampling for a draft that proposes one token with certainty (q = a point mass on d):
// the standard rule accepts d with probability min(1, p(d) / q(d)) = p(d) and otherwise draws from
// norm(max(0, p - q)) = p without d. Drawing y from p by inverse CDF at the step's uniform and
// accepting iff y == d does both at once: P(accept) = p(d), and a rejected y is distributed as p
// restricted to y != d. Each emitted token is thus distributed exactly as without speculation, and
// with the same seed it is the very token a non-speculative run draws.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "deepfuse/reference_decoder.hpp"

namespace deepfuse::speculative {

// The tokens a verify pass emits: accepted drafts, then one more. `choose(row)` may read the
// tokens emitted so far (they are drafts[0, row)).
std::vector<int32_t> accept_drafts(std::span<const int32_t> drafts, const std::function<int32_t(int row)>& choose);

// Drafts accepted among `emitted` (all but its last token).
inline int accepted_count(const std::vector<int32_t>& emitted) { return static_cast<int>(emitted.size()) - 1; }

// One verify pass on the reference decoder for a sequence whose cache holds every position before
// `last`: runs last and the drafts, picks row i's token with choose(i, logits of row i), then
// rolls the cache back to the fed tokens that were accepted (last and the accepted drafts).
std::vector<int32_t> verify_on_reference(const reference::Decoder& decoder, reference::KvCache& cache, int32_t last,
                                         std::span<const int32_t> drafts,
                                         const std::function<int32_t(int row, std::span<float> logits)>& choose);

}  // namespace deepfuse::speculative
