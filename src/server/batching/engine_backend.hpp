// The GPU backend of the server: the CUDA engine (include/deepfuse/engine.hpp), which batches
// its own decode steps (CUDA graphs per batch bucket, paged KV cache, chunked prefill), with
// sequences joining and leaving between steps.
//
// The per-step budget is the engine's EngineOptions::prefill_tokens_per_step (serve sets it from
// --max-step-tokens): a long prompt is prefilled over several steps while the others decode. The
// prefix cache is the engine's too (EngineOptions::prefix_caching: full prompt blocks share pages).
// What the engine itself does not do, this wrapper does where it can:
//   - KV exhaustion: when a step's tokens need more pages than are free, the engine ends the
//     youngest decoding sequence with kv_cache_full (its pages go back); the wrapper requeues it
//     (prompt + the tokens it generated as SequenceRequest::prior_generated, the rest of its
//     budget) so it recomputes once pages free up; its penalty counts and draw index carry on.
// Logprobs and presence/frequency penalties are the engine's (SequenceRequest), with the CPU
// backend's semantics (token_choice.hpp).
#pragma once

#include <chrono>
#include <memory>
#include <unordered_map>
#include <vector>

#include "deepfuse/engine.hpp"
#include "server/batching/serving_backend.hpp"

namespace deepfuse::server {

class EngineBackend final : public ServingBackend {
 public:
  explicit EngineBackend(std::unique_ptr<Engine> engine);

  std::string name() const override { return "cuda"; }
  int max_context() const override { return max_context_; }
  int vocab_size() const override { return engine_->config().vocab_size; }
  void check(const GenerationSpec& spec) const override;
  void add(SequenceKey key, GenerationSpec spec) override;
  void cancel(SequenceKey key) override;
  bool has_work() const override { return !by_engine_id_.empty(); }
  std::vector<SequenceEvent> step() override;
  BackendGauges gauges() const override { return gauges_; }

 private:
  struct Tracked {
    SequenceKey key;
    GenerationSpec spec;
    std::vector<int32_t> generated;
    bool reported_first = false;
  };
  // Queues the sequence on the engine (again, after a preemption: with what it generated).
  void submit(Tracked tracked);
  void refresh_gauges();

  std::unique_ptr<Engine> engine_;
  int max_context_;
  int kv_pages_total_;
  std::unordered_map<SequenceId, Tracked> by_engine_id_;
  std::unordered_map<SequenceKey, SequenceId> engine_id_of_;
  BackendGauges gauges_;
  using Clock = std::chrono::steady_clock;
  Clock::time_point gauges_refreshed_;
};

}  // namespace deepfuse::server
