#include "server/batching/reference_backend.hpp"

#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/token_bitmask.hpp"
#include "reference/parallel.hpp"
#include "server/api_error.hpp"
#include "server/batching/token_choice.hpp"
#include "speculative/verify.hpp"

namespace deepfuse::server {

using batching::KvBlockPool;

namespace {

int default_pages(const batching::SchedulerOptions& s) {
  return s.max_batch * KvBlockPool::pages_for(s.max_context);
}

// One unit of a step: tokens[first, first + count) of a sequence, the last one sampled or not;
// a decode row's drafts are fed after its token, each row sampled (a verify).
struct Work {
  batching::Sequence* sequence;
  int first;
  int count;
  bool samples;
  std::vector<int32_t> drafts;

  std::vector<int32_t> fed() const {
    std::vector<int32_t> ids(sequence->tokens.begin() + first, sequence->tokens.begin() + first + count);
    ids.insert(ids.end(), drafts.begin(), drafts.end());
    return ids;
  }
};

}  // namespace

ReferenceBackend::ReferenceBackend(std::unique_ptr<reference::Decoder> decoder, ReferenceBackendOptions options)
    : decoder_(std::move(decoder)),
      options_(options),
      pool_(options.kv_pages > 0 ? options.kv_pages : default_pages(options.scheduler), options.prefix_caching),
      scheduler_(options.scheduler, pool_),
      stored_blocks_(pool_.total_pages()),
      suffix_cache_(options.suffix_cache) {
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
  drafters_.erase(key);
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

std::vector<int32_t> ReferenceBackend::draft(batching::DecodeRow& row) {
  batching::Sequence& s = *row.sequence;
  // A constrained sequence is not drafted: each row's mask would need the rows before it chosen.
  const GenerationSpec& spec = specs_.at(s.key);
  if (options_.speculative == SpeculativeChoice::off || !spec.speculative || spec.constraint) return {};
  speculative::SequenceDrafter& drafter =
      drafters_.try_emplace(s.key, options_.speculative, options_.drafter, &suffix_cache_).first->second;
  std::vector<int32_t> drafts = drafter.propose(s.tokens, options_.drafter.max_draft).tokens;
  drafts.resize(scheduler_.add_drafts(row, static_cast<int>(drafts.size())));
  return drafts;
}

std::vector<SequenceEvent> ReferenceBackend::step() {
  batching::StepPlan plan = scheduler_.schedule(batching::Phase::both);
  std::vector<Work> works;
  for (const batching::PrefillChunk& c : plan.prefill) works.push_back({c.sequence, c.first, c.count, c.samples, {}});
  for (batching::DecodeRow& d : plan.decode) works.push_back({d.sequence, d.position, 1, true, draft(d)});
  for (const Work& work : works) restore_cache(*work.sequence, work.first);
  // Each sequence on its own cache: the forward passes are independent and run side by side.
  std::vector<std::vector<float>> logits(works.size());
  std::vector<reference::KvCache*> caches;
  for (const Work& work : works) caches.push_back(&caches_.at(work.sequence->key));
  // A constrained sequence's next-token mask is computed on its worker, next to the other
  // sequences' forward passes (each constraint is its own sequence's: no two workers share one).
  std::vector<std::vector<uint32_t>> masks(works.size());
  reference::parallel_for(works.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      logits[i] = decoder_->forward(works[i].fed(), *caches[i]);
      TokenConstraint* constraint = specs_.at(works[i].sequence->key).constraint.get();
      if (!constraint || !works[i].samples) continue;
      masks[i].resize(token_bitmask_words(decoder_->config().vocab_size));
      constraint->fill_next_mask(masks[i]);
    }
  });
  for (const batching::RegisteredBlock& block : scheduler_.complete(plan)) store_block(block);

  std::vector<SequenceEvent> events;
  const size_t vocab = decoder_->config().vocab_size;
  for (size_t i = 0; i < works.size(); ++i) {
    if (!works[i].samples) continue;
    const size_t rows = 1 + works[i].drafts.size();  // the last ones
    emit(*works[i].sequence, std::span(logits[i]).last(rows * vocab), works[i].drafts, masks[i], *caches[i], events);
  }
  return events;
}

void ReferenceBackend::emit(batching::Sequence& s, std::span<float> logits, std::span<const int32_t> drafts,
                            std::span<const uint32_t> allowed, reference::KvCache& cache,
                            std::vector<SequenceEvent>& events) {
  const GenerationSpec& spec = specs_.at(s.key);
  const size_t vocab = decoder_->config().vocab_size;
  // Row i chooses after the sequence and drafts[0, i): `context` grows by each chosen token.
  std::vector<int32_t> context = s.tokens;
  const int first_generated = s.first_generated;
  std::vector<TokenChoice> choices;
  speculative::accept_drafts(drafts, [&](int row) {
    const std::span<const int32_t> generated(context.data() + first_generated, context.size() - first_generated);
    choices.push_back(choose_token(logits.subspan(row * vocab, vocab), spec, context, generated, generated.size(),
                                   row == 0 ? allowed : std::span<const uint32_t>()));
    if (spec.constraint) spec.constraint->accept(choices.back().id);  // constrained rows have no drafts
    context.push_back(choices.back().id);
    return choices.back().id;
  });
  if (!drafts.empty()) {
    const int drafted = static_cast<int>(drafts.size()), accepted = static_cast<int>(choices.size()) - 1;
    cache.truncate(cache.length - (drafted - accepted));
    scheduler_.reject_drafts(s, drafted - accepted);
    drafters_.at(s.key).record(drafted, accepted);
    draft_tokens_ += drafted;
    accepted_draft_tokens_ += accepted;
  }
  const size_t known = s.tokens.size();
  for (size_t c = 0; c < choices.size(); ++c) {
    SequenceEvent event;
    event.key = s.key;
    event.id = choices[c].id;
    event.logprob = choices[c].logprob;
    event.top = std::move(choices[c].top);
    const batching::Report report = scheduler_.report(s, event.id);  // may destroy s
    for (const batching::RegisteredBlock& block : report.registered) store_block(block);
    event.cached_tokens = report.cached_tokens;
    event.end = end_of(report.finish);
    const bool ended = event.end != SequenceEnd::none;
    events.push_back(std::move(event));
    if (!ended) continue;
    if (options_.speculative == SpeculativeChoice::suffix)  // a repeat of it is proposed whole
      suffix_cache_.add(std::span(context).first(first_generated),
                        std::span(context).subspan(first_generated, known + c + 1 - first_generated));
    caches_.erase(events.back().key);
    specs_.erase(events.back().key);
    drafters_.erase(events.back().key);
    return;
  }
}

BackendGauges ReferenceBackend::gauges() const {
  BackendGauges gauges;
  static_cast<SchedulingStats&>(gauges) = scheduler_.stats();
  gauges.draft_tokens = draft_tokens_;
  gauges.accepted_draft_tokens = accepted_draft_tokens_;
  return gauges;
}

}  // namespace deepfuse::server
