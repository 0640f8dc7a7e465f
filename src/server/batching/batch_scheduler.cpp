#include "server/batching/batch_scheduler.hpp"

#include <algorithm>
#include <span>

#include "deepfuse/error.hpp"

namespace deepfuse::server {

namespace {

bool by_order(const std::unique_ptr<ScheduledSequence>& a, const std::unique_ptr<ScheduledSequence>& b) {
  return a->order < b->order;
}

int pending(const ScheduledSequence& s) { return static_cast<int>(s.tokens.size()) - s.computed; }

}  // namespace

BatchScheduler::BatchScheduler(SchedulerOptions options, KvBlockPool& pool) : options_(options), pool_(pool) {
  DF_CHECK(options.max_batch >= 1 && options.max_step_tokens >= 1 && options.max_context >= 2,
           "internal: scheduler needs max_batch, max_step_tokens >= 1 and max_context >= 2");
}

void BatchScheduler::add(SequenceKey key, GenerationSpec spec) {
  auto sequence = std::make_unique<ScheduledSequence>();
  sequence->key = key;
  sequence->tokens = spec.prompt;
  sequence->spec = std::move(spec);
  sequence->order = next_order_++;
  waiting_.push_back(std::move(sequence));
}

void BatchScheduler::release_pages(ScheduledSequence& sequence) {
  for (const PageId page : sequence.pages) pool_.release(page);
  sequence.pages.clear();
  sequence.block_hashes.clear();
  sequence.computed = 0;
}

void BatchScheduler::remove_running(const ScheduledSequence& sequence) {
  running_.erase(std::find_if(running_.begin(), running_.end(), [&](const Owned& s) { return s.get() == &sequence; }));
}

bool BatchScheduler::cancel(SequenceKey key) {
  auto matches = [key](const Owned& s) { return s->key == key; };
  if (const auto it = std::find_if(running_.begin(), running_.end(), matches); it != running_.end()) {
    release_pages(**it);
    running_.erase(it);
    return true;
  }
  if (const auto it = std::find_if(waiting_.begin(), waiting_.end(), matches); it != waiting_.end()) {
    waiting_.erase(it);  // waiting sequences hold no pages
    return true;
  }
  return false;
}

bool BatchScheduler::grow(ScheduledSequence& sequence, int tokens) {
  while (static_cast<int>(sequence.pages.size()) < KvBlockPool::pages_for(tokens)) {
    const std::optional<PageId> page = pool_.allocate();
    if (!page) return false;
    sequence.pages.push_back(*page);
  }
  return true;
}

void BatchScheduler::preempt(ScheduledSequence& sequence, std::vector<StepWork>& works) {
  std::erase_if(works, [&](const StepWork& w) { return w.sequence == &sequence; });
  release_pages(sequence);
  ++preemptions_;
  const auto it = std::find_if(running_.begin(), running_.end(), [&](const Owned& s) { return s.get() == &sequence; });
  Owned owned = std::move(*it);
  running_.erase(it);
  // Back in its arrival place: ahead of everything that came after it.
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), owned, by_order), std::move(owned));
}

bool BatchScheduler::grow_or_preempt(ScheduledSequence& sequence, int tokens, std::vector<StepWork>& works) {
  while (!grow(sequence, tokens)) {
    ScheduledSequence& youngest = *running_.back();
    preempt(youngest, works);
    if (&youngest == &sequence) return false;
  }
  return true;
}

bool BatchScheduler::admit_front(int budget, std::vector<StepWork>& works) {
  ScheduledSequence& s = *waiting_.front();
  const int total = static_cast<int>(s.tokens.size());
  const int block = KvBlockPool::block_tokens();
  std::vector<BlockHash> hashes;
  std::vector<PageId> matched = pool_.match_prefix(s.tokens, (total - 1) / block, hashes);
  const int cached = static_cast<int>(matched.size()) * block;
  const int count = std::min(total - cached, budget);
  const int new_pages = KvBlockPool::pages_for(cached + count) - static_cast<int>(matched.size());
  if (new_pages > pool_.available_pages()) {
    for (const PageId page : matched) pool_.release(page);
    return false;
  }
  s.pages = std::move(matched);
  s.block_hashes = std::move(hashes);
  s.computed = cached;
  DF_CHECK(grow(s, cached + count), "internal: pages counted as available could not be allocated");
  if (s.cached_tokens < 0) {  // the first admission, not a readmission after preemption
    s.cached_tokens = cached;
    prefix_queried_tokens_ += total;
    prefix_hit_tokens_ += cached;
  }
  works.push_back({&s, cached, count, cached + count == total});
  Owned owned = std::move(waiting_.front());
  waiting_.pop_front();
  running_.insert(std::upper_bound(running_.begin(), running_.end(), owned, by_order), std::move(owned));
  return true;
}

std::vector<StepWork> BatchScheduler::plan() {
  std::vector<StepWork> works;
  int budget = options_.max_step_tokens;
  // Decode rows first, then prefill chunks; oldest first in each pass. A preemption removes the
  // youngest running sequence, so the index walk re-reads the vector each time.
  for (const bool decode_pass : {true, false}) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      ScheduledSequence& s = *running_[i];
      const int waiting_tokens = pending(s);
      if ((waiting_tokens == 1) != decode_pass) continue;
      const int count = std::min(waiting_tokens, budget);
      if (!grow_or_preempt(s, s.computed + count, works)) break;  // s was the youngest: nothing after it
      works.push_back({&s, s.computed, count, s.computed + count == static_cast<int>(s.tokens.size())});
      budget -= count;
    }
  }
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_batch && budget > 0) {
    if (!admit_front(budget, works)) break;
    budget -= works.back().count;
  }
  return works;
}

std::vector<int> BatchScheduler::commit(const StepWork& work) {
  ScheduledSequence& s = *work.sequence;
  DF_CHECK(work.first == s.computed, "internal: a step's work does not continue where its sequence's cache ends");
  s.computed = work.first + work.count;
  std::vector<int> registered;
  const int block = KvBlockPool::block_tokens();
  for (int b = static_cast<int>(s.block_hashes.size()); b < s.computed / block; ++b) {
    const std::span<const int32_t> ids(s.tokens.data() + static_cast<size_t>(b) * block, block);
    const BlockHash hash = KvBlockPool::block_hash(b == 0 ? KvBlockPool::kRootHash : s.block_hashes[b - 1], ids);
    s.block_hashes.push_back(hash);
    if (pool_.register_block(s.pages[b], hash, ids)) registered.push_back(b);
  }
  return registered;
}

SequenceEnd BatchScheduler::append(ScheduledSequence& s, int32_t id) {
  s.tokens.push_back(id);
  s.generated += 1;
  SequenceEnd end = SequenceEnd::none;
  if (std::find(s.spec.stop_ids.begin(), s.spec.stop_ids.end(), id) != s.spec.stop_ids.end())
    end = SequenceEnd::stop_token;
  else if (s.generated >= s.spec.max_new_tokens)
    end = SequenceEnd::max_tokens;
  else if (static_cast<int>(s.tokens.size()) >= options_.max_context)  // no position left to feed it
    end = SequenceEnd::context_length;
  if (end != SequenceEnd::none) {
    release_pages(s);
    remove_running(s);
  }
  return end;
}

}  // namespace deepfuse::server
