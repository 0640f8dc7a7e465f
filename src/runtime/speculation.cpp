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
  speculative::SequenceDrafter& drafter =
      drafters_.try_emplace(sequence, choice_, drafter_options_, &suffix_cache_).first->second;
  return drafter.propose(tokens, limit).tokens;
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

const kernels::DecodeAttentionPlan& Speculation::attention_plan(
    int entries, const std::function<kernels::DecodeAttentionPlan(int)>& plan_for) {
  auto found = attention_plans_.find(entries);
  if (found == attention_plans_.end()) found = attention_plans_.emplace(entries, plan_for(entries)).first;
  DF_CHECK(found->second.workspace_bytes <= attention_workspace.bytes(),
           "internal: a verify step's attention plan needs more workspace than was allocated");
  return found->second;
}

void Speculation::allocate_attention_workspace(size_t bytes, cudaStream_t stream) {
  attention_workspace = DeviceBuffer(std::max(bytes, kMinWorkspaceBytes));
  attention_workspace.zero(stream);  // the decode attention kernel expects zero counters on first use
}

}  // namespace deepfuse::runtime
