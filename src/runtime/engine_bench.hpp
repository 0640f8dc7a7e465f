// Benchmark-only entry points into an Engine, kept out of the public API (deepfuse/engine.hpp):
// `deepfuse bench decode` and the runtime's tests use them to time decode at long contexts
// without prefilling them, and to time the captured step alone.
#pragma once

#include <vector>

#include "deepfuse/engine.hpp"
#include "runtime/speculation.hpp"

namespace deepfuse::runtime {

struct AllReduceTiming;

class EngineBench {
 public:
  // A running sequence whose first `context` positions count as already in the KV
  // cache (pages allocated, contents whatever they hold, last token id 0), so decode at 32k
  // context needs no 32k prefill. Greedy sampling. Its first step() decodes at position
  // `context`; needs a free decode row and context + 1 + max_new_tokens <= max_context.
  static SequenceId add_prefilled(Engine& engine, int context, int max_new_tokens);
  // GPU milliseconds per decode step with no host work between steps: the captured
  // step of the running sequences' bucket replayed `replays` times back to back; 0 before that
  // bucket's first step() or without CUDA graphs. The replays feed their own samples at the
  // latest step's positions, so those cache entries and the draw counters are left as the
  // replays wrote them; the ids the next step() feeds are kept.
  static double decode_replay_ms(Engine& engine, int replays);
  // Tensor parallel: the all-reduce times measured at engine start, per decode bucket (empty or
  // zero for one GPU).
  static const std::vector<AllReduceTiming>& all_reduce_timings(const Engine& engine);
  // Tests: the KV pools, the forward pass's activations, logits and inputs filled with NaN (16-bit
  // 0x7fc0, which as an id is out of the vocabulary), so whatever a step reads that no step wrote
  // shows in its tokens. Only with no sequence added yet.
  static void poison_buffers(Engine& engine);
  // Speculative decoding (EngineOptions::speculative on): `source` proposes every sequence's
  // drafts instead of its drafter (a verify step of k random drafts for `bench decode`, drafts
  // that are mostly wrong or right for the tests). Empty: the drafters again. `outlook` says
  // when it may propose, for launching steps ahead (empty: it always may, so every step waits
  // for the read-back of the step before).
  static void set_draft_source(Engine& engine, DraftSource source, DraftOutlook outlook = {});

 private:
  static SequenceId add_prefilled(Engine::Impl& s, int context, int max_new_tokens);
  static double decode_replay_ms(Engine::Impl& s, int replays);
};

}  // namespace deepfuse::runtime
