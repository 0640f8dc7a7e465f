// Speculative decoding on the CUDA engine (EngineOptions::speculative, issue 54):
//   - every token a verify step emits is the argmax of the verify pass's logits: the CPU reference
//     decoder, run along the engine's own tokens (teacher forcing), must rate each emitted token its
//     argmax or a near tie of it. Drafts come from an oracle (the reference's greedy continuation,
//     corrupted at a random place half the time), so verify steps accept all, some and none;
//   - greedy output with the suffix drafter equals the output without speculation, for a request
//     and its repeat (whose drafts come from the suffix cache and hit), up to a first difference
//     the reference rates a near tie (bf16 GEMMs of other row counts may round differently);
//   - steps no sequence may draft at are launched ahead (EngineOptions::overlap_steps) and the
//     others wait for the read-back, with output unchanged: drafts that never come (exactly the
//     output of an engine that never launches ahead), and drafts that come now and then and miss
//     (every emitted token the argmax);
//   - sampled output has the distribution of sampling without speculation: a chi-square test per
//     generated position over 1000 seeds on a 16-token vocabulary, drafts of random tokens.
// Engines are NaN-poisoned first (EngineBench::poison_buffers), so a verify that reads a position
// no step wrote changes tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"
#include "engine_test_util.hpp"
#include "logits_check.hpp"
#include "model/model_test_util.hpp"
#include "runtime/engine_bench.hpp"
#include "speculative/chi_square.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::random_ids;
using testing::tiny_models;

EngineOptions speculative_options(SpeculativeChoice choice) {
  EngineOptions o;
  o.max_batch = 4;
  o.max_context = 128;
  o.kv_cache_bytes = size_t{16} << 20;
  o.speculative = choice;
  o.max_draft = 6;
  return o;
}

// Steps until every sequence finished; each sequence's tokens in order.
std::map<SequenceId, std::vector<int32_t>> run_to_end(Engine& engine, size_t sequences, int max_steps) {
  std::map<SequenceId, std::vector<int32_t>> produced;
  size_t finished = 0;
  for (int step = 0; step < max_steps && finished < sequences; ++step)
    for (const StepToken& token : engine.step()) {
      produced[token.sequence].push_back(token.id);
      if (token.finish != FinishReason::none) ++finished;
    }
  EXPECT_EQ(finished, sequences) << "sequences still running after " << max_steps << " steps";
  return produced;
}

// Greedy requests for `prompts`, run together to the end: each one's tokens, in the prompts' order.
std::vector<std::vector<int32_t>> greedy_outputs(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                 int new_tokens) {
  std::vector<SequenceId> ids;
  for (const auto& prompt : prompts) ids.push_back(engine.add_sequence(testing::greedy_request(prompt, new_tokens)));
  auto produced = run_to_end(engine, ids.size(), new_tokens + 2);
  std::vector<std::vector<int32_t>> out;
  for (SequenceId id : ids) out.push_back(produced[id]);
  return out;
}

class SpeculativeVsReference : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    rng_ = testing::make_rng(5400 + GetParam());
    MakeModelOptions options;
    options.seed = rng_();
    write_random_checkpoint(tiny_models()[GetParam()].config, scratch_.path(), options);
    config_ = load_model_config(scratch_.path());
    reference_ = std::make_unique<reference::Decoder>(config_,
                                                      load_reference_weights(Checkpoint(scratch_.path()), config_));
  }

  Engine poisoned_engine(const EngineOptions& options) const {
    Engine engine = Engine::from_checkpoint(scratch_.path(), options);
    runtime::EngineBench::poison_buffers(engine);
    return engine;
  }

  std::vector<std::vector<int32_t>> random_prompts(std::initializer_list<int> lengths) {
    std::vector<std::vector<int32_t>> prompts;
    for (const int length : lengths) prompts.push_back(random_ids(rng_, length, config_.vocab_size));
    return prompts;
  }

  std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int count) const {
    reference::KvCache cache = reference_->new_cache();
    std::vector<float> logits = reference_->forward(prompt, cache);
    std::vector<int32_t> out;
    const size_t vocab = config_.vocab_size;
    for (int t = 0; t < count; ++t) {
      out.push_back(static_cast<int32_t>(testing::argmax(std::span<const float>(logits.end() - vocab, logits.end()))));
      logits = reference_->forward(std::span(&out.back(), 1), cache);
    }
    return out;
  }

  // Each of `ours` (the tokens after `prompt`) is the reference's argmax after prompt + ours[0, t),
  // or a near tie of it. Returns how many are the argmax itself.
  int expect_argmax_under_teacher_forcing(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ours,
                                          const std::string& what) const {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), ours.begin(), ours.end());
    reference::KvCache cache = reference_->new_cache();
    const std::vector<float> logits = reference_->forward(std::span(all).first(all.size() - 1), cache);
    const size_t vocab = config_.vocab_size;
    int exact = 0;
    for (size_t t = 0; t < ours.size(); ++t) {
      const std::span<const float> row(logits.data() + (prompt.size() - 1 + t) * vocab, vocab);
      const auto best = static_cast<int32_t>(testing::argmax(row));
      const bool in_range = ours[t] >= 0 && ours[t] < static_cast<int32_t>(vocab);
      exact += ours[t] == best;
      EXPECT_TRUE(in_range && (ours[t] == best || testing::near_tie(row, ours[t], best)))
          << what << " token " << t << ": engine " << ours[t] << ", reference argmax " << best;
    }
    return exact;
  }

  std::mt19937_64 rng_;
  testing::ScratchDir scratch_;
  ModelConfig config_;
  std::unique_ptr<reference::Decoder> reference_;
};

TEST_P(SpeculativeVsReference, EveryEmittedTokenIsTheVerifyArgmax) {
  DF_REQUIRE_GPU();
  Engine engine = poisoned_engine(speculative_options(SpeculativeChoice::ngram));
  constexpr int kNewTokens = 40;
  struct Oracle {
    size_t prompt = 0;
    std::vector<int32_t> continuation;
  };
  std::map<SequenceId, Oracle> oracles;
  std::map<SequenceId, std::vector<int32_t>> prompts;
  for (int length : {5, 20, 37}) {
    const std::vector<int32_t> prompt = random_ids(rng_, length, config_.vocab_size);
    const SequenceId id = engine.add_sequence(testing::greedy_request(prompt, kNewTokens));
    oracles[id] = {prompt.size(), reference_greedy(prompt, kNewTokens + 8)};
    prompts[id] = prompt;
  }
  // The reference's next tokens, one of them replaced half the time: steps accept all, some, none.
  std::mt19937_64 corrupt(rng_());
  runtime::EngineBench::set_draft_source(engine, [&](SequenceId id, std::span<const int32_t> tokens, int limit) {
    const Oracle& oracle = oracles.at(id);
    const size_t done = tokens.size() - oracle.prompt;
    const int k = std::min<int>(static_cast<int>(corrupt() % (limit + 1)),
                                static_cast<int>(oracle.continuation.size() - std::min(done, oracle.continuation.size())));
    std::vector<int32_t> drafts(oracle.continuation.begin() + done, oracle.continuation.begin() + done + k);
    if (k > 0 && corrupt() % 2) {
      const int at = static_cast<int>(corrupt() % k);
      drafts[at] = (drafts[at] + 1 + static_cast<int32_t>(corrupt() % (config_.vocab_size - 1))) % config_.vocab_size;
    }
    return drafts;
  });
  const auto produced = run_to_end(engine, prompts.size(), kNewTokens + 2);
  int exact = 0, total = 0;
  for (const auto& [id, prompt] : prompts) {
    const std::vector<int32_t>& ours = produced.at(id);
    ASSERT_EQ(ours.size(), static_cast<size_t>(kNewTokens)) << "sequence " << id;
    exact += expect_argmax_under_teacher_forcing(prompt, ours, "sequence " + std::to_string(id));
    total += kNewTokens;
  }
  const Engine::SpeculativeCounts counts = engine.speculative_counts();
  std::printf("[ %s ] argmax %d of %d tokens; drafts accepted %llu of %llu\n", tiny_models()[GetParam()].name.c_str(),
              exact, total, static_cast<unsigned long long>(counts.accepted_draft_tokens),
              static_cast<unsigned long long>(counts.draft_tokens));
  EXPECT_GT(counts.accepted_draft_tokens, 0u) << "no verify step accepted a draft";
  EXPECT_GT(counts.draft_tokens, counts.accepted_draft_tokens) << "no verify step rejected a draft";
}

TEST_P(SpeculativeVsReference, GreedyOutputEqualsNonSpeculativeOutput) {
  DF_REQUIRE_GPU();
  constexpr int kNewTokens = 48;
  const std::vector<std::vector<int32_t>> prompts = random_prompts({6, 29, 18});
  auto generate = [&](Engine& engine) { return greedy_outputs(engine, prompts, kNewTokens); };
  Engine plain_engine = poisoned_engine(speculative_options(SpeculativeChoice::off));
  const auto plain = generate(plain_engine);
  Engine engine = poisoned_engine(speculative_options(SpeculativeChoice::suffix));
  for (int round = 0; round < 2; ++round) {  // the repeat's drafts come from the suffix cache
    const Engine::SpeculativeCounts before = engine.speculative_counts();
    const auto spec = generate(engine);
    const Engine::SpeculativeCounts after = engine.speculative_counts();
    for (size_t s = 0; s < prompts.size(); ++s)
      testing::same_or_parted_at_near_tie(*reference_, prompts[s], spec[s], plain[s],
                                          "round " + std::to_string(round) + ", sequence " + std::to_string(s));
    const uint64_t drafted = after.draft_tokens - before.draft_tokens;
    const uint64_t accepted = after.accepted_draft_tokens - before.accepted_draft_tokens;
    std::printf("[ %s ] round %d: drafts accepted %llu of %llu, %llu steps launched ahead\n",
                tiny_models()[GetParam()].name.c_str(), round, static_cast<unsigned long long>(accepted),
                static_cast<unsigned long long>(drafted),
                static_cast<unsigned long long>(after.launched_ahead_steps - before.launched_ahead_steps));
    if (round == 1) EXPECT_GT(accepted, drafted / 2) << "the repeat's drafts (its earlier output) mostly missed";
  }
}

// Drafts that never come: a source that proposes nothing and says, per sequence, when it might
// (its outlook). Steps no sequence might draft at are launched ahead; the others wait for the read-
// back of the step before. Every step is a plain step, so the output follows that of the engine
// that never launches ahead (an outlook that always says yes) and that of the engine without
// speculation, each up to a first difference the reference rates a near tie: on an H200, 2 of the
// 4 models parted from the never-ahead engine at such a tie (at token 17 and after 32), so
// bit-for-bit equality across engines is not what the CUDA engine gives (why is not yet known).
// A launched-ahead step fed a stale token would part at no near tie.
TEST_P(SpeculativeVsReference, StepsNoSequenceMayDraftAtAreLaunchedAhead) {
  DF_REQUIRE_GPU();
  constexpr int kNewTokens = 40;
  const std::vector<std::vector<int32_t>> prompts = random_prompts({7, 23, 16});
  Engine plain_engine = poisoned_engine(speculative_options(SpeculativeChoice::off));
  const auto plain = greedy_outputs(plain_engine, prompts, kNewTokens);
  std::map<int, uint64_t> ahead;  // by how often the outlook says yes: every n-th length (0: never)
  std::vector<std::vector<int32_t>> never_ahead;
  for (const int every : {1, 5, 0}) {
    Engine engine = poisoned_engine(speculative_options(SpeculativeChoice::suffix));
    int asked = 0;
    runtime::EngineBench::set_draft_source(
        engine, [](SequenceId, std::span<const int32_t>, int) { return std::vector<int32_t>{}; },
        [&](SequenceId, std::span<const int32_t> tokens) {
          ++asked;
          return every > 0 && (tokens.size() + 1) % every == 0;
        });
    const auto spec = greedy_outputs(engine, prompts, kNewTokens);
    const Engine::SpeculativeCounts counts = engine.speculative_counts();
    ahead[every] = counts.launched_ahead_steps;
    std::printf("[ %s ] outlook yes every %d: %llu steps launched ahead, outlook asked %d times\n",
                tiny_models()[GetParam()].name.c_str(), every,
                static_cast<unsigned long long>(counts.launched_ahead_steps), asked);
    EXPECT_EQ(counts.draft_tokens, 0u);
    EXPECT_GT(asked, 0) << "every " << every;
    if (every == 1) never_ahead = spec;
    for (size_t s = 0; s < prompts.size(); ++s) {
      testing::same_or_parted_at_near_tie(*reference_, prompts[s], spec[s], never_ahead[s],
                                          "against never ahead: outlook yes every " + std::to_string(every) +
                                              ", sequence " + std::to_string(s));
      testing::same_or_parted_at_near_tie(*reference_, prompts[s], spec[s], plain[s],
                                          "outlook yes every " + std::to_string(every) + ", sequence " +
                                              std::to_string(s));
    }
  }
  EXPECT_EQ(ahead[1], 0u) << "a step launched ahead although some sequence might draft at it";
  EXPECT_GT(ahead[5], 0u);
  EXPECT_GT(ahead[0], ahead[5]);
  EXPECT_GE(ahead[0], static_cast<uint64_t>(kNewTokens / 2)) << "steps no sequence may draft at waited";
}

// Drafts that come now and then and always miss (the reference's next token, changed), announced
// a step ahead by the source's outlook: the steps between them are launched ahead, those that
// verify wait for the read-back, and every emitted token is still the verify pass's argmax.
TEST_P(SpeculativeVsReference, MissedDraftsBetweenStepsLaunchedAhead) {
  DF_REQUIRE_GPU();
  Engine engine = poisoned_engine(speculative_options(SpeculativeChoice::ngram));
  constexpr int kNewTokens = 40, kEvery = 6;
  std::map<SequenceId, std::vector<int32_t>> prompts, continuations;
  for (int length : {5, 20, 37}) {
    const std::vector<int32_t> prompt = random_ids(rng_, length, config_.vocab_size);
    const SequenceId id = engine.add_sequence(testing::greedy_request(prompt, kNewTokens));
    prompts[id] = prompt;
    continuations[id] = reference_greedy(prompt, kNewTokens + 1);
  }
  runtime::EngineBench::set_draft_source(
      engine,
      [&](SequenceId id, std::span<const int32_t> tokens, int limit) {
        std::vector<int32_t> drafts;
        if (tokens.size() % kEvery != 0) return drafts;
        const size_t done = tokens.size() - prompts.at(id).size();
        const std::vector<int32_t>& next = continuations.at(id);
        for (int j = 0; j < limit && done + j < next.size(); ++j) drafts.push_back(next[done + j]);
        if (!drafts.empty()) drafts[0] = (drafts[0] + 1) % config_.vocab_size;  // a miss from the first
        return drafts;
      },
      [&](SequenceId, std::span<const int32_t> tokens) { return (tokens.size() + 1) % kEvery == 0; });
  const auto produced = run_to_end(engine, prompts.size(), kNewTokens + 2);
  for (const auto& [id, prompt] : prompts) {
    ASSERT_EQ(produced.at(id).size(), static_cast<size_t>(kNewTokens)) << "sequence " << id;
    expect_argmax_under_teacher_forcing(prompt, produced.at(id), "sequence " + std::to_string(id));
  }
  const Engine::SpeculativeCounts counts = engine.speculative_counts();
  std::printf("[ %s ] %llu drafts, %llu accepted, %llu steps launched ahead\n", tiny_models()[GetParam()].name.c_str(),
              static_cast<unsigned long long>(counts.draft_tokens),
              static_cast<unsigned long long>(counts.accepted_draft_tokens),
              static_cast<unsigned long long>(counts.launched_ahead_steps));
  EXPECT_GT(counts.draft_tokens, 0u) << "no step verified drafts";
  // Each first draft differs from the reference's pick (the engine's, unless they parted at a near tie).
  EXPECT_LT(counts.accepted_draft_tokens, counts.draft_tokens);
  EXPECT_GT(counts.launched_ahead_steps, 0u);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, SpeculativeVsReference, ::testing::Range(0, static_cast<int>(tiny_models().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return tiny_models()[info.param].name; });

// 1000 sampled sequences of 5 tokens with speculation (3 drafts of random tokens of {0, 1} a step:
// the accepting and the rejecting branch both run often) and 1000 without, on the same weights and
// seeds: each generated position's tokens must have one distribution.
TEST(SpeculativeSampling, SampledOutputHasTheNonSpeculativeDistribution) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(5480);
  // llama_gqa's shapes with one layer and a 16-token vocabulary (rows of 64 bytes of fp32 logits).
  const ModelConfig config = testing::tiny_config(Architecture::llama, 16, 256, 512, 1, 4, 2, 64, 10000.0);
  const std::vector<int32_t> prompt = random_ids(rng, 6, config.vocab_size);
  constexpr int kRuns = 1000, kTokens = 5;
  const uint64_t weights_seed = rng(), base_seed = rng();
  auto sample = [&](SpeculativeChoice choice) {
    EngineOptions options = speculative_options(choice);
    options.max_batch = 16;
    options.max_draft = 3;
    Engine engine = Engine::with_random_weights(config, options, weights_seed);
    if (choice != SpeculativeChoice::off)
      runtime::EngineBench::set_draft_source(engine, [&](SequenceId, std::span<const int32_t>, int limit) {
        return random_ids(rng, std::min(3, limit), 2);
      });
    std::vector<std::vector<int32_t>> runs;
    for (int first = 0; first < kRuns; first += options.max_batch) {
      std::vector<SequenceId> ids;
      for (int r = first; r < std::min(kRuns, first + options.max_batch); ++r) {
        SequenceRequest request = testing::greedy_request(prompt, kTokens);
        request.sampling.temperature = 0.7f;
        request.sampling.seed = base_seed + r;
        ids.push_back(engine.add_sequence(request));
      }
      auto produced = run_to_end(engine, ids.size(), kTokens + 2);
      for (SequenceId id : ids) {
        EXPECT_EQ(produced[id].size(), static_cast<size_t>(kTokens));
        produced[id].resize(kTokens, 0);
        runs.push_back(produced[id]);
      }
    }
    const Engine::SpeculativeCounts counts = engine.speculative_counts();
    std::printf("%s: drafts accepted %llu of %llu\n", choice_name(choice),
                static_cast<unsigned long long>(counts.accepted_draft_tokens),
                static_cast<unsigned long long>(counts.draft_tokens));
    if (choice != SpeculativeChoice::off) {
      EXPECT_GT(counts.accepted_draft_tokens, 100u) << "the accepting branch barely ran";
      EXPECT_GT(counts.draft_tokens - counts.accepted_draft_tokens, 100u) << "the rejecting branch barely ran";
    }
    return runs;
  };
  const auto plain = sample(SpeculativeChoice::off);
  const auto spec = sample(SpeculativeChoice::ngram);
  EXPECT_LT(testing::worst_chi_square_excess(spec, plain, config.vocab_size), 0.0);
}

}  // namespace
}  // namespace deepfuse
