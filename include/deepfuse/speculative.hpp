// Speculative decoding without a draft model (issue 54): which drafter proposes the tokens a
// verify step checks. One table (deepfuse/choice_table.hpp): its names are what `--speculative`
// takes on generate, serve and bench decode, and what their help lists.
#pragma once

#include <array>

#include "deepfuse/choice_table.hpp"

namespace deepfuse {

enum class SpeculativeChoice { off, ngram, suffix };
template <>
struct ChoiceTable<SpeculativeChoice> {
  static constexpr std::array rows{
      ChoiceRow<SpeculativeChoice>{SpeculativeChoice::off, "off", "one token per step, no drafts"},
      ChoiceRow<SpeculativeChoice>{SpeculativeChoice::ngram, "ngram",
                                   "prompt lookup: what followed the longest recent n-gram match in the sequence"},
      ChoiceRow<SpeculativeChoice>{SpeculativeChoice::suffix, "suffix",
                                   "suffix automata over the sequence and a bounded cache of recent requests' "
                                   "outputs (a repeated request is proposed whole)"},
  };
};
static_assert(choice_table_well_formed<SpeculativeChoice>());

// The default until the CUDA verify step is measured (issue 54): off.
inline constexpr SpeculativeChoice kDefaultSpeculative = SpeculativeChoice::off;

}  // namespace deepfuse
