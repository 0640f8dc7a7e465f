#include "runtime/engine_bench.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/cuda_event.hpp"
#include "deepfuse/error.hpp"
#include "runtime/engine_impl.hpp"
#include "runtime/rank_group.hpp"

namespace deepfuse::runtime {

SequenceId EngineBench::add_prefilled(Engine& engine, int context, int max_new_tokens) {
  SequenceId id = 0;
  // The same sequence on every rank (tensor parallel): checks first on rank 0, then each adds it.
  engine.ranks_->run([&](Engine::Impl& s) { id = add_prefilled(s, context, max_new_tokens); });
  return id;
}

SequenceId EngineBench::add_prefilled(Engine::Impl& s, int context, int max_new_tokens) {
  s.activate_device();
  DF_CHECK(context >= 0, "benchmark context is " + std::to_string(context) + "; it must be >= 0");
  DF_CHECK(max_new_tokens >= 1, "max_new_tokens is " + std::to_string(max_new_tokens) + "; it must be at least 1");
  // Like a prompt of context + 1 tokens (the last, id 0, not yet fed) with context prefilled.
  DF_CHECK(static_cast<int64_t>(context) + 1 + max_new_tokens <= s.options.max_context,
           "benchmark context " + std::to_string(context) + " + 1 pending token + max_new_tokens " +
               std::to_string(max_new_tokens) + " exceeds max_context " + std::to_string(s.options.max_context));
  DF_CHECK(s.step_scheduler->running() < s.options.max_batch,
           "all " + std::to_string(s.options.max_batch) + " decode rows (max_batch) are running");
  const int pages = batching::KvBlockPool::pages_for(context + 1);
  DF_CHECK(pages <= s.pool->available_pages(), "benchmark context " + std::to_string(context) + " needs " +
                                                   std::to_string(pages) + " KV pages, " +
                                                   std::to_string(s.pool->available_pages()) + " are free");
  const SequenceId id = s.next_id++;
  const batching::Sequence& sequence = s.step_scheduler->add_prefilled(static_cast<batching::SequenceKey>(id), context,
                                                                 max_new_tokens);
  s.settings[id] = {};  // greedy
  s.kv->set_row(sequence.row, sequence.pages);
  s.upload_slot(sequence.row, SamplingParams{});
  return id;
}

double EngineBench::decode_replay_ms(Engine& engine, int replays) {
  // Tensor parallel: every rank replays its step at once (their collectives meet); rank 0's time.
  double lead_ms = 0;
  engine.ranks_->run([&](Engine::Impl& s) {
    const double ms = decode_replay_ms(s, replays);
    if (s.link.shard.rank == 0) lead_ms = ms;
  });
  return lead_ms;
}

const std::vector<AllReduceTiming>& EngineBench::all_reduce_timings(const Engine& engine) {
  return engine.ranks_->all_reduce_timings();
}

void EngineBench::poison_buffers(Engine& engine) {
  constexpr uint16_t kNan = 0x7fc0;  // bf16 NaN; two of them are an fp32 NaN
  engine.ranks_->run([&](Engine::Impl& s) {
    s.activate_device();
    DF_CHECK(!s.step_scheduler->has_work() && s.launched.empty(), "poison_buffers: the engine must be idle and new");
    s.kv->fill_pools(kNan);
    runtime::StepBuffers& b = *s.buffers;
    // token_masks too: a masked step that samples a row it did not upload reads a nonsense mask
    for (DeviceBuffer* buffer : {&b.residual, &b.normed, &b.qkv, &b.q_rot, &b.attention_out, &b.logits,
                                 &b.decode_inputs, &b.prefill_inputs, &b.token_masks}) {
      if (buffer->bytes() == 0) continue;
      const std::vector<uint16_t> host(buffer->bytes() / sizeof(uint16_t), kNan);
      buffer->upload(host.data(), buffer->bytes());
    }
  });
}

void EngineBench::set_draft_source(Engine& engine, DraftSource source, DraftOutlook outlook) {
  Engine::Impl& s = engine.ranks_->lead();
  DF_CHECK(s.speculation, "set_draft_source: the engine was built without EngineOptions::speculative");
  s.speculation->force(std::move(source), std::move(outlook));
}

double EngineBench::decode_replay_ms(Engine::Impl& s, int replays) {
  s.activate_device();
  DF_CHECK(replays >= 1, "replays is " + std::to_string(replays) + "; it must be at least 1");
  const int running = s.step_scheduler->running();
  if (running == 0) return 0.0;
  const int bucket = s.lanes[0].graphs->bucket_index(running);
  const StepLane* lane = s.lane_with_graph(bucket);
  if (!lane) return 0.0;  // no step() of this bucket yet, or graphs off
  // The replays feed their own samples: keep the ids the next step() feeds, on the device and
  // in the lane's host buffer (a step in flight may not have been read back yet).
  const size_t id_bytes = running * sizeof(int32_t);
  DeviceBuffer saved_ids(id_bytes);
  DF_CHECK_CUDA(cudaMemcpyAsync(saved_ids.data(), s.buffers->decode_ids(), id_bytes, cudaMemcpyDeviceToDevice, s.stream()));
  DF_CHECK_CUDA(cudaStreamSynchronize(s.stream()));
  const std::vector<int32_t> saved_sampled(lane->sampled.as<int32_t>(), lane->sampled.as<int32_t>() + running);
  CudaEvent start, stop;
  start.record(s.stream());
  for (int r = 0; r < replays; ++r) DF_CHECK_CUDA(lane->graphs->replay(bucket, s.stream()));
  stop.record(s.stream());
  stop.synchronize();
  std::copy(saved_sampled.begin(), saved_sampled.end(), lane->sampled.as<int32_t>());
  DF_CHECK_CUDA(
      cudaMemcpyAsync(s.buffers->decode_ids(), saved_ids.data(), id_bytes, cudaMemcpyDeviceToDevice, s.stream()));
  DF_CHECK_CUDA(cudaStreamSynchronize(s.stream()));  // before saved_ids is freed
  return stop.ms_since(start) / replays;
}

}  // namespace deepfuse::runtime
