// Engine: construction (weights, workspaces, KV cache sized from what memory is left), request
// validation, and the sequences handed to the step scheduler. The step itself lives in step.cpp,
// scoring in score.cpp.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/speculative_accept.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/safetensors.hpp"
#include "dist/tensor_split.hpp"
#include "runtime/engine_impl.hpp"
#include "runtime/rank_group.hpp"
#include "scheduler/builtin_plans.hpp"
#include "scheduler/tuning_cache.hpp"
#include "scheduler/variants.hpp"

namespace deepfuse {

using batching::KvBlockPool;

namespace {

// Left free when sizing the KV cache from free memory: graph instantiation and libraries
// allocate a little lazily after start-up.
constexpr size_t kMemoryReserve = size_t{256} << 20;
// fp32 logits rows one lm_head call may produce when score() needs every position.
constexpr int kScoreLogitRows = 64;

std::string str(size_t value) { return std::to_string(value); }

// Host-side checks of options and of the model against what the kernels support.
void validate_engine_setup(const ModelConfig& c, EngineOptions& o) {
  DF_CHECK(o.max_batch >= 1, "max_batch is " + std::to_string(o.max_batch) + "; it must be at least 1");
  DF_CHECK(o.prefill_chunk >= 1, "prefill_chunk is " + std::to_string(o.prefill_chunk) + "; it must be at least 1");
  DF_CHECK(o.prefill_tokens_per_step >= 0, "prefill_tokens_per_step must not be negative");
  DF_CHECK(o.kv_memory_fraction > 0 && o.kv_memory_fraction <= 1,
           "kv_memory_fraction is " + std::to_string(o.kv_memory_fraction) + "; it must be in (0, 1]");
  if (o.max_context == 0) o.max_context = c.max_position_embeddings;
  DF_CHECK(o.max_context >= 1 && o.max_context <= c.max_position_embeddings,
           "max_context " + std::to_string(o.max_context) + " is outside 1.." +
               std::to_string(c.max_position_embeddings) + " (the model's max_position_embeddings)");
  DF_CHECK(c.head_dim == 64 || c.head_dim == 128,
           "GPU engine: head_dim " + std::to_string(c.head_dim) + " is not supported (attention handles 64 and 128)");
  DF_CHECK(c.hidden_size % 64 == 0 && c.intermediate_size % 64 == 0,
           "GPU engine: hidden_size " + std::to_string(c.hidden_size) + " and intermediate_size " +
               std::to_string(c.intermediate_size) + " must be multiples of 64 (the MLP kernels' tile)");
  DF_CHECK(c.num_key_value_heads >= 1 && c.num_attention_heads % c.num_key_value_heads == 0,
           "GPU engine: num_attention_heads " + std::to_string(c.num_attention_heads) +
               " is not a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads));
  DF_CHECK(c.num_hidden_layers >= 1 && c.vocab_size >= 1, "GPU engine: the model has no layers or no vocabulary");
  DF_CHECK(o.speculative == SpeculativeChoice::off || o.tensor_parallel == 1,
           std::string("speculative decoding (") + choice_name(o.speculative) +
               ") runs on one GPU; it has no tensor parallel verify step yet");
  DF_CHECK(o.speculative == SpeculativeChoice::off || (o.max_draft >= 1 && o.max_draft < kernels::kSpeculativeMaxRows),
           "max_draft is " + std::to_string(o.max_draft) + "; it must be in [1, " +
               std::to_string(kernels::kSpeculativeMaxRows - 1) + "]");
}

std::string describe_model(const ModelConfig& c) {
  return std::string(architecture_name(c.architecture)) + " with " + std::to_string(c.num_hidden_layers) +
         " layers, hidden " + std::to_string(c.hidden_size) + ", vocab " + std::to_string(c.vocab_size);
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return "none";
    case FinishReason::stop_token: return "stop_token";
    case FinishReason::max_tokens: return "max_tokens";
    case FinishReason::context_length: return "context_length";
    case FinishReason::kv_cache_full: return "kv_cache_full";
  }
  return "?";
}

namespace runtime {

StreamOwner::~StreamOwner() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void StreamOwner::create() { DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

}  // namespace runtime

// ---- construction

Engine::Impl::Impl(ModelConfig model_config, const EngineOptions& engine_options)
    : config(std::move(model_config)), options(engine_options) {
  validate_engine_setup(config, options);
  check_weight_load_options(config, options.weights);
  int devices = 0;
  DF_CHECK_CUDA(cudaGetDeviceCount(&devices));
  DF_CHECK(options.device >= 0 && options.device < devices,
           "device " + std::to_string(options.device) + " does not exist (" + std::to_string(devices) +
               " CUDA devices)");
  activate_device();
  cudaDeviceProp props{};
  DF_CHECK_CUDA(cudaGetDeviceProperties(&props, options.device));
  gpu = {props.name, props.major, props.minor, props.multiProcessorCount, props.totalGlobalMem};
  stream_owner.create();
}

// Work still queued on the stream may read any buffer: drain it before members are freed.
Engine::Impl::~Impl() {
  if (stream()) cudaStreamSynchronize(stream());
}

void Engine::Impl::activate_device() const { DF_CHECK_CUDA(cudaSetDevice(options.device)); }

scheduler::TuningKey Engine::Impl::tuning_key() const {
  scheduler::TuningKey key;
  key.gpu = gpu.name;
  key.sms = gpu.sms;
  key.memory_bytes = gpu.memory_bytes;
  DF_CHECK_CUDA(cudaDriverGetVersion(&key.driver));
  DF_CHECK_CUDA(cudaRuntimeGetVersion(&key.runtime));
  key.deepfuse = DEEPFUSE_VERSION;
  key.model = plan_shape().signature();
  return key;
}

scheduler::PlanShape Engine::Impl::plan_shape() const {
  return scheduler::PlanShape::of(config, block_weight_format(config, options.weights));
}

void Engine::Impl::make_plan(bool all_layouts) {
  const scheduler::PlanShape shape = plan_shape();
  const std::vector<int> buckets = runtime::decode_buckets(options.max_batch);
  plan = scheduler::builtin_plan(shape, gpu, buckets);
  if (!options.tuning_cache.empty()) {
    scheduler::CacheLookup cached = scheduler::load_tuned_plan(options.tuning_cache, tuning_key());
    plan_notice = cached.notice;
    // A plan tuned for up to 64 sequences serves an engine of fewer: each of its buckets the
    // tuned plan measured takes the tuned choices; others keep the built-in ones.
    if (cached.plan) {
      int taken = 0;
      for (BucketPlan& bucket : plan.buckets)
        for (const BucketPlan& tuned : cached.plan->buckets)
          if (tuned.batch == bucket.batch) bucket = tuned, ++taken;
      if (taken > 0) {
        plan.prefill_mlp = cached.plan->prefill_mlp;
        plan.source = cached.plan->source + (taken < static_cast<int>(plan.buckets.size())
                                                 ? "; built-in where not tuned (" + plan.source + ")"
                                                 : "");
      }
    }
  }
  plan.tensor_parallel = link.shard.ranks;
  plan = scheduler::apply_overrides(std::move(plan), options.plan_overrides, shape, gpu);
  scheduler::check_plan(plan, shape, gpu);
  layouts = runtime::WeightLayouts::of(plan, max_tokens(), options.weights);
  if (all_layouts) {
    // Every layout a candidate of any bucket may need (the registry's supports rules).
    for (const BucketPlan& bucket : plan.buckets) {
      const int m = bucket.batch;
      layouts.mlp_fused |= scheduler::why_unsupported(MlpChoice::fused, shape, m, gpu).empty();
      layouts.mlp_unfused |= scheduler::why_unsupported(MlpChoice::unfused, shape, m, gpu).empty();
      layouts.mlp_fused_batched |= scheduler::why_unsupported(MlpChoice::fused_batched, shape, m, gpu).empty();
      layouts.front_packed |= scheduler::why_unsupported(FrontChoice::fused, shape, m, gpu).empty();
      layouts.o_proj_packed |=
          scheduler::why_unsupported(OProjChoice::gemv, FrontChoice::fused, shape, m, gpu).empty();
    }
  } else {
    fit_plan_to_memory();
  }
}

void Engine::Impl::fit_plan_to_memory() {
  if (!(layouts.mlp_fused && layouts.mlp_unfused)) return;
  size_t free_bytes = 0, total_bytes = 0;
  DF_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t one_sequence = static_cast<size_t>(KvBlockPool::pages_for(options.max_context)) * kv_geometry().page_bytes();
  const size_t kv_first = options.keep_mlp_copy ? 0 : one_sequence * options.max_batch;
  if (runtime::fits_with_kv(config, layouts, free_bytes, kv_first + kMemoryReserve, link.shard)) return;
  const scheduler::PlanShape shape = plan_shape();
  if (!scheduler::why_unsupported(MlpChoice::fused, shape, max_tokens(), gpu).empty()) return;  // the copy is needed
  for (BucketPlan& bucket : plan.buckets) bucket.mlp = MlpChoice::fused;
  plan.prefill_mlp = MlpChoice::fused;
  const bool extra_copies = layouts.mlp_fused_batched || layouts.mlp_fused_wgmma;
  plan.source += std::string("; ") + (extra_copies ? "unfused and batched MLP copies" : "unfused MLP copy") +
                 " dropped (the KV cache of max_batch x max_context comes first)";
  layouts.mlp_unfused = false;
  layouts.mlp_fused_batched = false;
  layouts.mlp_fused_wgmma = false;
}

kernels::DecodeAttentionPlan Engine::Impl::decode_attention_plan(int batch, const AttentionChoice& choice) const {
  return kernels::plan_decode_attention(batch, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                                        options.max_context, gpu.sms, choice.splits, choice.warps, choice.merge);
}

void Engine::Impl::plan_attention(int index) {
  const AttentionChoice& choice = plan.buckets[index].attention;
  decode_plans[index] = decode_attention_plan(plan.buckets[index].batch, choice);
  // Short sequences: a cluster-merged plan of their own where the bucket leaves the shape to the planner.
  const bool planner_shape =
      choice.splits == 0 && choice.warps == 0 && choice.merge == kernels::SplitMerge::automatic;
  short_context_plans[index] =
      planner_shape && choice.short_context
          ? kernels::plan_short_context_decode_attention(decode_plans[index], gpu.sms,
                                                         kernels::decode_attention_resident_clusters(config.head_dim))
          : std::nullopt;
}

void Engine::Impl::prepare_setup() {
  const int max_batch = options.max_batch;
  size_t attention_workspace = 0;
  decode_plans.resize(plan.buckets.size());
  short_context_plans.resize(plan.buckets.size());
  for (size_t index = 0; index < plan.buckets.size(); ++index) {
    plan_attention(static_cast<int>(index));
    attention_workspace = std::max(attention_workspace, decode_plans[index].workspace_bytes);
    if (!short_context_plans[index]) continue;
    attention_workspace = std::max(attention_workspace, short_context_plans[index]->workspace_bytes);
  }
  // The tuner tries other attention shapes on these buffers: room for the largest it may try.
  attention_workspace = std::max(attention_workspace, attention_workspace_floor);
  gemm = std::make_unique<kernels::CublasLtGemm>();
  // A verify step's lm_head produces a row per entry (max_pass_tokens counts them).
  const int logits_rows = std::max({max_batch, kScoreLogitRows, options.speculative == SpeculativeChoice::off ? 0 : max_tokens()});
  buffers = std::make_unique<runtime::StepBuffers>(config, max_tokens(), max_batch, logits_rows,
                                                   attention_workspace, stream(), link.shard,
                                                   block_weight_format(config, options.weights));
  using runtime::PinnedBuffer;
  for (runtime::StepLane& lane : lanes) {
    lane.inputs = PinnedBuffer(3 * static_cast<size_t>(max_batch) * sizeof(int32_t));
    lane.sampled = PinnedBuffer(static_cast<size_t>(max_batch) * sizeof(int32_t), PinnedBuffer::Access::mapped);
    // Room for a short-context graph per bucket even where none is planned yet (the profiler may
    // switch a bucket's attention back to the planner's choice), and for each a graph with the
    // penalty kernel and one with token masks, so steps without them never launch their work
    // (step.cpp, graph_variant).
    lane.graphs = std::make_unique<runtime::DecodeGraphCache>(max_batch, options.cuda_graphs, 8);
  }
  prefill_sampled = PinnedBuffer(static_cast<size_t>(max_batch) * sizeof(int32_t));
  prefill_host = PinnedBuffer(buffers->prefill_inputs.bytes());
  slot_host = PinnedBuffer(static_cast<size_t>(max_batch) * sizeof(kernels::SamplingSlot));
  penalty_host = PinnedBuffer(static_cast<size_t>(max_batch) * sizeof(kernels::PenaltySlot));
  if (options.speculative != SpeculativeChoice::off) prepare_speculation();
  if (link.shard.split()) {
    // The partial sums the all-reduces read: the peer-visible buffers where the one-shot
    // all-reduce exists, else two of this rank's own.
    if (link.one_shot) {
      for (int slot = 0; slot < 2; ++slot) link.partial[slot] = link.one_shot->input(link.shard.rank, slot);
    } else {
      partials = DeviceBuffer(2 * static_cast<size_t>(max_tokens()) * config.hidden_size * sizeof(__nv_bfloat16));
      for (int slot = 0; slot < 2; ++slot)
        link.partial[slot] = partials.as<__nv_bfloat16>() + slot * static_cast<size_t>(max_tokens()) * config.hidden_size;
    }
  }
}

// The verify steps' buffers and attention plans: every bucket's sequences x every row count.
void Engine::Impl::prepare_speculation() {
  speculation = std::make_unique<runtime::Speculation>(options.speculative, options.max_draft, options.max_batch,
                                                       config.vocab_size, options.cuda_graphs);
  std::vector<int> entries;
  for (const BucketPlan& bucket : plan.buckets)
    for (int rows = 1; rows <= speculation->max_rows(); ++rows) entries.push_back(bucket.batch * rows);
  speculation->plan_attention(
      entries, [&](int count) { return decode_attention_plan(count, AttentionChoice{}); }, stream());
}

int Engine::Impl::affordable_kv_pages() {
  // The KV cache takes what is left: never more pages than max_batch sequences at max_context use.
  const runtime::KvGeometry geometry = kv_geometry();
  const size_t useful_pages = static_cast<size_t>(options.max_batch) * KvBlockPool::pages_for(options.max_context);
  DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
  size_t free_bytes = 0, total_bytes = 0;
  DF_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t available = free_bytes > kMemoryReserve ? free_bytes - kMemoryReserve : 0;
  size_t budget = 0;
  if (options.kv_cache_bytes > 0) {
    DF_CHECK(options.kv_cache_bytes <= available,
             "kv_cache_bytes " + str(options.kv_cache_bytes) + " exceeds the " + str(available) +
                 " bytes of GPU memory free after the weights and workspaces");
    budget = options.kv_cache_bytes;
  } else {
    budget = static_cast<size_t>(options.kv_memory_fraction * static_cast<double>(available));
  }
  const size_t pages = std::min(budget / geometry.page_bytes(), useful_pages);
  DF_CHECK(pages >= 1, "the KV cache budget of " + str(budget) + " bytes holds no page (one page of " +
                           std::to_string(kernels::kKvPageSize) + " tokens over all layers is " +
                           str(geometry.page_bytes()) + " bytes)");
  DF_CHECK(pages <= static_cast<size_t>(INT32_MAX), "KV cache of " + str(pages) + " pages exceeds int32 page ids");
  return static_cast<int>(pages);
}

void Engine::Impl::complete_setup(int kv_pages) {
  kv = std::make_unique<runtime::KvCache>(kv_geometry(), kv_pages, options.max_batch,
                                          KvBlockPool::pages_for(options.max_context), stream());
  pool = std::make_unique<batching::KvBlockPool>(kv_pages, options.prefix_caching);
  step_scheduler = std::make_unique<batching::StepScheduler>(
      batching::SchedulerOptions{options.max_batch, options.max_context, options.prefill_tokens_per_step,
                                 options.mixed_steps ? options.prefill_chunk : 0},
      *pool);
  step_scheduler->on_row_move([this](int from, int to) { move_row(from, to); });
  forward = std::make_unique<runtime::ForwardPass>(config, *weights, *kv, *buffers, *gemm, plan, &link);
  if (options.tune_gemms) gemm_tunings = forward->tune_decode_gemms(stream());
  DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
}

Engine::Engine(std::unique_ptr<runtime::RankGroup> ranks) : ranks_(std::move(ranks)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

Engine Engine::from_checkpoint(const std::filesystem::path& model_dir, const EngineOptions& options,
                               const LoadProgress& progress) {
  const ModelConfig config = load_model_config(model_dir);
  const Checkpoint checkpoint(model_dir);
  validate_checkpoint(checkpoint, config);
  return Engine(runtime::RankGroup::build(config, options, [&](Impl& impl, const dist::RankShard& shard, bool lead) {
    runtime::check_weights_fit(impl.config, impl.layouts, model_dir.string(), shard);
    impl.weights = std::make_unique<runtime::GpuWeights>(runtime::load_checkpoint_weights(
        checkpoint, config, impl.layouts, impl.stream(), lead ? progress : LoadProgress{}, shard));
  }));
}

Engine Engine::with_random_weights(const ModelConfig& config, const EngineOptions& options, uint64_t seed) {
  return Engine(runtime::RankGroup::build(config, options, [&](Impl& impl, const dist::RankShard& shard, bool) {
    runtime::check_weights_fit(impl.config, impl.layouts, "random weights for a " + describe_model(config), shard);
    impl.weights = std::make_unique<runtime::GpuWeights>(
        runtime::make_random_weights(config, impl.layouts, seed, impl.stream(), shard));
  }));
}

PlanPreview preview_plan(const ModelConfig& config, const EngineOptions& options) {
  const dist::RankShard shard = dist::shard_of(config, 0, options.tensor_parallel);  // throws when it cannot split
  Engine::Impl impl(dist::rank_config(config, shard), options);
  impl.link.shard = shard;
  impl.make_plan();
  return {impl.plan, impl.plan_notice, runtime::gpu_weight_bytes(impl.config, impl.layouts, shard)};
}

const ModelConfig& Engine::config() const { return ranks_->model(); }
const EngineOptions& Engine::options() const { return ranks_->lead().options; }
const std::vector<GemmTuning>& Engine::gemm_tunings() const { return ranks_->lead().gemm_tunings; }
const DecodePlan& Engine::plan() const { return ranks_->lead().plan; }
const std::string& Engine::plan_notice() const { return ranks_->lead().plan_notice; }

EngineStats Engine::stats(int decode_batch) const {
  const Impl& s = ranks_->lead();
  s.activate_device();
  EngineStats stats;
  stats.weight_bytes = runtime::decode_weight_bytes(s.config, s.link.shard, s.options.weights);
  stats.gpu_weight_bytes = runtime::gpu_weight_bytes(s.config, s.layouts, s.link.shard);
  stats.kv_cache_bytes = s.kv->pool_bytes();
  stats.kv_pages_total = s.pool->total_pages();
  stats.kv_pages_free = s.pool->available_pages();
  stats.kv_pages_cached = s.pool->cached_pages();
  size_t free_bytes = 0, total_bytes = 0;
  DF_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  stats.gpu_memory_used = total_bytes - free_bytes;
  const int bucket = s.lanes[0].graphs->bucket_index(decode_batch < 1 ? s.options.max_batch : decode_batch);
  const kernels::DecodeAttentionPlan& attention = s.decode_plans[bucket];
  stats.launches_per_decode_step = s.forward->launches_per_decode_step(s.plan.buckets[bucket], attention);
  stats.launches_per_layer =
      s.forward->launches_per_layer(kernels::decode_attention_launches(attention), s.plan.buckets[bucket]);
  const runtime::StepLane* lane = s.lane_with_graph(bucket);
  stats.kernels_per_decode_step = lane ? lane->graphs->kernel_nodes(bucket) : 0;
  return stats;
}

// ---- requests

void Engine::Impl::validate_ids(std::span<const int32_t> ids, const std::string& what) const {
  DF_CHECK(!ids.empty(), what + " is empty (at least one token id is needed)");
  for (size_t i = 0; i < ids.size(); ++i)
    DF_CHECK(ids[i] >= 0 && ids[i] < config.vocab_size,
             what + " token " + std::to_string(i) + " is id " + std::to_string(ids[i]) +
                 ", outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
}

void Engine::Impl::validate_request(const SequenceRequest& r) const {
  validate_ids(r.prompt, "prompt");
  const int prompt = static_cast<int>(r.prompt.size());
  DF_CHECK(r.max_new_tokens >= 1, "max_new_tokens is " + std::to_string(r.max_new_tokens) + "; it must be at least 1");
  DF_CHECK(static_cast<int64_t>(prompt) + r.max_new_tokens <= options.max_context,
           "prompt of " + std::to_string(prompt) + " tokens + max_new_tokens " + std::to_string(r.max_new_tokens) +
               " exceeds max_context " + std::to_string(options.max_context) +
               " (the model's max_position_embeddings is " + std::to_string(config.max_position_embeddings) + ")");
  // The last sampled token is never fed back, so the cache holds prompt + max_new_tokens - 1 positions.
  const int pages = KvBlockPool::pages_for(prompt + r.max_new_tokens - 1);
  DF_CHECK(pages <= pool->total_pages(),
           "prompt + max_new_tokens need " + std::to_string(pages) + " KV pages of " +
               std::to_string(kernels::kKvPageSize) + " tokens, the whole cache holds " +
               std::to_string(pool->total_pages()));
  const SamplingParams& p = r.sampling;
  DF_CHECK(p.repetition_penalty == 1.0f, "repetition_penalty " + std::to_string(p.repetition_penalty) +
                                             " is not supported by the GPU engine (it must be 1)");
  DF_CHECK(std::isfinite(p.temperature), "temperature must be a finite number");
  DF_CHECK(p.top_k >= 0, "top_k is " + std::to_string(p.top_k) + "; it must be >= 0 (0: off)");
  DF_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p is " + std::to_string(p.top_p) + "; it must be in (0, 1]");
  DF_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p is " + std::to_string(p.min_p) + "; it must be in [0, 1]");
  DF_CHECK(std::isfinite(r.presence_penalty) && std::isfinite(r.frequency_penalty),
           "presence_penalty and frequency_penalty must be finite numbers");
  DF_CHECK(r.top_logprobs >= -1, "top_logprobs is " + std::to_string(r.top_logprobs) + "; it must be >= -1 (-1: off)");
  DF_CHECK(r.prior_generated >= 0 && r.prior_generated < prompt,
           "prior_generated is " + std::to_string(r.prior_generated) + "; it must be in [0, " + std::to_string(prompt) +
               ") (the prompt's earlier generated tokens, after at least one prompt token)");
}

SequenceId Engine::add_sequence(const SequenceRequest& request) {
  ranks_->lead().validate_request(request);  // every rank would say the same: once, before any rank changes
  ranks_->run([&](Impl& s) {
    const SequenceId id = s.next_id++;  // the same on every rank
    s.settings[id] = {request.sampling, {request.presence_penalty, request.frequency_penalty}, request.top_logprobs,
                      request.constraint, request.speculative};
    s.step_scheduler->add(static_cast<batching::SequenceKey>(id),
                     {request.prompt, request.max_new_tokens, request.stop_ids, request.prior_generated});
  });
  return ranks_->lead().next_id - 1;
}

void Engine::remove_sequence(SequenceId sequence) {
  const Impl& lead = ranks_->lead();
  // Finished sequences were removed when their last token was reported: nothing to do then.
  DF_CHECK(sequence >= 1 && sequence < lead.next_id, "unknown sequence id " + std::to_string(sequence));
  ranks_->run([&](Impl& s) {
    s.activate_device();
    s.step_scheduler->cancel(static_cast<batching::SequenceKey>(sequence));  // its row's state moves on the stream
    s.settings.erase(sequence);
    if (s.speculation) s.speculation->forget(sequence);
  });
}

int Engine::running_sequences() const {
  const Impl& s = ranks_->lead();
  return s.step_scheduler->running() + s.step_scheduler->waiting();
}

SchedulingStats Engine::scheduling_stats() const { return ranks_->lead().step_scheduler->stats(); }

Engine::SpeculativeCounts Engine::speculative_counts() const {
  const Impl& s = ranks_->lead();
  return s.speculation ? s.speculation->counts : SpeculativeCounts{};
}

}  // namespace deepfuse
