// Teacher forcing for tests and `deepfuse score`: given ids run through fresh sequences (a
// prefill of the first prefill_tokens ids, then one decode step per remaining id, through the same
// decode graphs generation uses) and fp32 logits come back for every position.
#include <algorithm>
#include <string>

#include "deepfuse/error.hpp"
#include "runtime/engine_impl.hpp"
#include "runtime/rank_group.hpp"

namespace deepfuse {


std::vector<float> Engine::score(std::span<const int32_t> ids, int prefill_tokens) {
  std::vector<std::vector<float>> logits = score_batch({std::vector<int32_t>(ids.begin(), ids.end())}, {prefill_tokens});
  return std::move(logits.front());
}

std::vector<std::vector<float>> Engine::score_batch(const std::vector<std::vector<int32_t>>& sequences,
                                                    const std::vector<int>& prefill_tokens) {
  // Tensor parallel: every rank runs the passes; rank 0 holds the gathered logits.
  std::vector<std::vector<float>> logits;
  ranks_->run([&](Impl& s) {
    s.activate_device();
    std::vector<std::vector<float>> mine = s.score_batch(sequences, prefill_tokens);
    if (s.link.shard.rank == 0) logits = std::move(mine);
  });
  return logits;
}

void Engine::Impl::logits_of_chunk(int tokens, float* out) {
  const size_t vocab = config.vocab_size;
  forward->final_norm(0, tokens, stream());
  for (int first = 0; first < tokens; first += buffers->logits_rows) {
    const int rows = std::min(buffers->logits_rows, tokens - first);
    forward->lm_head(first, rows, stream());  // every rank: its all-gather takes part in the collective
    // Stream order keeps this copy ahead of the next group's lm_head, which reuses the buffer.
    if (out)
      DF_CHECK_CUDA(cudaMemcpyAsync(out + first * vocab, buffers->logits.data(), rows * vocab * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream()));
  }
  DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
}

std::vector<std::vector<float>> Engine::Impl::score_batch(const std::vector<std::vector<int32_t>>& sequences,
                                                          const std::vector<int>& prefill_tokens) {
  const int running = step_scheduler->running();
  DF_CHECK(running == 0, "score needs an engine with no running sequences (" + std::to_string(running) +
                         " are running: step them to the end or remove them first)");
  forget_launched_steps();  // steps launched ahead for sequences since finished
  const int count = static_cast<int>(sequences.size());
  DF_CHECK(count >= 1 && count <= options.max_batch, "score_batch of " + std::to_string(count) +
                                                         " sequences: it takes 1.." +
                                                         std::to_string(options.max_batch) + " (max_batch)");
  DF_CHECK(prefill_tokens.size() == sequences.size(),
           "score_batch: " + std::to_string(prefill_tokens.size()) + " prefill lengths for " + std::to_string(count) +
               " sequences");
  int pages = 0;
  for (int i = 0; i < count; ++i) {
    const std::string what = "score sequence " + std::to_string(i);
    validate_ids(sequences[i], what);
    const int length = static_cast<int>(sequences[i].size());
    DF_CHECK(length <= options.max_context, what + " has " + std::to_string(length) + " tokens, max_context is " +
                                                std::to_string(options.max_context));
    DF_CHECK(prefill_tokens[i] >= 1 && prefill_tokens[i] <= length,
             what + ": prefill_tokens " + std::to_string(prefill_tokens[i]) + " is outside 1.." +
                 std::to_string(length));
    pages += batching::KvBlockPool::pages_for(length);
  }
  DF_CHECK(pages <= pool->available_pages(), "score needs " + std::to_string(pages) + " KV pages, " +
                                                 std::to_string(pool->available_pages()) + " are free");

  // Rows 0..count-1 for the duration of the call (nothing else runs), with pages taken from the
  // pool and given back on any exit path.
  struct PagesGuard {
    batching::KvBlockPool& pool;
    std::vector<batching::PageId> pages;
    ~PagesGuard() {
      for (const batching::PageId page : pages) pool.release(page);
    }
  } guard{*pool, {}};
  const size_t vocab = config.vocab_size;
  // Tensor parallel: only rank 0 holds whole logits rows; the others run the same passes (their
  // collectives must take part) and keep nothing, so no rank but 0 holds a host copy.
  const bool keep = samples_here();
  std::vector<std::vector<float>> logits(count);
  for (int i = 0; i < count; ++i) {
    std::vector<batching::PageId> row_pages;  // every position, checked above
    while (static_cast<int>(row_pages.size()) < batching::KvBlockPool::pages_for(static_cast<int>(sequences[i].size())))
      row_pages.push_back(guard.pages.emplace_back(*pool->allocate()));
    kv->set_row(i, row_pages);
    upload_slot(i, SamplingParams{});  // sampled ids are ignored: greedy
    if (keep) logits[i].resize(sequences[i].size() * vocab);
  }
  for (int i = 0; i < count; ++i) {
    const std::span<const int32_t> prompt(sequences[i].data(), prefill_tokens[i]);
    prefill(i, prompt, 0, [&](int first, int tokens) {
      logits_of_chunk(tokens, keep ? logits[i].data() + first * vocab : nullptr);
    });
  }

  int steps = 0;
  for (int i = 0; i < count; ++i) steps = std::max(steps, static_cast<int>(sequences[i].size()) - prefill_tokens[i]);
  for (int step = 0; step < steps; ++step) {
    // Sequence i feeds its id at position prefill_tokens[i] + step; those out of ids sit out (padded).
    auto position_of = [&](int row) { return prefill_tokens[row] + step; };
    auto has_id = [&](int row) { return position_of(row) < static_cast<int>(sequences[row].size()); };
    run_decode_step(lanes[next_lane], count, [&](int row, int32_t& id, int& position) {
      if (!has_id(row)) return false;
      position = position_of(row);
      id = sequences[row][position];
      return true;
    });
    for (int row = 0; row < count && keep; ++row)
      if (has_id(row))
        DF_CHECK_CUDA(cudaMemcpyAsync(logits[row].data() + position_of(row) * vocab,
                                      buffers->logits.as<float>() + row * vocab, vocab * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream()));
    DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
  }
  return logits;
}

}  // namespace deepfuse
