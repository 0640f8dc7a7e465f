#include "runtime/rank_group.hpp"

#include <algorithm>
#include <climits>
#include <iterator>
#include <optional>

#include "deepfuse/error.hpp"
#include "core/graph_timing.hpp"
#include "runtime/engine_impl.hpp"

namespace deepfuse::runtime {

namespace {

std::string str(int value) { return std::to_string(value); }

// The message of a rank's exception, for "rank r: ..." (deepfuse::Error and std::exception alike).
std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// Calls timed per all-reduce measurement, inside one graph (the way decode steps run them).
constexpr int kTimedCalls = 64;
constexpr int kTimedReplays = 5;
// The largest message (tokens x hidden values) whose sum the fused MLP takes at its start at 2
// ranks (in_mlp): every cluster waits for every line of it, a dependent round trip per line a
// thread. On 2 H200s with hidden 4096 it gained 0.2-1.2% at one token and lost 0.3% at two
// (docs/dist.md, "The attention block's sum at the MLP's start").
constexpr size_t kInMlpMaxElements = 4096;

}  // namespace

// ---- threads

RankThreads::RankThreads(int ranks) : errors_(ranks) {
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

std::vector<std::exception_ptr> RankThreads::run(const std::function<void(int)>& task) {
  std::unique_lock lock(mutex_);
  task_ = &task;
  pending_ = static_cast<int>(threads_.size());
  std::fill(errors_.begin(), errors_.end(), nullptr);
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  return errors_;
}

void RankThreads::loop(int rank) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const std::function<void(int)>* task = task_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*task)(rank);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[rank] = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

// ---- the group

RankGroup::~RankGroup() {
  // Ranks first (their streams drain), then the communicators and peer buffers they used.
  if (threads_) {
    threads_->run([&](int r) {
      if (!ranks_[r]) return;
      ranks_[r]->activate_device();
      ranks_[r].reset();
    });
  }
  ranks_.clear();
}

void RankGroup::run(const std::function<void(Engine::Impl&)>& task) {
  if (!threads_) return task(lead());
  run_ranks([&](int r) { task(*ranks_[r]); });
}

void RankGroup::run_ranks(const std::function<void(int)>& task) {
  DF_CHECK(failure_.empty(), "the tensor-parallel engine stopped after an earlier failure (" + failure_ +
                                 "); build a new engine");
  const std::vector<std::exception_ptr> errors = threads_->run([&](int r) {
    try {
      DF_CHECK_CUDA(cudaSetDevice(devices_[r]));
      task(r);
    } catch (...) {
      // The other ranks may be waiting in a collective for this one: abort the communicators so
      // their NCCL kernels end instead of waiting forever.
      nccl_->abort();
      throw;
    }
  });
  // Every failing rank is named: the first one's error is often only the others' abort.
  for (int r = 0; r < size(); ++r)
    if (errors[r])
      failure_ += (failure_.empty() ? "" : "; ") +
                  ("rank " + str(r) + " (GPU " + str(devices_[r]) + "): " + message_of(errors[r]));
  if (!failure_.empty()) throw Error(failure_);
}

std::unique_ptr<RankGroup> RankGroup::single(std::unique_ptr<Engine::Impl> impl) {
  std::unique_ptr<RankGroup> group(new RankGroup);
  group->model_ = impl->config;
  group->ranks_.push_back(std::move(impl));
  return group;
}

std::unique_ptr<RankGroup> RankGroup::build(const ModelConfig& model, const EngineOptions& options,
                                            const LoadWeights& load) {
  const int tp = options.tensor_parallel;
  DF_CHECK(tp >= 1 && tp <= kernels::kMaxTensorParallelRanks,
           "--tp " + str(tp) + " is outside 1.." + str(kernels::kMaxTensorParallelRanks));
  std::unique_ptr<RankGroup> group(new RankGroup);
  group->model_ = model;
  if (tp == 1) {
    auto impl = std::make_unique<Engine::Impl>(model, options);
    impl->make_plan();
    load(*impl, {}, true);
    impl->finish_setup();
    group->ranks_.push_back(std::move(impl));
    return group;
  }
  int visible = 0;
  DF_CHECK_CUDA(cudaGetDeviceCount(&visible));
  DF_CHECK(options.device >= 0 && options.device + tp <= visible,
           "--tp " + str(tp) + " needs GPUs " + str(options.device) + ".." + str(options.device + tp - 1) + ", but " +
               str(visible) + (visible == 1 ? " GPU is" : " GPUs are") + " visible");
  dist::shard_of(model, 0, tp);  // throws, naming the shape that does not split, before any GPU work
  std::vector<int>& devices = group->devices_;
  devices.resize(tp);
  for (int r = 0; r < tp; ++r) devices[r] = options.device + r;

  // Peer access decides whether the one-shot all-reduce exists; NCCL serves either way.
  std::string notice;
  std::string why_no_peers;
  // The inputs hold any forward pass's partial sums; messages are decode steps' (prefill uses NCCL).
  const int max_tokens = max_pass_tokens(options);
  if (dist::enable_peer_access(devices, &why_no_peers))
    group->one_shot_ = std::make_unique<dist::OneShotBuffers>(devices, static_cast<size_t>(max_tokens) * model.hidden_size,
                                                              static_cast<size_t>(options.max_batch) * model.hidden_size);
  else
    notice = "no GPU peer access (" + why_no_peers + "): every all-reduce runs through NCCL";
  group->nccl_ = std::make_unique<dist::NcclGroup>(devices);
  group->ranks_.resize(tp);
  group->threads_ = std::make_unique<RankThreads>(tp);

  // Each rank builds on its own thread (run_ranks: a failure anywhere aborts the communicators
  // and names the rank).
  std::vector<int> affordable(tp, 0);
  group->run_ranks([&](int r) {
    EngineOptions rank_options = options;
    rank_options.device = devices[r];
    const dist::RankShard shard = dist::shard_of(model, r, tp);
    auto impl = std::make_unique<Engine::Impl>(dist::rank_config(model, shard), rank_options);
    impl->link.shard = shard;
    impl->link.comm = group->nccl_->comm(r);
    impl->link.one_shot = group->one_shot_.get();
    impl->make_plan();
    if (!notice.empty()) impl->plan_notice = notice;
    load(*impl, shard, r == 0);
    impl->prepare_setup();
    affordable[r] = impl->affordable_kv_pages();
    group->ranks_[r] = std::move(impl);
  });
  // One page count for all: the ranks run the same sequences on the same page tables.
  const int pages = *std::min_element(affordable.begin(), affordable.end());
  group->run_ranks([&](int r) {
    Engine::Impl& s = *group->ranks_[r];
    s.complete_setup(pages);
    s.forward->connect_collectives(s.stream());
  });
  group->choose_all_reduce();
  return group;
}

// Per decode bucket, NCCL against both one-shot protocols at the bucket's message size, unless a
// plan override fixed it: which is fastest differs between machines (on 4 H100s flags in the data
// win small messages by 1.5 us, on 4 H200s the flag protocol is as fast or faster; docs/dist.md).
// Every rank takes the same choice, from the slowest rank's times (a mismatch would hang).
// At 2 ranks, buckets that run the fused MLP take epilogue instead (its finish sums over the
// ranks), where flags in the data are the one-shot's size rule: it has no kernel of its own to
// time, and measured faster in the whole step on 2 H200s (docs/dist.md, "The MLP's sum in its own
// finish"); up to kInMlpMaxElements values a message, in_mlp (the MLP sums its input too), faster
// still at one token, slower where each cluster has more lines to wait for (docs/dist.md, "The
// attention block's sum at the MLP's start"). At 4 ranks epilogue too: 0.2-2.5% faster on two of
// three 4 x H200 hosts, up to 0.9% slower on the third. 8 ranks: not measured, only by override.
void RankGroup::choose_all_reduce() {
  Engine::Impl& first = lead();
  const auto& overrides = first.options.plan_overrides;
  const bool overridden = std::any_of(overrides.begin(), overrides.end(),
                                      [](const PlanOverride& o) { return o.op == "all_reduce"; });
  const int buckets = static_cast<int>(first.plan.buckets.size());
  timings_.assign(buckets, {});
  if (overridden || !one_shot_) {
    for (int b = 0; b < buckets; ++b) timings_[b].batch = first.plan.buckets[b].batch;
    if (!one_shot_) run([&](Engine::Impl& s) {
      for (BucketPlan& bucket : s.plan.buckets) bucket.all_reduce = AllReduceChoice::nccl;
    });
    return;
  }
  constexpr AllReduceChoice kCandidates[] = {AllReduceChoice::nccl, AllReduceChoice::one_shot_flag,
                                             AllReduceChoice::one_shot_lines};
  constexpr int kCount = static_cast<int>(std::size(kCandidates));
  std::vector<std::vector<double>> us(size(), std::vector<double>(kCount * buckets, 0.0));
  run([&](Engine::Impl& s) {
    for (int b = 0; b < buckets; ++b)
      for (int c = 0; c < kCount; ++c)
        us[s.link.shard.rank][kCount * b + c] =
            s.time_all_reduce(s.plan.buckets[b].batch, kCandidates[c], kTimedCalls, kTimedReplays);
  });
  for (int b = 0; b < buckets; ++b) {
    AllReduceTiming& t = timings_[b];
    t.batch = first.plan.buckets[b].batch;
    double* const fields[kCount] = {&t.nccl_us, &t.flag_us, &t.lines_us};
    for (int c = 0; c < kCount; ++c)
      for (int r = 0; r < size(); ++r) *fields[c] = std::max(*fields[c], us[r][kCount * b + c]);
  }
  auto mlp_sums = [&](const BucketPlan& bucket) -> std::optional<AllReduceChoice> {
    const size_t elements = static_cast<size_t>(bucket.batch) * model_.hidden_size;
    if ((size() != 2 && size() != 4) || bucket.mlp != MlpChoice::fused || elements > one_shot_->exchange_elements() ||
        kernels::one_shot_automatic_protocol(elements, size()) != kernels::OneShotProtocol::flags_in_data)
      return std::nullopt;
    return size() == 2 && elements <= kInMlpMaxElements ? AllReduceChoice::in_mlp : AllReduceChoice::epilogue;
  };
  run([&](Engine::Impl& s) {
    for (int b = 0; b < buckets; ++b) {
      BucketPlan& bucket = s.plan.buckets[b];
      bucket.all_reduce = mlp_sums(bucket).value_or(timings_[b].fastest());
    }
    s.plan.source += "; all-reduce per bucket timed at start (NCCL vs both one-shot protocols), or the MLP's own";
  });
}

}  // namespace deepfuse::runtime

namespace deepfuse {

double Engine::Impl::time_all_reduce(int tokens, AllReduceChoice choice, int calls, int replays) {
  // Alternating slots as the decode step does (an even count keeps them alternating from one
  // replay to the next); the residual stream is scratch until a sequence runs.
  DF_CHECK(calls % 2 == 0, "all-reduce timing needs an even number of calls per graph");
  const GraphExec graph = capture_graph(stream(), [&] {
    for (int call = 0; call < calls; ++call) forward->all_reduce(call % 2, tokens, choice, stream());
    return true;
  });
  return median_replay_us_per_call(graph, calls, replays, stream());
}

}  // namespace deepfuse
