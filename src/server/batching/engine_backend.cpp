#include "server/batching/engine_backend.hpp"

#include <algorithm>
#include <string>

#include "deepfuse/error.hpp"
#include "server/api_error.hpp"
#include "runtime/kv_block_pool.hpp"

namespace deepfuse::server {

EngineBackend::EngineBackend(std::unique_ptr<Engine> engine)
    : engine_(std::move(engine)),
      max_context_(engine_->options().max_context > 0 ? engine_->options().max_context
                                                       : engine_->config().max_position_embeddings),
      kv_pages_total_(engine_->stats().kv_pages_total) {
  refresh_gauges();
}

void EngineBackend::check(const GenerationSpec& spec) const {
  const int tokens = static_cast<int>(spec.prompt.size()) + spec.max_new_tokens;
  if (runtime::KvBlockPool::pages_for(tokens) > kv_pages_total_)
    throw ApiError::bad_field("max_tokens", "the prompt and max_tokens need " + std::to_string(tokens) +
                                                " tokens of KV cache; the whole cache holds " +
                                                std::to_string(kv_pages_total_ * runtime::KvBlockPool::block_tokens()));
}

void EngineBackend::submit(Tracked tracked) {
  SequenceRequest request;
  request.prompt = tracked.spec.prompt;
  request.prompt.insert(request.prompt.end(), tracked.generated.begin(), tracked.generated.end());
  request.sampling = tracked.spec.sampling;
  request.max_new_tokens = tracked.spec.max_new_tokens - static_cast<int>(tracked.generated.size());
  request.stop_ids = tracked.spec.stop_ids;
  request.presence_penalty = tracked.spec.presence_penalty;
  request.frequency_penalty = tracked.spec.frequency_penalty;
  request.top_logprobs = tracked.spec.top_logprobs;
  request.prior_generated = static_cast<int>(tracked.generated.size());  // they keep counting for the penalties
  const SequenceId id = engine_->add_sequence(request);
  engine_id_of_[tracked.key] = id;
  by_engine_id_.emplace(id, std::move(tracked));
}

void EngineBackend::add(SequenceKey key, GenerationSpec spec) { submit({key, std::move(spec), {}, false}); }

void EngineBackend::cancel(SequenceKey key) {
  const auto it = engine_id_of_.find(key);
  if (it == engine_id_of_.end()) return;
  engine_->remove_sequence(it->second);
  by_engine_id_.erase(it->second);
  engine_id_of_.erase(it);
  // No step may follow (the last sequence gone): /metrics must show it gone and its pages back now.
  refresh_gauges();
}

namespace {

SequenceEnd end_of(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return SequenceEnd::none;
    case FinishReason::stop_token: return SequenceEnd::stop_token;
    case FinishReason::max_tokens: return SequenceEnd::max_tokens;
    case FinishReason::context_length: return SequenceEnd::context_length;
    case FinishReason::kv_cache_full: break;
  }
  return SequenceEnd::failed;
}

}  // namespace

std::vector<SequenceEvent> EngineBackend::step() {
  std::vector<SequenceEvent> events;
  for (const StepToken& token : engine_->step()) {
    const auto it = by_engine_id_.find(token.sequence);
    if (it == by_engine_id_.end()) continue;  // cancelled since its step was launched
    Tracked& tracked = it->second;
    if (token.id >= 0) {
      SequenceEvent event;
      event.key = tracked.key;
      event.id = token.id;
      event.logprob = token.logprob;
      event.top = token.top_logprobs;
      if (!tracked.reported_first) {
        event.cached_tokens = std::max(token.cached_tokens, 0);
        gauges_.prefix_cache_queried_tokens += tracked.spec.prompt.size();
        gauges_.prefix_cache_hit_tokens += event.cached_tokens;
      }
      tracked.reported_first = true;
      tracked.generated.push_back(token.id);
      event.end = token.finish == FinishReason::kv_cache_full ? SequenceEnd::none : end_of(token.finish);
      events.push_back(std::move(event));
    }
    if (token.finish == FinishReason::none) continue;
    Tracked done = std::move(tracked);
    by_engine_id_.erase(it);
    engine_id_of_.erase(done.key);
    if (token.finish == FinishReason::kv_cache_full) {
      // Preempted: recompute it once pages are free (it waits in the engine's queue).
      ++gauges_.preemptions;
      submit(std::move(done));
    }
  }
  // Engine::stats asks the driver for memory figures: a few times a second is plenty for /metrics.
  // The last step before idling refreshes too, so an idle server shows its pages back.
  if (by_engine_id_.empty() || Clock::now() - gauges_refreshed_ > std::chrono::milliseconds(100)) refresh_gauges();
  gauges_.running = static_cast<int>(by_engine_id_.size());
  return events;
}

void EngineBackend::refresh_gauges() {
  gauges_refreshed_ = Clock::now();
  const EngineStats stats = engine_->stats();
  gauges_.running = static_cast<int>(by_engine_id_.size());
  gauges_.waiting = 0;  // the engine's queue is not visible; queued sequences count as running
  gauges_.kv_pages_total = stats.kv_pages_total;
  gauges_.kv_pages_used = stats.kv_pages_total - stats.kv_pages_free;
  gauges_.kv_pages_cached = stats.kv_pages_cached;
}

}  // namespace deepfuse::server
