// The step scheduler: which sequences run in a step and how many of their tokens, for both
// backends (the CUDA engine, src/runtime; the CPU reference backend, src/server/batching). Host
// bookkeeping only, shaped like vLLM's scheduler: schedule() returns a StepPlan, the backend runs
// exactly that, then calls complete() and reports each sampled token with report().
//
// A running sequence holds a row (block-table row i is decode-batch row i; rows stay compact:
// when a sequence leaves, the last row moves into its hole and the row-move callback tells the
// backend) and the KV pages of its positions. Its `computed` positions are in the cache or being
// computed by a step already scheduled; `in_flight` samples are scheduled but not reported yet
// (the engine launches decode steps ahead of reading them back, docs/runtime.md). A decode row may
// feed a sample still in flight: the backend keeps each row's last sample where the next step
// reads it, which holds while the row takes part in every step (Sequence::sample_in_row).
//
// A step has two phases, each planned by schedule(), for one call or two:
//   prefill: sequences still prefilling continue, oldest first, then the queue is admitted first
//     in first out while rows and the prefill token budget last. Admission takes the longest run
//     of prefix-cached full blocks (never the whole prompt: its last position must run to give the
//     first token's logits) and pages for the rest of the prompt; a sequence that does not fit
//     waits, and so does everything behind it.
//   decode: every running sequence with one token to feed, oldest first, gets a page for it. When
//     the pool is dry, the youngest running sequence is preempted: its pages go back and it waits
//     again at its arrival place in the queue with every token it has, to recompute them when it
//     is readmitted (most come back from the prefix cache). A victim with a sample in flight
//     first sits steps out until it is reported (its step still writes its pages).
// The engine plans the phases in two calls, running the prefill (and reading its first tokens
// back) between them, so a prompt prefilled in a step also decodes in it; the reference backend
// plans both at once. No sequence appears twice in one plan.
// Mixed steps (SchedulerOptions::mixed_step_prompt_tokens > 0): the engine plans both phases at
// once and runs a plan with prompt chunks as one pass, the chunks' tokens and the decode rows in
// the same GEMMs (StepPlan::mixed). Its sampler writes every row, a chunk that ends its prompt
// sampling its first token into its row, so a mixed plan clobbers the samples of the rows it
// leaves out even when no row decodes.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "batching/kv_block_pool.hpp"
#include "deepfuse/finish_reason.hpp"
#include "deepfuse/scheduling_stats.hpp"

namespace deepfuse::batching {

using SequenceKey = uint64_t;  // chosen by the backend, unique for its lifetime

struct SchedulerOptions {
  int max_batch = 16;                 // running sequences (rows) at once
  int max_context = 0;                // positions per sequence, prompt and generated together
  int prefill_tokens_per_step = 0;    // prompt tokens a step prefills, over all sequences (0: no limit)
  // > 0: steps are mixed (the backend runs a plan's prompt chunks and decode rows as one pass,
  // planned with Phase::both), and one pass holds at most this many prompt tokens, so no step
  // prefills more (whatever prefill_tokens_per_step allows). 0: steps are not mixed.
  int mixed_step_prompt_tokens = 0;
};

struct SequenceSpec {
  std::vector<int32_t> prompt;        // at least one id
  int max_new_tokens = 16;
  std::vector<int32_t> stop_ids;      // generation ends after producing one of these
  int prior_generated = 0;            // the prompt's last ids that an earlier run generated
};

struct Sequence {
  SequenceKey key = 0;
  std::vector<int32_t> tokens;        // the prompt, then every token reported since
  int first_generated = 0;            // tokens from here on were generated (penalties, draw index)
  int token_limit = 0;                // ends with max_tokens once tokens holds this many
  std::vector<int32_t> stop_ids;
  bool shares_blocks = true;          // false: a benchmark context whose ids mean nothing
  uint64_t order = 0;                 // arrival order: first in first out, and who is youngest
  int row = -1;                       // while running
  int computed = 0;                   // positions in the cache or computed by a scheduled step
  int prefill_end = 0;                // prefilling while computed < prefill_end (set at admission)
  int in_flight = 0;                  // samples scheduled and not reported yet
  bool verifying = false;             // has drafts in flight: not scheduled again until reject_drafts
  bool sample_in_row = false;         // its row holds its latest sample where the next step reads it
  bool preempting = false;            // gives its pages back once nothing is in flight for it
  int reported = 0;                   // tokens reported since it was added
  int cached_tokens = -1;             // prompt positions the prefix cache served at first admission
  std::vector<PageId> pages;          // the block table row: one page per block_tokens() positions
  std::vector<BlockHash> block_hashes;  // chained hashes of its full blocks in the prefix cache

  bool prefilling() const { return computed < prefill_end; }
  int generated() const { return static_cast<int>(tokens.size()) - first_generated; }
};

// Run tokens[first, first + count) of the sequence; when `samples`, the last position's logits
// give its next token. `admits`: the plan admitted it (the backend sets its row up first).
struct PrefillChunk {
  Sequence* sequence = nullptr;
  int first = 0;
  int count = 0;
  bool samples = false;
  bool admits = false;
};

// Feed the token at `position` and sample the next. The host knows it (tokens[position]) unless
// it is a sample still in flight, which the sequence's row holds on the device.
struct DecodeRow {
  Sequence* sequence = nullptr;
  int position = 0;
  int drafts = 0;  // speculative: positions after it fed in the same step (add_drafts)
  bool feeds_sample_in_flight() const { return position >= static_cast<int>(sequence->tokens.size()); }
};

// One step's work. Pointers stay valid until the next call that changes the scheduler.
struct StepPlan {
  std::vector<PrefillChunk> prefill;  // in admission order
  std::vector<DecodeRow> decode;      // oldest first
  // Run as one pass: the prompt chunks and the decode rows together, one sampler over every row
  // (steps are mixed and the plan has prompt chunks; a plan of decode rows only is a plain step).
  bool mixed = false;
  bool empty() const { return prefill.empty() && decode.empty(); }
};

enum class Phase { prefill = 1, decode = 2, both = 3 };

// A full block the prefix cache took: the backend keeps its keys and values if it must.
struct RegisteredBlock {
  SequenceKey key = 0;
  int block = 0;
  PageId page = 0;
};

struct Report {
  FinishReason finish = FinishReason::none;  // none: still running (or preempted and waiting)
  int cached_tokens = -1;                    // with the first token reported since add(); else -1
  std::vector<RegisteredBlock> registered;
};

class StepScheduler {
 public:
  StepScheduler(SchedulerOptions options, KvBlockPool& pool);

  // Called with (from, to) when the sequence on the last row `from` moves into the hole at `to`.
  void on_row_move(std::function<void(int from, int to)> callback) { on_row_move_ = std::move(callback); }

  void add(SequenceKey key, SequenceSpec spec);
  // Benchmarks: a running sequence whose first `context` positions count as computed (their ids
  // are 0, never shared through the prefix cache) and whose next token to feed is id 0.
  Sequence& add_prefilled(SequenceKey key, int context, int max_new_tokens);
  // Drops a running or waiting sequence and releases its pages; false when the key is unknown.
  bool cancel(SequenceKey key);
  Sequence* find(SequenceKey key);
  // The running sequence `key`, or nullptr; looks at `row` first (where it ran, unless it moved),
  // so a step's rows are matched in O(1) each rather than by scanning.
  Sequence* find_running(SequenceKey key, int row);

  StepPlan schedule(Phase phase);
  // The plan ran (or is ordered on the device before anything that reads it): the full blocks it
  // completed whose ids are known go into the prefix cache.
  std::vector<RegisteredBlock> complete(const StepPlan& plan);
  // The token sampled for the sequence's oldest sample in flight. A finish other than none ends
  // the sequence (pages released, Sequence destroyed).
  Report report(Sequence& sequence, int32_t id);
  // How report(sequence, id) would end the sequence (none: it keeps running), changing nothing.
  FinishReason finish_on(const Sequence& sequence, int32_t id) const;

  // Speculative decoding (src/speculative). After schedule(), gives a decode row whose token the
  // host knows up to `count` more positions, its drafts, fed in the same step: as many as free
  // pages and the sequence's token and context limits allow, without preempting anyone. Each is a
  // sample in flight; the sequence is not scheduled again until reject_drafts says how many were
  // rejected, so drafts suit a backend that reads a step back before planning the next (the CPU
  // pattern). Returns how many it got (row.drafts).
  int add_drafts(DecodeRow& row, int count);
  // After a verify step, before its tokens are reported: the last `count` drafted positions of the
  // sequence were rejected. They are no longer computed and their samples never come; the pages
  // stay with the sequence for the positions that follow.
  void reject_drafts(Sequence& sequence, int count);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  const Sequence& at_row(int row) const { return *running_[row]; }
  const KvBlockPool& pool() const { return pool_; }
  const SchedulerOptions& options() const { return options_; }
  uint64_t preemptions() const { return preemptions_; }
  uint64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  SchedulingStats stats() const;

 private:
  using Owned = std::unique_ptr<Sequence>;
  void plan_prefill(StepPlan& plan);
  void plan_decode(StepPlan& plan);
  // Schedules up to `budget` more prompt tokens of a prefilling sequence; returns how many.
  int add_chunk(Sequence& sequence, int budget, StepPlan& plan);
  // Admits the front of the queue with its cached prefix and a first chunk; false when its pages
  // do not fit now.
  bool admit_front(int& budget, StepPlan& plan);
  bool wants_decode(const Sequence& sequence) const;
  // The plan's step samples every row: rows it leaves out lose the sample they held.
  void mark_row_samples(const StepPlan& plan);
  // Grows the sequence's pages to hold `tokens` positions; false when the pool ran dry.
  bool grow(Sequence& sequence, int tokens);
  // Gives the sequence's pages back and queues it again at its arrival place.
  void preempt(Sequence& sequence, StepPlan& plan);
  void release_pages(Sequence& sequence);
  // Takes the sequence off its row (the last row moves into the hole); returns ownership.
  Owned take_running(Sequence& sequence);
  std::vector<RegisteredBlock> register_blocks(Sequence& sequence);
  Sequence* youngest_running();

  SchedulerOptions options_;
  KvBlockPool& pool_;
  std::function<void(int, int)> on_row_move_;
  std::vector<Owned> running_;  // index = row
  std::deque<Owned> waiting_;   // sorted by arrival order (preempted ones return to their place)
  uint64_t next_order_ = 0;
  uint64_t preemptions_ = 0;
  uint64_t prefix_queried_tokens_ = 0;
  uint64_t prefix_hit_tokens_ = 0;
  uint64_t mixed_steps_ = 0;
};

}  // namespace deepfuse::batching
