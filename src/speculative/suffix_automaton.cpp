#include "speculative/suffix_automaton.hpp"

#include <algorithm>

namespace deepfuse::speculative {

SuffixAutomaton::SuffixAutomaton() { clear(); }

void SuffixAutomaton::clear() {
  states_.assign(1, State{});
  last_ = 0;
  length_ = 0;
}

int SuffixAutomaton::find(int state, int32_t token) const {
  const auto& next = states_[state].next;
  const auto it = std::lower_bound(next.begin(), next.end(), token,
                                   [](const std::pair<int32_t, int>& e, int32_t t) { return e.first < t; });
  return it != next.end() && it->first == token ? it->second : -1;
}

void SuffixAutomaton::set(int state, int32_t token, int target) {
  auto& next = states_[state].next;
  const auto it = std::lower_bound(next.begin(), next.end(), token,
                                   [](const std::pair<int32_t, int>& e, int32_t t) { return e.first < t; });
  if (it != next.end() && it->first == token) it->second = target;
  else next.insert(it, {token, target});
}

void SuffixAutomaton::push(int32_t token) {
  ++length_;
  const int current = static_cast<int>(states_.size());
  states_.push_back({states_[last_].length + 1, -1, length_, {}});
  int p = last_;
  while (p != -1 && find(p, token) < 0) {
    set(p, token, current);
    p = states_[p].link;
  }
  if (p == -1) {
    states_[current].link = 0;
  } else {
    const int q = find(p, token);
    if (states_[p].length + 1 == states_[q].length) {
      states_[current].link = q;
    } else {
      // q's class splits: the strings up to length(p) + 1 move to a clone that keeps q's
      // transitions and first occurrence.
      const int clone = static_cast<int>(states_.size());
      State copy = states_[q];
      copy.length = states_[p].length + 1;
      states_.push_back(std::move(copy));
      while (p != -1 && find(p, token) == q) {
        set(p, token, clone);
        p = states_[p].link;
      }
      states_[q].link = clone;
      states_[current].link = clone;
    }
  }
  last_ = current;
}

SuffixAutomaton::Match SuffixAutomaton::longest_suffix(std::span<const int32_t> pattern) const {
  int state = 0, length = 0;
  for (const int32_t token : pattern) {
    int target = find(state, token);
    while (target < 0 && state != 0) {
      state = states_[state].link;
      length = states_[state].length;
      target = find(state, token);
    }
    if (target < 0) {
      length = 0;  // not even this token occurs
    } else {
      state = target;
      ++length;
    }
  }
  return {length, length > 0 ? states_[state].first_end : 0};
}

}  // namespace deepfuse::speculative
