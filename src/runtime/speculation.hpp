// Speculative decoding's engine state (EngineOptions::speculative, issue 54; docs/runtime.md,
// "Speculative decoding"): each sequence's drafter and the suffix drafter's cache of finished
// outputs (src/speculative), the verify step's device inputs and outputs, and its decode
// attention plans (one per entry count: a bucket's sequences x rows, each with its own workspace).
//
// A verify step lays its entries out as [sequences][rows]: entry s * rows + j feeds sequence s's
// token (j = 0) or its draft j, so speculative_accept reads each sequence's chosen tokens as one
// row. Rows are 1 + the most drafts any sequence feeds that step; a sequence with fewer pads.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/sampling.hpp"
#include "deepfuse/tensor.hpp"
#include "runtime/graph_cache.hpp"
#include "runtime/pinned_buffer.hpp"
#include "speculative/drafter.hpp"
#include "speculative/suffix_cache.hpp"

namespace deepfuse::runtime {

// Proposes up to `limit` drafts to feed after a sequence's last token (`tokens`: all of it).
// Tests and benchmarks replace the drafters with one (EngineBench::set_draft_source).
using DraftSource = std::function<std::vector<int32_t>(SequenceId sequence, std::span<const int32_t> tokens, int limit)>;
// With a DraftSource: whether it may propose at the step after the one in flight, which samples
// the token after `tokens` (SequenceDrafter::may_propose_after_next).
using DraftOutlook = std::function<bool(SequenceId sequence, std::span<const int32_t> tokens)>;

// Where a verify step's entries and results sit, for `sequences` x `rows` entries.
struct VerifyLayout {
  int sequences = 0;
  int rows = 0;
  int entries() const { return sequences * rows; }
  // int32 inputs, one upload: ids | positions | seq_lens | block-table rows (each [entries]), then
  // drafts [sequences, rows - 1] and draft counts [sequences]: 5 x entries in all.
  int ids() const { return 0; }
  int positions() const { return entries(); }
  int seq_lens() const { return 2 * entries(); }
  int block_rows() const { return 3 * entries(); }
  int drafts() const { return 4 * entries(); }
  int draft_counts() const { return 4 * entries() + sequences * (rows - 1); }
  int input_count() const { return 5 * entries(); }
  // int32 results: emitted [sequences, rows], then emitted counts [sequences].
  int emitted_counts() const { return entries(); }
};

class Speculation {
 public:
  // Room for steps of up to max_sequences x (1 + max_draft) entries; `use_graphs`: verify steps
  // captured per (batch bucket, rows), as decode steps are per bucket.
  Speculation(SpeculativeChoice choice, int max_draft, int max_sequences, int vocab, bool use_graphs);

  int max_rows() const { return 1 + drafter_options_.max_draft; }

  // Up to `limit` drafts for the sequence (its drafter, made on first use, or the forced source).
  std::vector<int32_t> propose(SequenceId sequence, std::span<const int32_t> tokens, int limit);
  // Whether the sequence may be proposed drafts at the step after the one in flight (which
  // samples the token after `tokens`): its drafter's may_propose_after_next, the forced source's
  // outlook, or true for a forced source without one. False lets that step be launched ahead.
  bool may_propose_after_next(SequenceId sequence, std::span<const int32_t> tokens);
  // What the verify step accepted of the `drafted` (> 0) drafts the sequence fed.
  void record(SequenceId sequence, int drafted, int accepted);
  // A sequence ended (`prompt` and `output`: its tokens, for the suffix drafter's cache) or was removed.
  void finished(SequenceId sequence, std::span<const int32_t> prompt, std::span<const int32_t> output);
  void forget(SequenceId sequence) { drafters_.erase(sequence); }
  // Whether finished() wants the tokens of ending sequences (the suffix drafter).
  bool keeps_outputs() const { return choice_ == SpeculativeChoice::suffix; }
  void force(DraftSource source, DraftOutlook outlook = {}) {
    forced_ = std::move(source);
    forced_outlook_ = std::move(outlook);
  }

  // The decode attention plans of every entry count in `entries` (plan_for), each with a
  // workspace region of its own, zeroed once (the kernel leaves its counters zero). Not one
  // region for all: a plan's merge counters sit where a plan of fewer queries writes its
  // log-sum-exps, which would leave them nonzero (from 64 sequence x kv head pairs on).
  void plan_attention(std::span<const int> entries, const std::function<kernels::DecodeAttentionPlan(int)>& plan_for,
                      cudaStream_t stream);
  struct VerifyAttention {
    kernels::DecodeAttentionPlan plan;
    void* workspace = nullptr;
  };
  // The plan of `entries` queries and its workspace (plan_attention made it).
  VerifyAttention attention(int entries) const;

  Engine::SpeculativeCounts counts;

  // The step in flight (at most one: verify steps are read back before the next launch).
  VerifyLayout layout;
  std::vector<std::vector<int32_t>> drafts;  // per block-table row: what it fed after its token

  DeviceBuffer inputs;             // int32 [VerifyLayout::input_count] at most
  DeviceBuffer chosen;             // int32 [entries]
  DeviceBuffer slots;              // kernels::SamplingSlot [entries]
  DeviceBuffer sampling_workspace;
  PinnedBuffer host_inputs;        // the inputs' staging
  PinnedBuffer host_slots;
  PinnedBuffer results;            // mapped: speculative_accept writes emitted and counts here
  CopyEvent uploaded;              // after the last upload from the staging buffers
  // Per batch bucket, one graph per row count (plan rows - 1): the inputs sit at offsets fixed by
  // (sequences, rows), the attention plan and the ops by the entry count.
  DecodeGraphCache graphs;

 private:
  SpeculativeChoice choice_;
  speculative::DrafterOptions drafter_options_;
  speculative::SuffixCache suffix_cache_;
  std::unordered_map<SequenceId, speculative::SequenceDrafter> drafters_;
  speculative::SequenceDrafter& drafter(SequenceId sequence);  // made on first use

  DraftSource forced_;
  DraftOutlook forced_outlook_;
  struct PlannedAttention {
    kernels::DecodeAttentionPlan plan;
    size_t offset = 0;  // of its workspace region in attention_workspace_
  };
  std::map<int, PlannedAttention> attention_plans_;  // by entry count
  DeviceBuffer attention_workspace_;
};

}  // namespace deepfuse::runtime
