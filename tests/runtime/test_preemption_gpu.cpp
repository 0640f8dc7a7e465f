// The CUDA engine under the step scheduler's preemption (src/batching): a KV cache too small for
// every sequence at once. The youngest running sequence gives its pages back and waits; readmitted,
// it recomputes its prompt and the tokens it generated (the prefill path, partly from the prefix
// cache) and carries on. Each sequence's greedy tokens must still follow the reference decoder's
// greedy decode of its own prompt, with steps launched ahead and without, and no page may leak.
// (The scheduling policy itself is tested on the CPU: tests/batching/test_step_scheduler.cpp.)
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"
#include "engine_test_util.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

TEST(EnginePreemption, PreemptedSequencesRecomputeAndFollowTheReference) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(601);
  const testing::ScratchDir scratch;
  const ModelConfig made = testing::tiny_config(Architecture::llama, 512, 256, 512, 2, 4, 2, 64, 10000.0);
  MakeModelOptions make;
  make.seed = rng();
  write_random_checkpoint(made, scratch.path(), make);
  const ModelConfig config = load_model_config(scratch.path());
  const reference::Decoder reference(config, load_reference_weights(Checkpoint(scratch.path()), config));

  const std::vector<int> prompt_lengths = {20, 7, 33, 12}, new_tokens = {40, 45, 30, 40};  // four pages each
  std::vector<std::vector<int32_t>> prompts;
  for (const int length : prompt_lengths) prompts.push_back(testing::random_ids(rng, length, config.vocab_size));
  for (const bool overlap : {true, false}) {
    for (const bool prefix_caching : {true, false}) {
      const std::string trace = std::string(overlap ? "steps overlapped" : "one step at a time") +
                                (prefix_caching ? ", prefix cache" : "");
      SCOPED_TRACE(trace);
      EngineOptions options;
      options.max_batch = 4;
      options.max_context = 128;
      options.overlap_steps = overlap;
      options.prefix_caching = prefix_caching;
      options.prefill_tokens_per_step = 16;
      const size_t page_bytes = size_t{2} * config.num_hidden_layers * config.kv_size() * 16 * sizeof(uint16_t);
      options.kv_cache_bytes = 8 * page_bytes;  // two sequences' worth of the four's 16 pages
      Engine engine = Engine::from_checkpoint(scratch.path(), options);
      ASSERT_EQ(engine.stats().kv_pages_total, 8);
      std::vector<SequenceId> ids;
      for (size_t s = 0; s < prompts.size(); ++s) {
        SequenceRequest request;
        request.prompt = prompts[s];
        request.max_new_tokens = new_tokens[s];
        ids.push_back(engine.add_sequence(request));
      }
      std::map<SequenceId, std::vector<StepToken>> produced;
      for (int step = 0; engine.running_sequences() > 0 && step < 1000; ++step)
        for (const StepToken& token : engine.step()) produced[token.sequence].push_back(token);
      EXPECT_EQ(engine.running_sequences(), 0);
      EXPECT_GE(engine.scheduling_stats().preemptions, 1u) << "the cache was meant to be too small for all four";
      for (size_t s = 0; s < prompts.size(); ++s) {
        const std::string what = trace + ", sequence " + std::to_string(s);
        const std::vector<StepToken>& tokens = produced[ids[s]];
        ASSERT_EQ(tokens.size(), static_cast<size_t>(new_tokens[s])) << what;
        std::vector<int32_t> generated;
        for (size_t t = 0; t < tokens.size(); ++t) {
          generated.push_back(tokens[t].id);
          EXPECT_EQ(tokens[t].finish, t + 1 == tokens.size() ? FinishReason::max_tokens : FinishReason::none) << what;
        }
        EXPECT_EQ(tokens[0].cached_tokens, 0) << what << ": no prompt shares a block";
        testing::reference_greedy_matches(reference, prompts[s], generated, config.vocab_size, what);
      }
      const EngineStats stats = engine.stats();
      EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total) << "pages leaked";
    }
  }
}

}  // namespace
}  // namespace deepfuse
