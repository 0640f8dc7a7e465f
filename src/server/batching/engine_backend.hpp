// The GPU backend of the server: the CUDA engine (include/deepfuse/engine.hpp), whose steps the
// step scheduler (src/batching, the same one the CPU backend runs) decides: chunked prefill under
// EngineOptions::prefill_tokens_per_step (serve sets it from --max-step-tokens), the prefix cache
// (EngineOptions::prefix_caching), and preemption of the youngest sequence when KV pages run out,
// which then recomputes its prompt and tokens inside the engine. This wrapper maps the server's
// keys to the engine's sequence ids and its gauges to the engine's scheduling stats.
// Logprobs, presence/frequency penalties and structured output's grammars are the engine's
// (SequenceRequest), with the CPU backend's semantics (token_choice.hpp).
#pragma once

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
  bool has_work() const override { return !key_of_.empty(); }
  std::vector<SequenceEvent> step() override;
  BackendGauges gauges() const override;

 private:
  std::unique_ptr<Engine> engine_;
  int max_context_;
  int kv_pages_total_;
  std::unordered_map<SequenceId, SequenceKey> key_of_;
  std::unordered_map<SequenceKey, SequenceId> engine_id_of_;
};

}  // namespace deepfuse::server
