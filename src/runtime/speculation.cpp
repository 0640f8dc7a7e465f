#include "runtime/speculation.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/speculative_accept.hpp"

namespace deepfuse::runtime {

namespace {

// Launchers may legitimately need no workspace; a small allocation keeps the pointer non-null.
constexpr size_t kMinWorkspaceBytes = 256;

speculative::DrafterOptions drafter_options(int max_draft) {
  speculative::DrafterOptions options;
  options.max_draft = max_draft;
  return options;
}

}  // namespace

Speculation::Speculation(SpeculativeChoice choice, int max_draft, int max_sequences, int vocab, bool use_graphs)
    : graphs(max_sequences, use_graphs, 1 + max_draft), choice_(choice), drafter_options_(drafter_options(max_draft)) {
  DF_CHECK(max_draft >= 1 && max_draft < kernels::kSpeculativeMaxRows,
           "max_draft is " + std::to_string(max_draft) + "; it must be in [1, " +
               std::to_string(kernels::kSpeculativeMaxRows - 1) + "]");
  const VerifyLayout most{max_sequences, max_rows()};
  const size_t entries = most.entries();
  inputs = DeviceBuffer(most.input_count() * sizeof(int32_t));
  chosen = DeviceBuffer(entries * sizeof(int32_t));
  slots = DeviceBuffer(entries * sizeof(kernels::SamplingSlot));
  sampling_workspace =
      DeviceBuffer(std::max(kernels::sampling_workspace_bytes(static_cast<int>(entries), vocab), kMinWorkspaceBytes));
  host_inputs = PinnedBuffer(inputs.bytes());
  host_slots = PinnedBuffer(slots.bytes());
  results = PinnedBuffer((entries + max_sequences) * sizeof(int32_t), PinnedBuffer::Access::mapped);
  drafts.resize(max_sequences);
}

std::vector<int32_t> Speculation::propose(SequenceId sequence, std::span<const int32_t> tokens, int limit) {
  if (forced_) {
    std::vector<int32_t> proposed = forced_(sequence, tokens, limit);
    if (static_cast<int>(proposed.size()) > limit) proposed.resize(limit);
    return proposed;
  }
  return drafter(sequence).propose(tokens, limit).tokens;
}

bool Speculation::may_propose_after_next(SequenceId sequence, std::span<const int32_t> tokens) {
  if (forced_) return !forced_outlook_ || forced_outlook_(sequence, tokens);
  return drafter(sequence).may_propose_after_next(tokens);
}

speculative::SequenceDrafter& Speculation::drafter(SequenceId sequence) {
  return drafters_.try_emplace(sequence, choice_, drafter_options_, &suffix_cache_).first->second;
}

void Speculation::record(SequenceId sequence, int drafted, int accepted) {
  counts.draft_tokens += drafted;
  counts.accepted_draft_tokens += accepted;
  if (const auto found = drafters_.find(sequence); found != drafters_.end()) found->second.record(drafted, accepted);
}

void Speculation::finished(SequenceId sequence, std::span<const int32_t> prompt, std::span<const int32_t> output) {
  drafters_.erase(sequence);
  if (keeps_outputs() && !output.empty()) suffix_cache_.add(prompt, output);  // a repeat of it is proposed whole
}

void Speculation::plan_attention(std::span<const int> entries,
                                 const std::function<kernels::DecodeAttentionPlan(int)>& plan_for, cudaStream_t stream) {
  constexpr size_t kRegionAlignment = 256;
  size_t bytes = 0;
  for (const int count : entries) {
    if (attention_plans_.count(count)) continue;
    const kernels::DecodeAttentionPlan plan = plan_for(count);
    attention_plans_.emplace(count, PlannedAttention{plan, bytes});
    bytes += (plan.workspace_bytes + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
  }
  attention_workspace_ = DeviceBuffer(std::max(bytes, kMinWorkspaceBytes));
  attention_workspace_.zero(stream);  // the decode attention kernel expects zero counters on first use
}

Speculation::VerifyAttention Speculation::attention(int entries) const {
  const auto found = attention_plans_.find(entries);
  DF_CHECK(found != attention_plans_.end(),
           "internal: no verify attention plan for " + std::to_string(entries) + " entries");
  const PlannedAttention& planned = found->second;
  return {planned.plan, planned.plan.workspace_bytes > 0 ? attention_workspace_.as<unsigned char>() + planned.offset
                                                         : attention_workspace_.data()};
}

}  // namespace deepfuse::runtime
