#include "batching/step_scheduler.hpp"

#include <algorithm>
#include <climits>
#include <span>
#include <string>

#include "deepfuse/error.hpp"

namespace deepfuse::batching {

namespace {

bool by_order(const std::unique_ptr<Sequence>& a, const std::unique_ptr<Sequence>& b) { return a->order < b->order; }

// plan_decode visits each running sequence once, so only the prefill phase can hold it already.
bool in_prefill(const StepPlan& plan, const Sequence* sequence) {
  return std::any_of(plan.prefill.begin(), plan.prefill.end(), [&](const PrefillChunk& c) { return c.sequence == sequence; });
}

}  // namespace

StepScheduler::StepScheduler(SchedulerOptions options, KvBlockPool& pool) : options_(options), pool_(pool) {
  DF_CHECK(options.max_batch >= 1 && options.max_context >= 2 && options.prefill_tokens_per_step >= 0 &&
               options.mixed_step_prompt_tokens >= 0,
           "internal: the step scheduler needs max_batch >= 1, max_context >= 2 and token budgets >= 0");
}

void StepScheduler::add(SequenceKey key, SequenceSpec spec) {
  DF_CHECK(!spec.prompt.empty() && spec.max_new_tokens >= 1 &&
               spec.prior_generated >= 0 && spec.prior_generated < static_cast<int>(spec.prompt.size()),
           "internal: a sequence needs a prompt, max_new_tokens >= 1 and prior_generated within the prompt");
  auto sequence = std::make_unique<Sequence>();
  sequence->key = key;
  sequence->token_limit = static_cast<int>(spec.prompt.size()) + spec.max_new_tokens;
  sequence->first_generated = static_cast<int>(spec.prompt.size()) - spec.prior_generated;
  sequence->tokens = std::move(spec.prompt);
  sequence->stop_ids = std::move(spec.stop_ids);
  sequence->order = next_order_++;
  waiting_.push_back(std::move(sequence));
}

Sequence& StepScheduler::add_prefilled(SequenceKey key, int context, int max_new_tokens) {
  DF_CHECK(running() < options_.max_batch, "all " + std::to_string(options_.max_batch) +
                                               " decode rows (max_batch) are running");
  auto sequence = std::make_unique<Sequence>();
  sequence->key = key;
  sequence->tokens.assign(context + 1, 0);
  sequence->first_generated = context + 1;
  sequence->token_limit = context + 1 + max_new_tokens;
  sequence->shares_blocks = false;
  sequence->order = next_order_++;
  sequence->computed = sequence->prefill_end = context;
  sequence->reported = 1;  // no cached_tokens report
  DF_CHECK(grow(*sequence, context), "benchmark context " + std::to_string(context) + " needs " +
                                         std::to_string(KvBlockPool::pages_for(context)) + " KV pages, " +
                                         std::to_string(pool_.available_pages()) + " are free");
  sequence->row = running();
  running_.push_back(std::move(sequence));
  return *running_.back();
}

SchedulingStats StepScheduler::stats() const {
  SchedulingStats stats;
  stats.running = running();
  stats.waiting = waiting();
  stats.kv_pages_total = pool_.total_pages();
  stats.kv_pages_used = pool_.used_pages();
  stats.kv_pages_cached = pool_.cached_pages();
  stats.preemptions = preemptions_;
  stats.prefix_cache_queried_tokens = prefix_queried_tokens_;
  stats.prefix_cache_hit_tokens = prefix_hit_tokens_;
  stats.mixed_steps = mixed_steps_;
  return stats;
}

Sequence* StepScheduler::find(SequenceKey key) {
  for (const Owned& s : running_)
    if (s->key == key) return s.get();
  for (const Owned& s : waiting_)
    if (s->key == key) return s.get();
  return nullptr;
}

Sequence* StepScheduler::find_running(SequenceKey key, int row) {
  if (row >= 0 && row < running() && running_[row]->key == key) return running_[row].get();
  for (const Owned& s : running_)
    if (s->key == key) return s.get();
  return nullptr;
}

void StepScheduler::release_pages(Sequence& sequence) {
  for (const PageId page : sequence.pages) pool_.release(page);
  sequence.pages.clear();
  sequence.block_hashes.clear();
}

StepScheduler::Owned StepScheduler::take_running(Sequence& sequence) {
  const int row = sequence.row, last = running() - 1;
  Owned owned = std::move(running_[row]);
  if (row != last) {
    running_[row] = std::move(running_[last]);
    running_[row]->row = row;
    if (on_row_move_) on_row_move_(last, row);
  }
  running_.pop_back();
  owned->row = -1;
  return owned;
}

bool StepScheduler::cancel(SequenceKey key) {
  Sequence* sequence = find(key);
  if (!sequence) return false;
  if (sequence->row >= 0) {
    release_pages(*sequence);
    take_running(*sequence);
  } else {
    std::erase_if(waiting_, [&](const Owned& s) { return s.get() == sequence; });  // waiting ones hold no pages
  }
  return true;
}

bool StepScheduler::grow(Sequence& sequence, int tokens) {
  const int needed = KvBlockPool::pages_for(tokens) - static_cast<int>(sequence.pages.size());
  if (needed > pool_.available_pages()) return false;
  for (int i = 0; i < needed; ++i) sequence.pages.push_back(*pool_.allocate());
  return true;
}

void StepScheduler::preempt(Sequence& sequence, StepPlan& plan) {
  DF_CHECK(sequence.in_flight == 0, "internal: a sequence is preempted with a sample in flight");
  std::erase_if(plan.prefill, [&](const PrefillChunk& c) { return c.sequence == &sequence; });
  std::erase_if(plan.decode, [&](const DecodeRow& d) { return d.sequence == &sequence; });
  release_pages(sequence);
  sequence.computed = sequence.prefill_end = 0;
  sequence.sample_in_row = sequence.preempting = false;
  ++preemptions_;
  Owned owned = take_running(sequence);
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), owned, by_order), std::move(owned));
}

Sequence* StepScheduler::youngest_running() {
  Sequence* youngest = nullptr;
  for (const Owned& s : running_)
    if (!s->preempting && (!youngest || s->order > youngest->order)) youngest = s.get();
  return youngest;
}

int StepScheduler::add_chunk(Sequence& s, int budget, StepPlan& plan) {
  const int count = std::min(s.prefill_end - s.computed, budget);
  const bool samples = s.computed + count == s.prefill_end;
  plan.prefill.push_back({&s, s.computed, count, samples});
  s.computed += count;
  if (samples) {
    ++s.in_flight;
    s.sample_in_row = true;  // the prefill's sampler leaves it where the row's next step reads it
  }
  return count;
}

bool StepScheduler::admit_front(int& budget, StepPlan& plan) {
  Sequence& s = *waiting_.front();
  const int total = static_cast<int>(s.tokens.size());
  const int block = KvBlockPool::block_tokens();
  std::vector<BlockHash> hashes;
  std::vector<PageId> matched;
  if (s.shares_blocks) matched = pool_.match_prefix(s.tokens, (total - 1) / block, hashes);
  const int needed = KvBlockPool::pages_for(total) - static_cast<int>(matched.size());
  if (needed > pool_.available_pages()) {
    for (const PageId page : matched) pool_.release(page);
    return false;
  }
  const int cached = static_cast<int>(matched.size()) * block;
  s.pages = std::move(matched);
  s.block_hashes = std::move(hashes);
  DF_CHECK(grow(s, total), "internal: pages counted as available could not be allocated");
  s.computed = cached;
  s.prefill_end = total;
  if (s.cached_tokens < 0) {  // the first admission, not a readmission after preemption
    s.cached_tokens = cached;
    prefix_queried_tokens_ += total;
    prefix_hit_tokens_ += cached;
  }
  Owned owned = std::move(waiting_.front());
  waiting_.pop_front();
  owned->row = running();
  running_.push_back(std::move(owned));
  budget -= add_chunk(s, budget, plan);
  plan.prefill.back().admits = true;
  return true;
}

void StepScheduler::plan_prefill(StepPlan& plan) {
  int budget = options_.prefill_tokens_per_step > 0 ? options_.prefill_tokens_per_step : INT_MAX;
  if (options_.mixed_step_prompt_tokens > 0) budget = std::min(budget, options_.mixed_step_prompt_tokens);
  std::vector<Sequence*> continuing;
  for (const Owned& s : running_)
    if (s->prefilling()) continuing.push_back(s.get());
  std::sort(continuing.begin(), continuing.end(), [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
  for (Sequence* s : continuing)
    if (budget > 0) budget -= add_chunk(*s, budget, plan);
  while (!waiting_.empty() && running() < options_.max_batch && budget > 0) {
    if (admit_front(budget, plan)) continue;
    DF_CHECK(running() > 0, "internal: an idle KV cache cannot hold a prompt that was checked to fit");
    break;
  }
}

bool StepScheduler::wants_decode(const Sequence& s) const {
  // One token to feed (counting a sample in flight), not ending by length once its samples in
  // flight are reported, and the row still holds any sample in flight.
  const int pending = static_cast<int>(s.tokens.size()) + s.in_flight - s.computed;
  return !s.preempting && !s.verifying && !s.prefilling() && pending == 1 &&
         s.computed + 1 < std::min(s.token_limit, options_.max_context) && (s.in_flight == 0 || s.sample_in_row);
}

void StepScheduler::plan_decode(StepPlan& plan) {
  std::vector<Sequence*> oldest_first;
  oldest_first.reserve(running_.size());
  for (const Owned& s : running_) oldest_first.push_back(s.get());
  std::sort(oldest_first.begin(), oldest_first.end(), [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
  // A victim's step is in flight: its pages come back once that is reported. Until then, whoever
  // is short of a page sits out instead of preempting another.
  bool awaiting_pages = std::any_of(running_.begin(), running_.end(), [](const Owned& s) { return s->preempting; });
  plan.decode.reserve(running_.size());
  for (Sequence* s : oldest_first) {
    if (s->row < 0 || !wants_decode(*s) || in_prefill(plan, s)) continue;  // row < 0: preempted just now
    bool fits = grow(*s, s->computed + 1);
    while (!fits && !awaiting_pages) {
      Sequence& victim = *youngest_running();
      if (victim.in_flight > 0) {
        victim.preempting = true;
        awaiting_pages = true;
      } else {
        preempt(victim, plan);
        if (&victim == s) break;
        fits = grow(*s, s->computed + 1);
      }
    }
    if (!fits) continue;
    plan.decode.push_back({s, s->computed});
    ++s->computed;
    ++s->in_flight;
  }
}

void StepScheduler::mark_row_samples(const StepPlan& plan) {
  // Rows the step feeds, and those whose chunk samples into them (a mixed step's, or a prefill
  // pass run before the step), hold a sample after it; the others lose theirs. (Those it feeds
  // have a sample in flight, so none of them was preempted after being fed.)
  for (const Owned& s : running_) s->sample_in_row = s->in_flight > 0 && in_prefill(plan, s.get());
  for (const DecodeRow& d : plan.decode) d.sequence->sample_in_row = true;
}

StepPlan StepScheduler::schedule(Phase phase) {
  StepPlan plan;
  if (static_cast<int>(phase) & static_cast<int>(Phase::prefill)) plan_prefill(plan);
  if (static_cast<int>(phase) & static_cast<int>(Phase::decode)) plan_decode(plan);
  // Prompt chunks ride in the decode rows' pass when steps are mixed (and both phases were
  // planned: a backend that asks for one phase runs it alone).
  plan.mixed = options_.mixed_step_prompt_tokens > 0 && phase == Phase::both && !plan.prefill.empty();
  mixed_steps_ += plan.mixed && !plan.decode.empty();
  // A step that runs samples every row; a plan with nothing but prompt chunks that are not mixed
  // runs no decode step, and a prefill pass writes only the rows it samples into.
  if (!plan.decode.empty() || plan.mixed) mark_row_samples(plan);
  return plan;
}

std::vector<RegisteredBlock> StepScheduler::register_blocks(Sequence& s) {
  std::vector<RegisteredBlock> registered;
  if (!pool_.prefix_caching() || !s.shares_blocks) return registered;
  const int block = KvBlockPool::block_tokens();
  // A block's keys and values are right only once its ids are known, not samples in flight.
  const int full = std::min(s.computed, static_cast<int>(s.tokens.size())) / block;
  for (int b = static_cast<int>(s.block_hashes.size()); b < full; ++b) {
    const std::span<const int32_t> ids(s.tokens.data() + static_cast<size_t>(b) * block, block);
    s.block_hashes.push_back(KvBlockPool::block_hash(b == 0 ? KvBlockPool::kRootHash : s.block_hashes[b - 1], ids));
    if (pool_.register_block(s.pages[b], s.block_hashes.back(), ids)) registered.push_back({s.key, b, s.pages[b]});
  }
  return registered;
}

std::vector<RegisteredBlock> StepScheduler::complete(const StepPlan& plan) {
  std::vector<RegisteredBlock> registered;
  auto add = [&](Sequence* s) {
    const std::vector<RegisteredBlock> more = register_blocks(*s);
    registered.insert(registered.end(), more.begin(), more.end());
  };
  for (const PrefillChunk& c : plan.prefill) add(c.sequence);
  for (const DecodeRow& d : plan.decode) add(d.sequence);
  return registered;
}

int StepScheduler::add_drafts(DecodeRow& row, int count) {
  Sequence& s = *row.sequence;
  DF_CHECK(row.drafts == 0 && row.position + 1 == s.computed && s.in_flight == 1 && !row.feeds_sample_in_flight(),
           "internal: drafts for a decode row that is not its sequence's only sample in flight, fed from the host");
  // Every emitted token must fit: the row and its drafts emit up to count + 1 after position.
  const int limit = std::min(s.token_limit, options_.max_context);
  count = std::min(count, limit - (row.position + 2));
  for (; count > 0; --count)
    if (grow(s, s.computed + count)) break;
  if (count <= 0) return 0;
  s.computed += count;
  s.in_flight += count;
  s.verifying = true;
  row.drafts = count;
  return count;
}

void StepScheduler::reject_drafts(Sequence& s, int count) {
  DF_CHECK(s.verifying && count >= 0 && count < s.in_flight,
           "internal: drafts rejected for a sequence with no more drafts in flight");
  s.computed -= count;
  s.in_flight -= count;
  s.verifying = false;
}

Report StepScheduler::report(Sequence& s, int32_t id) {
  DF_CHECK(s.row >= 0 && s.in_flight > 0 && !s.verifying,
           "internal: a token reported for a sequence with no sample in flight, or before its rejected drafts");
  Report report;
  report.finish = finish_on(s, id);
  s.tokens.push_back(id);
  --s.in_flight;
  if (s.reported++ == 0) report.cached_tokens = s.cached_tokens;
  report.registered = register_blocks(s);
  if (report.finish != FinishReason::none) {
    release_pages(s);  // its registered blocks stay cached for later prompts
    take_running(s);   // destroys it
  } else if (s.preempting && s.in_flight == 0) {
    StepPlan none;
    preempt(s, none);
  }
  return report;
}

FinishReason StepScheduler::finish_on(const Sequence& s, int32_t id) const {
  const int length = static_cast<int>(s.tokens.size()) + 1;  // with `id`
  if (std::find(s.stop_ids.begin(), s.stop_ids.end(), id) != s.stop_ids.end()) return FinishReason::stop_token;
  if (length >= s.token_limit) return FinishReason::max_tokens;
  if (length >= options_.max_context) return FinishReason::context_length;  // no position left to feed it
  return FinishReason::none;
}

}  // namespace deepfuse::batching
