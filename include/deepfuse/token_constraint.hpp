// A sequence's constraint on the tokens it may generate (structured output): before each token
// the sampler asks for the set of allowed ids as a bitmask (deepfuse/token_bitmask.hpp), and
// after it tells the constraint which id was sampled. The server's grammars implement it
// (src/server/grammar, xgrammar); backends apply it without knowing what it constrains to.
#pragma once

#include <cstdint>
#include <span>

namespace deepfuse {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The ids allowed next, into token_bitmask_words(vocab) words. At least one id stays allowed (a
  // stop id once the constrained text is complete).
  virtual void fill_next_mask(std::span<uint32_t> mask) = 0;
  // The sequence generated `id` (an id the last mask allowed). Throws deepfuse::Error otherwise.
  virtual void accept(int32_t id) = 0;
};

}  // namespace deepfuse
