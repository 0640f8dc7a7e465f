// The GPUs one Engine runs on. One GPU: a single Engine::Impl driven by the caller's thread.
// Tensor parallel (EngineOptions::tensor_parallel = N): N ranks in this one process, rank r an
// Engine::Impl of the rank's slice of the model (dist/tensor_split.hpp) on GPU device + r, each
// driven by a thread of its own. Every Engine call runs the same host code on every rank in
// lockstep: same requests, same scheduling, and the same sampled ids (rank 0 samples and
// broadcasts them), so each rank's collectives meet the others' (docs/dist.md).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "deepfuse/engine.hpp"
#include "dist/nccl_group.hpp"
#include "dist/peer_exchange.hpp"
#include "dist/tensor_split.hpp"

namespace deepfuse::runtime {

// One thread per rank, each running the tasks run() hands it.
class RankThreads {
 public:
  explicit RankThreads(int ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;
  // task(r) on thread r for every rank at once; waits for all; the exceptions, by rank (null: none).
  std::vector<std::exception_ptr> run(const std::function<void(int)>& task);

 private:
  void loop(int rank);
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

// All-reduce times measured at engine start, per decode bucket (µs per call, the slowest rank's).
struct AllReduceTiming {
  int batch = 0;
  // 0: not timed (no peer access, or overridden). flag / lines: the one-shot all-reduce with a flag
  // after the data / with flags in the data.
  double nccl_us = 0, flag_us = 0, lines_us = 0;
  // The time of `choice`'s all-reduce kernel (0 where not timed, one_shot's size rule included;
  // epilogue and in_mlp: the one-shot kernel with flags in the data they run where the fused MLP
  // does not sum).
  double us(AllReduceChoice choice) const {
    const std::optional<kernels::OneShotProtocol> protocol = choice_row(choice).protocol;
    if (!protocol) return nccl_us;
    switch (*protocol) {
      case kernels::OneShotProtocol::flag_after_data: return flag_us;
      case kernels::OneShotProtocol::flags_in_data: return lines_us;
      case kernels::OneShotProtocol::automatic: return 0.0;
    }
    return 0.0;
  }
  // The fastest of the three timed, NCCL on ties and where a one-shot protocol was not timed.
  AllReduceChoice fastest() const {
    AllReduceChoice best = AllReduceChoice::nccl;
    for (AllReduceChoice candidate : {AllReduceChoice::one_shot_flag, AllReduceChoice::one_shot_lines})
      if (us(candidate) > 0 && us(candidate) < us(best)) best = candidate;
    return best;
  }
};

class RankGroup {
 public:
  // Loads rank r's weights into an Impl whose plan is made (layouts known): the checkpoint's or
  // random slices of `shard`. `lead`: rank 0 (it alone reports load progress).
  using LoadWeights = std::function<void(Engine::Impl& impl, const dist::RankShard& shard, bool lead)>;

  // Checks options.tensor_parallel against the visible GPUs and the model's shape, then builds
  // every rank: plan, weights (load), workspaces, one KV cache size for all (the smallest any
  // rank affords), and the all-reduce choice per bucket. Throws deepfuse::Error naming the rank
  // and the cause when a rank fails.
  static std::unique_ptr<RankGroup> build(const ModelConfig& model, const EngineOptions& options,
                                          const LoadWeights& load);
  // One GPU, an Impl built by the caller (the tuner's engines).
  static std::unique_ptr<RankGroup> single(std::unique_ptr<Engine::Impl> impl);
  ~RankGroup();

  int size() const { return static_cast<int>(ranks_.size()); }
  Engine::Impl& rank(int r) const { return *ranks_[r]; }
  Engine::Impl& lead() const { return *ranks_.front(); }
  const ModelConfig& model() const { return model_; }
  const std::vector<AllReduceTiming>& all_reduce_timings() const { return timings_; }

  // task(impl) on every rank (own thread each when tensor parallel, with the rank's GPU current;
  // inline for one GPU); waits for all. A failure on any rank is rethrown as "rank r: message"
  // (the lowest failing rank) after the others finished.
  void run(const std::function<void(Engine::Impl&)>& task);

 private:
  RankGroup() = default;
  // task(r) on rank r's thread with its GPU current, every rank at once (tensor parallel only).
  void run_ranks(const std::function<void(int)>& task);
  void choose_all_reduce();

  ModelConfig model_;
  std::vector<int> devices_;  // rank r's CUDA ordinal (tensor parallel)
  std::unique_ptr<dist::NcclGroup> nccl_;             // declared before the ranks: outlives them
  std::unique_ptr<dist::OneShotBuffers> one_shot_;    // null: one GPU, or no peer access
  std::vector<std::unique_ptr<Engine::Impl>> ranks_;
  std::unique_ptr<RankThreads> threads_;              // null: one GPU
  std::vector<AllReduceTiming> timings_;
  std::string failure_;  // the first rank failure of a call: the group is unusable after it
};

}  // namespace deepfuse::runtime
