// `bench decode`'s speculative decoding rows (issue 54), on the same random-weight presets:
//   verify   per (batch, context): a step in which every sequence verifies K random drafts
//            (`--verify-drafts K`; random tokens, so each step emits one token) against a
//            one-token step of the same engine (speculation on, no drafts proposed), both read
//            back before the next launch as steps that may verify drafts are;
//   requests per batch, with `--speculative` not off: decode tokens/s of greedy requests with the
//            drafter against the same requests on an engine without speculation (steps launched
//            ahead): "repeat", the second of two identical rounds (its drafts from the suffix
//            cache), and "fresh", new random prompts (drafts seldom right). "ahead": how many of
//            the speculative engine's step() calls launched a step ahead (no drafter could
//            propose at it) rather than waiting for the read-back.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "bench/decode_bench.hpp"
#include "bench/timing.hpp"

namespace deepfuse::bench {

struct SpeculativeReport {
  Table verify{{"arch", "batch", "context", "drafts", "one-token ms", "verify ms", "verify / one-token"}};
  Table requests{{"arch", "batch", "scenario", "drafter", "tok/s plain", "tok/s speculative", "speedup",
                  "drafts accepted", "ahead"}};
  nlohmann::json rows = nlohmann::json::array();
};

// Tokens each sequence of a verify case generates (room for its warm-up and timed steps of both
// kinds), beyond its context: what the engine's max_context must hold.
int verify_case_tokens(const DecodeBenchOptions& options);

// The rows of `arch` (engine options as bench decode builds them: `base`; `config` its model).
void run_speculative_arch(const std::string& arch, const ModelConfig& config, const EngineOptions& base,
                          const DecodeBenchOptions& options, SpeculativeReport& report);

}  // namespace deepfuse::bench
