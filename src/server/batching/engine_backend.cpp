#include "server/batching/engine_backend.hpp"

#include <string>

#include "batching/kv_block_pool.hpp"
#include "server/api_error.hpp"

namespace deepfuse::server {

using batching::KvBlockPool;

EngineBackend::EngineBackend(std::unique_ptr<Engine> engine)
    : engine_(std::move(engine)),
      max_context_(engine_->options().max_context > 0 ? engine_->options().max_context
                                                       : engine_->config().max_position_embeddings),
      kv_pages_total_(engine_->scheduling_stats().kv_pages_total) {}

void EngineBackend::check(const GenerationSpec& spec) const {
  const int tokens = static_cast<int>(spec.prompt.size()) + spec.max_new_tokens;
  if (KvBlockPool::pages_for(tokens) > kv_pages_total_)
    throw ApiError::bad_field("max_tokens", "the prompt and max_tokens need " + std::to_string(tokens) +
                                                " tokens of KV cache; the whole cache holds " +
                                                std::to_string(kv_pages_total_ * KvBlockPool::block_tokens()));
}

void EngineBackend::add(SequenceKey key, GenerationSpec spec) {
  SequenceRequest request;
  request.prompt = std::move(spec.prompt);
  request.sampling = spec.sampling;
  request.max_new_tokens = spec.max_new_tokens;
  request.stop_ids = std::move(spec.stop_ids);
  request.presence_penalty = spec.presence_penalty;
  request.frequency_penalty = spec.frequency_penalty;
  request.top_logprobs = spec.top_logprobs;
  // A constrained sequence is never drafted: each verified row's mask would need the rows before
  // it chosen first (docs/runtime.md, "Speculative decoding").
  request.speculative = spec.speculative && !spec.constraint;
  request.constraint = std::move(spec.constraint);  // the engine fills its masks and feeds it the tokens
  const SequenceId id = engine_->add_sequence(request);
  engine_id_of_[key] = id;
  key_of_[id] = key;
}

void EngineBackend::cancel(SequenceKey key) {
  const auto it = engine_id_of_.find(key);
  if (it == engine_id_of_.end()) return;
  engine_->remove_sequence(it->second);
  key_of_.erase(it->second);
  engine_id_of_.erase(it);
}

std::vector<SequenceEvent> EngineBackend::step() {
  std::vector<SequenceEvent> events;
  for (StepToken& token : engine_->step()) {
    const auto it = key_of_.find(token.sequence);
    if (it == key_of_.end()) continue;  // cancelled since its step was launched
    SequenceEvent event;
    event.key = it->second;
    event.id = token.id;
    event.logprob = token.logprob;
    event.top = std::move(token.top_logprobs);
    event.cached_tokens = token.cached_tokens;
    event.end = end_of(token.finish);
    if (event.end != SequenceEnd::none) {
      engine_id_of_.erase(it->second);
      key_of_.erase(it);
    }
    events.push_back(std::move(event));
  }
  return events;
}

BackendGauges EngineBackend::gauges() const {
  BackendGauges gauges;
  static_cast<SchedulingStats&>(gauges) = engine_->scheduling_stats();
  const Engine::SpeculativeCounts counts = engine_->speculative_counts();
  gauges.draft_tokens = counts.draft_tokens;
  gauges.accepted_draft_tokens = counts.accepted_draft_tokens;
  return gauges;
}

}  // namespace deepfuse::server
