// The CPU backend of the server: the reference decoder (fp32, src/reference) serving many
// sequences at once. The step scheduler the CUDA engine runs (batching::StepScheduler) decides
// each step, prefill and decode phases planned together; the step's sequences run their tokens in
// parallel across the cores, each on its own contiguous reference::KvCache; the KV pages of the
// scheduler are the accounting unit, exactly as on the GPU, so preemption and the prefix cache
// behave here as they would there. A page the prefix cache takes keeps a copy of its block's
// keys and values, from which a later sequence's cache is filled instead of computing them.
//
// Each sequence's numbers are those it would get alone (nothing is shared across a batch in the
// reference decoder), so batching never changes a greedy output.
//
// With `speculative` on, a decode row also feeds the drafts its sequence's drafter proposes
// (src/speculative; a request may opt out) and the step verifies them: the accepted ones and one
// more token are reported, the rejected positions leave the cache and the scheduler. Greedy output
// is unchanged; sampled output keeps its distribution (and, for a seed, its tokens).
#pragma once

#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/speculative.hpp"
#include "batching/kv_block_pool.hpp"
#include "batching/step_scheduler.hpp"
#include "server/batching/serving_backend.hpp"
#include "speculative/drafter.hpp"
#include "speculative/suffix_cache.hpp"

namespace deepfuse::server {

struct ReferenceBackendOptions {
  batching::SchedulerOptions scheduler;
  int kv_pages = 0;            // 0: enough for max_batch sequences of max_context tokens
  bool prefix_caching = true;
  SpeculativeChoice speculative = kDefaultSpeculative;
  speculative::DrafterOptions drafter;
  speculative::SuffixCacheOptions suffix_cache;
};

class ReferenceBackend final : public ServingBackend {
 public:
  ReferenceBackend(std::unique_ptr<reference::Decoder> decoder, ReferenceBackendOptions options);

  std::string name() const override { return "reference"; }
  int max_context() const override { return options_.scheduler.max_context; }
  int vocab_size() const override;
  void check(const GenerationSpec& spec) const override;
  void add(SequenceKey key, GenerationSpec spec) override;
  void cancel(SequenceKey key) override;
  bool has_work() const override { return scheduler_.has_work(); }
  std::vector<SequenceEvent> step() override;
  BackendGauges gauges() const override;

 private:
  // Makes the sequence's cache hold exactly positions [0, first): trims what a preemption
  // discarded, and copies blocks the prefix cache matched.
  void restore_cache(const batching::Sequence& sequence, int first);
  // Keeps a copy of the block's keys and values (from its sequence's cache) in its page's slot.
  void store_block(const batching::RegisteredBlock& block);
  // The drafts a decode row feeds after its token (none unless speculative and opted in).
  std::vector<int32_t> draft(batching::DecodeRow& row);
  // Chooses a sampling unit's tokens from its sampling rows' logits (one row, or a verify's
  // 1 + drafts), rolls rejected drafts back, and reports each token as an event.
  // `allowed`: the first row's token bitmask (empty: unconstrained).
  void emit(batching::Sequence& sequence, std::span<float> logits, std::span<const int32_t> drafts,
            std::span<const uint32_t> allowed, reference::KvCache& cache, std::vector<SequenceEvent>& events);

  std::unique_ptr<reference::Decoder> decoder_;
  ReferenceBackendOptions options_;
  batching::KvBlockPool pool_;
  batching::StepScheduler scheduler_;
  std::unordered_map<SequenceKey, GenerationSpec> specs_;  // how each sequence samples
  std::unordered_map<SequenceKey, reference::KvCache> caches_;
  // Per page: the keys and values of the block the prefix cache holds there, every layer,
  // [layer][keys | values][block positions x kv_heads x head_dim].
  std::vector<std::vector<float>> stored_blocks_;
  speculative::SuffixCache suffix_cache_;  // finished sequences' prompt tails and outputs
  std::unordered_map<SequenceKey, speculative::SequenceDrafter> drafters_;
  uint64_t draft_tokens_ = 0, accepted_draft_tokens_ = 0;
};

}  // namespace deepfuse::server
