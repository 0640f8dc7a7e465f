#include "server/batching/reference_backend.hpp"

#include <string>

#include "deepfuse/error.hpp"
#include "reference/parallel.hpp"
#include "server/api_error.hpp"
#include "server/batching/token_choice.hpp"

namespace deepfuse::server {

using batching::KvBlockPool;

namespace {

int default_pages(const batching::SchedulerOptions& s) {
  return s.max_batch * KvBlockPool::pages_for(s.max_context);
}

// One unit of a step: tokens[first, first + count) of a sequence, the last one sampled or not.
struct Work {
  batching::Sequence* sequence;
  int first;
  int count;
  bool samples;
};

}  // namespace

ReferenceBackend::ReferenceBackend(std::unique_ptr<reference::Decoder> decoder, ReferenceBackendOptions options)
    : decoder_(std::move(decoder)),
      options_(options),
      pool_(options.kv_pages > 0 ? options.kv_pages : default_pages(options.scheduler), options.prefix_caching),
      scheduler_(options.scheduler, pool_),
      stored_blocks_(pool_.total_pages()) {
  DF_CHECK(options.scheduler.max_context <= decoder_->config().max_position_embeddings,
           "--max-context " + std::to_string(options.scheduler.max_context) + " is beyond the model's " +
               "max_position_embeddings (" + std::to_string(decoder_->config().max_position_embeddings) + ")");
}

int ReferenceBackend::vocab_size() const { return decoder_->config().vocab_size; }

void ReferenceBackend::check(const GenerationSpec& spec) const {
  const int tokens = static_cast<int>(spec.prompt.size()) + spec.max_new_tokens;
  if (KvBlockPool::pages_for(tokens) > pool_.total_pages())
    throw ApiError::bad_field("max_tokens", "the prompt and max_tokens need " + std::to_string(tokens) +
                                                " tokens of KV cache; the whole cache holds " +
                                                std::to_string(pool_.total_pages() * KvBlockPool::block_tokens()));
}

void ReferenceBackend::add(SequenceKey key, GenerationSpec spec) {
  scheduler_.add(key, {spec.prompt, spec.max_new_tokens, spec.stop_ids, 0});
  specs_.emplace(key, std::move(spec));
}

void ReferenceBackend::cancel(SequenceKey key) {
  scheduler_.cancel(key);
  specs_.erase(key);
  caches_.erase(key);
}

void ReferenceBackend::restore_cache(const batching::Sequence& sequence, int first) {
  reference::KvCache& cache = caches_.try_emplace(sequence.key, decoder_->new_cache()).first->second;
  if (cache.length == first) return;
  if (cache.length > first) cache = decoder_->new_cache();  // preempted: its pages went back
  const ModelConfig& c = decoder_->config();
  const int block = KvBlockPool::block_tokens();
  const size_t block_floats = static_cast<size_t>(block) * c.num_key_value_heads * c.head_dim;
  DF_CHECK(cache.length % block == 0 && first % block == 0, "internal: prefix-cache restore not on block bounds");
  for (int b = cache.length / block; b < first / block; ++b) {
    const std::vector<float>& stored = stored_blocks_[sequence.pages[b]];
    for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
      const float* keys = stored.data() + (2 * layer) * block_floats;
      cache.keys[layer].insert(cache.keys[layer].end(), keys, keys + block_floats);
      cache.values[layer].insert(cache.values[layer].end(), keys + block_floats, keys + 2 * block_floats);
    }
  }
  cache.length = first;
}

void ReferenceBackend::store_block(const batching::RegisteredBlock& block) {
  const reference::KvCache& cache = caches_.at(block.key);
  const ModelConfig& c = decoder_->config();
  const size_t block_floats = static_cast<size_t>(KvBlockPool::block_tokens()) * c.num_key_value_heads * c.head_dim;
  const size_t block_index = block.block;
  std::vector<float>& stored = stored_blocks_[block.page];
  stored.resize(2 * c.num_hidden_layers * block_floats);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const size_t from = block_index * block_floats;
    std::copy_n(cache.keys[layer].begin() + from, block_floats, stored.begin() + (2 * layer) * block_floats);
    std::copy_n(cache.values[layer].begin() + from, block_floats, stored.begin() + (2 * layer + 1) * block_floats);
  }
}

std::vector<SequenceEvent> ReferenceBackend::step() {
  const batching::StepPlan plan = scheduler_.schedule(batching::Phase::both);
  std::vector<Work> works;
  for (const batching::PrefillChunk& c : plan.prefill) works.push_back({c.sequence, c.first, c.count, c.samples});
  for (const batching::DecodeRow& d : plan.decode) works.push_back({d.sequence, d.position, 1, true});
  for (const Work& work : works) restore_cache(*work.sequence, work.first);
  // Each sequence on its own cache: the forward passes are independent and run side by side.
  std::vector<std::vector<float>> logits(works.size());
  std::vector<reference::KvCache*> caches;
  for (const Work& work : works) caches.push_back(&caches_.at(work.sequence->key));
  reference::parallel_for(works.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const Work& w = works[i];
      logits[i] = decoder_->forward(std::span(w.sequence->tokens).subspan(w.first, w.count), *caches[i]);
    }
  });
  for (const batching::RegisteredBlock& block : scheduler_.complete(plan)) store_block(block);

  std::vector<SequenceEvent> events;
  const size_t vocab = decoder_->config().vocab_size;
  for (size_t i = 0; i < works.size(); ++i) {
    if (!works[i].samples) continue;
    batching::Sequence& s = *works[i].sequence;
    const GenerationSpec& spec = specs_.at(s.key);
    const std::span<float> last(logits[i].data() + logits[i].size() - vocab, vocab);
    const std::span<const int32_t> generated(s.tokens.data() + s.first_generated, s.generated());
    const TokenChoice choice = choose_token(last, spec, s.tokens, generated, static_cast<uint64_t>(s.generated()));
    SequenceEvent event;
    event.key = s.key;
    event.id = choice.id;
    event.logprob = choice.logprob;
    event.top = choice.top;
    const batching::Report report = scheduler_.report(s, choice.id);  // may destroy s
    for (const batching::RegisteredBlock& block : report.registered) store_block(block);
    event.cached_tokens = report.cached_tokens;
    event.end = end_of(report.finish);
    if (event.end != SequenceEnd::none) {
      caches_.erase(event.key);
      specs_.erase(event.key);
    }
    events.push_back(std::move(event));
  }
  return events;
}

BackendGauges ReferenceBackend::gauges() const { return scheduler_.stats(); }

}  // namespace deepfuse::server
