// What the serving loop asks of a backend: take sequences, drop them, run one step at a time.
//
// Two backends implement it: ReferenceBackend (the CPU reference decoder) and EngineBackend (the
// CUDA engine). Both run the same step scheduler (src/batching: chunked prefill, preemption, the
// prefix cache). The serving loop calls every method from its one thread, except check(), which
// request threads call before they submit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepfuse/finish_reason.hpp"
#include "deepfuse/logprobs.hpp"
#include "deepfuse/scheduling_stats.hpp"
#include "deepfuse/token_constraint.hpp"
#include "deepfuse/sampling_params.hpp"

namespace deepfuse::server {

// Chosen by the server, unique for the process.
using SequenceKey = uint64_t;

// One sequence to generate: the prompt ids, how to sample, when to stop.
struct GenerationSpec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_new_tokens = 16;
  std::vector<int32_t> stop_ids;      // generation ends after producing one of these
  float presence_penalty = 0.0f;      // OpenAI's penalties, over the tokens generated so far
  float frequency_penalty = 0.0f;
  int top_logprobs = -1;              // -1: no logprobs; otherwise the chosen token's and this many alternatives'
  bool speculative = true;            // false: this request opts out of the server's --speculative
  // Structured output: the grammar this sequence's tokens must follow (its own state; null: free),
  // and the request field that asked for it (errors name it).
  std::shared_ptr<TokenConstraint> constraint;
  std::string constraint_field;
};

enum class SequenceEnd { none, stop_token, max_tokens, context_length, cancelled, failed };

// How the scheduler's finish reads here.
inline SequenceEnd end_of(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return SequenceEnd::none;
    case FinishReason::stop_token: return SequenceEnd::stop_token;
    case FinishReason::max_tokens: return SequenceEnd::max_tokens;
    case FinishReason::context_length: return SequenceEnd::context_length;
    case FinishReason::kv_cache_full: break;  // never reported: the scheduler preempts and requeues
  }
  return SequenceEnd::failed;
}

using TokenLogprob = deepfuse::TokenLogprob;  // an alternative token and its logprob

// What one step produced for one sequence.
struct SequenceEvent {
  SequenceKey key = 0;
  int32_t id = -1;                    // the new token; -1 when the sequence ended without one
  SequenceEnd end = SequenceEnd::none;
  float logprob = 0.0f;               // when the spec asked for logprobs
  std::vector<TokenLogprob> top;
  int cached_tokens = -1;             // with a sequence's first token: prompt tokens the prefix cache served
  std::string error;                  // with SequenceEnd::failed
};

// Gauges and counters the backend keeps, for /metrics: its step scheduler's, and its speculative
// decoding's (draft tokens verified, and of those accepted).
struct BackendGauges : SchedulingStats {
  uint64_t draft_tokens = 0;
  uint64_t accepted_draft_tokens = 0;
};

class ServingBackend {
 public:
  virtual ~ServingBackend() = default;

  virtual std::string name() const = 0;  // "reference" or "cuda"
  virtual int max_context() const = 0;   // prompt and generated tokens together
  virtual int vocab_size() const = 0;
  // Throws ApiError (400) when the sequence could never run on this backend: more KV pages than
  // the cache has, an option the backend lacks. Safe to call from any thread.
  virtual void check(const GenerationSpec& spec) const = 0;

  virtual void add(SequenceKey key, GenerationSpec spec) = 0;
  // Drops the sequence and frees its pages now. Nothing more is reported for it.
  virtual void cancel(SequenceKey key) = 0;
  virtual bool has_work() const = 0;
  // One step: at most max_batch sequences advance by one token (or a prefill chunk), or, verifying
  // drafts, by several: one event per token, in order.
  virtual std::vector<SequenceEvent> step() = 0;
  virtual BackendGauges gauges() const = 0;
};

}  // namespace deepfuse::server
