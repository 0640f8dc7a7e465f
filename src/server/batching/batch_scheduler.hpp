// Which sequences run in a step, and how many of their tokens: continuous batching with chunked
// prefill under a per-step token budget, preemption when the KV pages run out, and the prefix
// cache at admission. Host bookkeeping only; a backend runs what plan() returns and reports back
// through commit() and append(). ReferenceBackend drives it.
//
// Every running sequence has `pending` tokens whose keys and values are not in the cache yet: one
// when it decodes (the token it generated last), the rest of its prompt while it prefills. A step:
//   1. decode rows, oldest first: one token each, so streams keep their pace while prompts load;
//   2. prefilling sequences, oldest first, a chunk each out of what the budget has left;
//   3. admission, first in first out, while rows and budget remain: the longest cached prefix of
//      the prompt is taken from the prefix cache (never the whole prompt: its last position must
//      run to give the first token's logits), and the rest is prefilled in chunks.
// A sequence that finds no free page for its tokens preempts the youngest running sequence (its
// pages go back, it waits again at the front of the queue, and it recomputes its prompt and the
// tokens it generated when it is readmitted: most of them come back from the prefix cache). When it
// is itself the youngest, it is the one that waits. No sequence ends for lack of pages: check()
// refuses at admission one that could never fit in the whole cache.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/kv_block_pool.hpp"
#include "server/batching/serving_backend.hpp"

namespace deepfuse::server {

using runtime::BlockHash;
using runtime::KvBlockPool;
using runtime::PageId;

struct SchedulerOptions {
  int max_batch = 16;          // sequences holding a decode row at once
  int max_step_tokens = 512;   // tokens computed per step, decode and prefill together
  int max_context = 0;         // prompt and generated tokens together
};

struct ScheduledSequence {
  SequenceKey key = 0;
  GenerationSpec spec;
  std::vector<int32_t> tokens;            // the prompt, then every generated token
  int generated = 0;
  int computed = 0;                       // positions whose keys and values are in the cache
  std::vector<PageId> pages;              // the block table: one page per kKvPageSize positions
  std::vector<BlockHash> block_hashes;    // chained hashes of the full blocks computed so far
  int cached_tokens = -1;                 // prompt tokens served by the prefix cache at first admission
  uint64_t order = 0;                     // arrival order: FIFO, and who is youngest
};

// Run tokens[first, first + count) of `sequence`; when `samples`, the last one's logits give the
// sequence's next token.
struct StepWork {
  ScheduledSequence* sequence = nullptr;
  int first = 0;
  int count = 0;
  bool samples = false;
};

class BatchScheduler {
 public:
  BatchScheduler(SchedulerOptions options, KvBlockPool& pool);

  void add(SequenceKey key, GenerationSpec spec);
  // Drops a running or waiting sequence and releases its pages; false when the key is unknown.
  bool cancel(SequenceKey key);
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }

  // This step's work. Pointers stay valid until the sequence ends or the next plan().
  std::vector<StepWork> plan();
  // The work's positions are in the cache now. Returns the indices of the sequence's blocks that
  // this completed and the prefix cache took (the backend keeps their keys and values).
  std::vector<int> commit(const StepWork& work);
  // Appends the token sampled for a sequence; a reason other than none ends it (pages released,
  // sequence destroyed).
  SequenceEnd append(ScheduledSequence& sequence, int32_t id);

  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  uint64_t preemptions() const { return preemptions_; }
  uint64_t prefix_queried_tokens() const { return prefix_queried_tokens_; }
  uint64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

 private:
  using Owned = std::unique_ptr<ScheduledSequence>;
  // Grows the sequence's block table to hold `tokens` positions; false when the pool ran dry.
  bool grow(ScheduledSequence& sequence, int tokens);
  // Pages for `tokens` positions, preempting younger sequences as needed. False when `sequence`
  // itself was preempted.
  bool grow_or_preempt(ScheduledSequence& sequence, int tokens, std::vector<StepWork>& works);
  void preempt(ScheduledSequence& sequence, std::vector<StepWork>& works);
  void release_pages(ScheduledSequence& sequence);
  // Admits the front of the queue with its cached prefix and a first chunk; false when it does
  // not fit now.
  bool admit_front(int budget, std::vector<StepWork>& works);
  void remove_running(const ScheduledSequence& sequence);

  SchedulerOptions options_;
  KvBlockPool& pool_;
  std::vector<Owned> running_;  // admission order... kept sorted by arrival order
  std::deque<Owned> waiting_;   // sorted by arrival order (preempted ones return to their place)
  uint64_t next_order_ = 0;
  uint64_t preemptions_ = 0;
  uint64_t prefix_queried_tokens_ = 0;
  uint64_t prefix_hit_tokens_ = 0;
};

}  // namespace deepfuse::server
