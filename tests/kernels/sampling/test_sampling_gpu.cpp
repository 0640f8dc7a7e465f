// GPU sampling against the CPU reference (reference::sample, reference::sampling_distribution)
// on fresh random logits: greedy exactly (ties included) over 152064 and 128256 tokens, and for
// temperature / top-k / top-p / min-p (alone, combined, different per sequence of one batch)
// over many steps: every GPU id must have nonzero reference probability, and at least 99% of the
// ids must equal the reference's draw with the same seed and step (they differ only when u lands
// within rounding of a CDF boundary). Every cluster size the device runs is tested; the slots'
// steps must advance by one per launch, and a captured graph must keep drawing the next steps.
// DEEPFUSE_TEST_QUICK=1 (compute-sanitizer runs) keeps every case with a fiftieth of the draws
// and the greedy test's smaller vocabularies (racecheck took 1.4 s per launch of 9 sequences).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/sampling.hpp"
#include "runtime/pinned_buffer.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using kernels::SamplingSlot;

constexpr int32_t kPoisonId = -12345;
constexpr int kAutoCluster = 0;  // launch_sampling's own choice

struct Spec {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

std::string describe(const Spec& s) {
  return "T=" + std::to_string(s.temperature) + " top_k=" + std::to_string(s.top_k) +
         " top_p=" + std::to_string(s.top_p) + " min_p=" + std::to_string(s.min_p);
}

SamplingSlot make_slot(const Spec& s, uint64_t seed, uint64_t step) {
  SamplingSlot slot;
  slot.temperature = s.temperature, slot.top_k = s.top_k, slot.top_p = s.top_p, slot.min_p = s.min_p;
  slot.seed = seed, slot.step = step;
  return slot;
}

SamplingParams reference_params(const SamplingSlot& slot) {
  SamplingParams p;
  p.temperature = slot.temperature, p.top_k = slot.top_k, p.top_p = slot.top_p, p.min_p = slot.min_p;
  p.seed = slot.seed;
  return p;
}

// The reference's inverse CDF (the loop of reference::sample) over a precomputed distribution,
// so many steps cost one distribution; checked against reference::sample itself below.
int32_t draw_from(const std::vector<double>& probs, double u) {
  double cumulative = 0;
  int32_t last_possible = 0;
  for (size_t id = 0; id < probs.size(); ++id) {
    if (probs[id] == 0.0) continue;
    last_possible = static_cast<int32_t>(id);
    cumulative += probs[id];
    if (u < cumulative) return last_possible;
  }
  return last_possible;
}

// Logits shaped like a language model's: a broad bulk and a few dozen strong candidates.
std::vector<float> llm_like_logits(std::mt19937_64& rng, int vocab, int candidates = 40) {
  std::normal_distribution<float> bulk(0.0f, 2.0f), boost(9.0f, 2.5f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = bulk(rng);
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  for (int i = 0; i < candidates; ++i) logits[pick(rng)] += boost(rng);
  return logits;
}

// Logits that went through bf16 (an lm_head with bf16 output): many exact ties.
std::vector<float> bf16_logits(std::mt19937_64& rng, int vocab) {
  std::vector<float> logits = llm_like_logits(rng, vocab, 200);
  for (float& l : logits) l = round_to_bf16(l);
  return logits;
}

std::vector<float> flat_logits(std::mt19937_64& rng, int vocab) { return testing::random_uniform(rng, vocab, 3.0f); }

struct Draws {
  bool supported = true;
  std::vector<int32_t> ids;  // [steps][batch]
  std::vector<SamplingSlot> slots;
};

// `steps` launches over the same logits, each writing its own row of ids; `masks`: the rows'
// token bitmasks ([batch, token_bitmask_words(vocab)]), or empty for none.
Draws run_draws(const std::vector<float>& logits, int vocab, const std::vector<SamplingSlot>& slots, int steps,
                int cluster, const std::vector<uint32_t>& masks = {}) {
  const int batch = static_cast<int>(slots.size());
  DeviceBuffer logits_dev = DeviceBuffer::from_host(logits);
  DeviceBuffer masks_dev = DeviceBuffer::from_host(masks.empty() ? std::vector<uint32_t>(1) : masks);
  DeviceBuffer slots_dev = DeviceBuffer::from_host(slots);
  DeviceBuffer ids_dev = DeviceBuffer::from_host(std::vector<int32_t>(static_cast<size_t>(steps) * batch, kPoisonId));
  DeviceBuffer workspace(std::max<size_t>(kernels::sampling_workspace_bytes(batch, vocab), 1));
  kernels::SamplingParams params;
  params.logits = logits_dev.as<float>();
  params.slots = slots_dev.as<SamplingSlot>();
  params.workspace = workspace.data();
  params.batch = batch;
  params.vocab = vocab;
  if (!masks.empty()) params.token_bitmask = masks_dev.as<uint32_t>();
  Draws draws;
  for (int s = 0; s < steps; ++s) {
    params.ids = ids_dev.as<int32_t>() + static_cast<size_t>(s) * batch;
    const cudaError_t e = cluster == kAutoCluster ? kernels::launch_sampling(params, nullptr)
                                                  : kernels::launch_sampling_with_cluster_size(params, cluster, nullptr);
    if (e == cudaErrorNotSupported) {
      draws.supported = false;
      return draws;
    }
    DF_CHECK_CUDA(e);
  }
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  draws.ids = ids_dev.to_host<int32_t>(static_cast<size_t>(steps) * batch);
  draws.slots = slots_dev.to_host<SamplingSlot>(batch);
  return draws;
}

const std::vector<int> kClusterSizes = {1, 4, 8, 16};

// Draws per slot: `full`, or a fiftieth of it (at least 3) in quick mode.
int draws_for(int full) { return testing::quick_mode() ? std::max(3, full / 50) : full; }

// Row b of `logits` as the reference samples it: with row b of `masks` applied, when given.
std::vector<float> reference_row(const std::vector<float>& logits, int vocab, int b,
                                 const std::vector<uint32_t>& masks) {
  std::vector<float> row(logits.begin() + static_cast<size_t>(b) * vocab, logits.begin() + static_cast<size_t>(b + 1) * vocab);
  const size_t words = token_bitmask_words(vocab);
  if (!masks.empty()) reference::apply_token_bitmask(row, std::span(masks).subspan(b * words, words));
  return row;
}

// Runs `steps` draws per slot for every cluster size and checks them against the reference.
void expect_matches_reference(const std::vector<float>& logits, int vocab, const std::vector<SamplingSlot>& slots,
                              int steps, const std::string& what, const std::vector<uint32_t>& masks = {}) {
  const int batch = static_cast<int>(slots.size());
  std::vector<std::vector<double>> probs(batch);
  for (int b = 0; b < batch; ++b) {
    const std::vector<float> row = reference_row(logits, vocab, b, masks);
    const SamplingParams params = reference_params(slots[b]);
    probs[b] = reference::sampling_distribution(row, params, {});
    for (uint64_t step = slots[b].step; step < slots[b].step + 3; ++step)  // the shortcut is reference::sample
      ASSERT_EQ(draw_from(probs[b], reference::sampling_uniform(params.seed, step)),
                reference::sample(row, params, {}, step));
  }
  for (int cluster : kClusterSizes) {
    const Draws draws = run_draws(logits, vocab, slots, steps, cluster, masks);
    if (!draws.supported) {
      std::printf("[ note     ] %s: cluster size %d not supported here, skipped\n", what.c_str(), cluster);
      continue;
    }
    for (int b = 0; b < batch; ++b) {
      int matches = 0;
      for (int s = 0; s < steps; ++s) {
        const int32_t id = draws.ids[static_cast<size_t>(s) * batch + b];
        const uint64_t step = slots[b].step + s;
        const int32_t expected = draw_from(probs[b], reference::sampling_uniform(slots[b].seed, step));
        ASSERT_TRUE(id >= 0 && id < vocab) << what << " cluster " << cluster << " row " << b << " step " << step
                                           << ": id " << id;
        EXPECT_GT(probs[b][id], 0.0) << what << " cluster " << cluster << " row " << b << " (" << describe(Spec{
                                            slots[b].temperature, slots[b].top_k, slots[b].top_p, slots[b].min_p})
                                     << ") step " << step << ": id " << id << " has reference probability 0 (expected "
                                     << expected << ")";
        matches += id == expected;
      }
      EXPECT_GE(matches, (steps * 99 + 99) / 100)
          << what << " cluster " << cluster << " row " << b << " ("
          << describe(Spec{slots[b].temperature, slots[b].top_k, slots[b].top_p, slots[b].min_p}) << "): " << matches
          << " of " << steps << " draws equal the reference's";
      EXPECT_EQ(draws.slots[b].step, slots[b].step + steps) << what << " cluster " << cluster << " row " << b;
    }
  }
}

std::vector<SamplingSlot> slots_for(std::mt19937_64& rng, const std::vector<Spec>& specs) {
  std::vector<SamplingSlot> slots;
  std::uniform_int_distribution<uint64_t> step(0, 100000);
  for (const Spec& s : specs) slots.push_back(make_slot(s, rng(), step(rng)));
  return slots;
}

TEST(SamplingGpu, GreedyIsTheArgmaxWithTheLowestIdOnTies) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(701);
  // Vocabularies that are multiples of 4 take the float4 sweep, the others the scalar one.
  for (int vocab : {152064, 128256, 50257, 1000, 7}) {
    if (testing::quick_mode() && vocab > 128256) continue;
    for (int batch : {1, 3, 8}) {
      std::vector<float> logits;
      for (int b = 0; b < batch; ++b) {
        std::vector<float> row = llm_like_logits(rng, vocab, std::min(40, vocab / 2 + 1));
        std::uniform_int_distribution<int> pick(0, vocab - 1);
        const float top = 40.0f, nan = std::numeric_limits<float>::quiet_NaN();
        switch (b % 5) {
          case 0: row[pick(rng)] = top; break;                                       // one maximum
          case 1: for (int i = 0; i < 3; ++i) row[pick(rng)] = top; break;           // tied maxima
          case 2: row[vocab - 1] = top, row[pick(rng) / 2] = top; break;            // ties far apart
          case 3: row[0] = top, row[vocab - 1] = top, row[vocab / 2] = -std::numeric_limits<float>::infinity(); break;
          case 4: {  // NaNs are never chosen, wherever they sit (not at id 0, where the reference's
                     // max_element would return one)
            std::uniform_int_distribution<int> after_first(1, vocab - 1);
            for (int i = 0; i < 5; ++i) row[after_first(rng)] = nan;
            row[vocab / 3 - 1] = nan, row[vocab / 3] = top, row[vocab / 3 + 1] = nan;
            break;
          }
        }
        logits.insert(logits.end(), row.begin(), row.end());
      }
      std::vector<SamplingSlot> slots;
      for (int b = 0; b < batch; ++b) slots.push_back(make_slot(Spec{b == 1 ? -1.0f : 0.0f, 50, 0.9f, 0.1f}, rng(), 7));
      for (int cluster : {kAutoCluster, 1, 4, 8, 16}) {
        const Draws draws = run_draws(logits, vocab, slots, 2, cluster);
        if (!draws.supported) continue;
        for (int s = 0; s < 2; ++s) {
          for (int b = 0; b < batch; ++b) {
            const std::span<const float> row(logits.data() + static_cast<size_t>(b) * vocab, vocab);
            EXPECT_EQ(draws.ids[s * batch + b], reference::sample(row, reference_params(slots[b]), {}, 7 + s))
                << "vocab " << vocab << " batch " << batch << " row " << b << " cluster " << cluster << " step " << s;
          }
        }
        for (int b = 0; b < batch; ++b) EXPECT_EQ(draws.slots[b].step, 9u) << "row " << b;
      }
    }
  }
}

// One batch, a different processor chain per sequence, 152064 tokens.
TEST(SamplingGpu, PerSequenceParametersMatchTheReference) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(702);
  const int vocab = 152064;
  const std::vector<Spec> specs = {
      {0.7f, 0, 1.0f, 0.0f},    {0.7f, 50, 1.0f, 0.0f},  {0.7f, 0, 0.9f, 0.0f},   {0.7f, 0, 1.0f, 0.05f},
      {0.7f, 50, 0.9f, 0.05f},  {1.0f, 1, 1.0f, 0.0f},   {1.3f, 200, 0.5f, 0.0f}, {0.9f, 0, 0.95f, 0.02f},
      {0.08f, 0, 0.97f, 0.0f},  // most tokens beyond level 0's 32 nats: its last, open-ended bin
  };
  std::vector<float> logits;
  for (size_t b = 0; b < specs.size(); ++b) {
    const std::vector<float> row = b >= 6 && b < 8 ? bf16_logits(rng, vocab) : llm_like_logits(rng, vocab);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  expect_matches_reference(logits, vocab, slots_for(rng, specs), draws_for(200), "llm-like 152064");
}

// Flat logits keep tens of thousands of tokens: the hardest case for the CDF's precision.
TEST(SamplingGpu, FlatDistributionsMatchTheReference) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(703);
  const int vocab = 128256;
  const std::vector<Spec> specs = {{1.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 0.9f, 0.0f}, {0.7f, 1000, 1.0f, 0.0f},
                                   {1.0f, 0, 1.0f, 0.3f}};
  std::vector<float> logits;
  for (size_t b = 0; b < specs.size(); ++b) {
    const std::vector<float> row = flat_logits(rng, vocab);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  expect_matches_reference(logits, vocab, slots_for(rng, specs), draws_for(200), "flat 128256");
}

// Odd and tiny vocabularies (fewer tokens than the blocks have threads).
TEST(SamplingGpu, OddAndSmallVocabularies) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(704);
  const std::vector<Spec> specs = {{0.8f, 0, 0.9f, 0.0f}, {1.0f, 3, 1.0f, 0.0f}, {0.6f, 20, 0.8f, 0.05f}};
  for (int vocab : {7, 320, 50257}) {
    std::vector<float> logits;
    for (size_t b = 0; b < specs.size(); ++b) {
      const std::vector<float> row = llm_like_logits(rng, vocab, std::max(1, vocab / 50));
      logits.insert(logits.end(), row.begin(), row.end());
    }
    expect_matches_reference(logits, vocab, slots_for(rng, specs), draws_for(100), "vocab " + std::to_string(vocab));
  }
}

// Equal logits: top-p's boundary falls inside one group of ties, which the reference's stable
// sort orders by id, so exactly the highest ids stay; top-k keeps every tie.
TEST(SamplingGpu, TiesAtTheTopPAndTopKBoundaries) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(705);
  const int vocab = 1000;
  std::vector<float> logits(static_cast<size_t>(vocab) * 3, 1.5f);
  for (int i = 0; i < 100; ++i) logits[2 * vocab + i] = 2.5f;  // row 2: 100 high ties, then 900 low ones
  // Row 0: keep 501 of 1000 equal tokens (ids 499..999); row 1: top_k 5 keeps all 1000 ties;
  // row 2: the top 100 ties hold ~23% of the mass, so top_p 0.3 cuts into the low group.
  const std::vector<Spec> specs = {{1.0f, 0, 0.5005f, 0.0f}, {1.0f, 5, 1.0f, 0.0f}, {1.0f, 0, 0.3f, 0.0f}};
  const std::vector<SamplingSlot> slots = slots_for(rng, specs);
  const auto probs0 = reference::sampling_distribution(std::span<const float>(logits.data(), vocab),
                                                       reference_params(slots[0]), {});
  ASSERT_EQ(std::count_if(probs0.begin(), probs0.end(), [](double p) { return p > 0; }), 501);
  ASSERT_GT(probs0[499], 0.0);
  expect_matches_reference(logits, vocab, slots, draws_for(300), "ties");
}

// Token bitmasks (constrained decoding): fresh random masks per row, from a few allowed ids to
// most of them, one that leaves out the row's most likely tokens, one that allows a single id, one
// of all ones; greedy rows must give the reference's id exactly, sampled rows its draws. The
// vocabularies take the register, L1 and scalar paths (152064 in registers at clusters of 16,
// 50257 not a multiple of 4).
std::vector<uint32_t> random_mask(std::mt19937_64& rng, int vocab, double keep) {
  std::vector<uint32_t> mask(token_bitmask_words(vocab), 0u);
  std::bernoulli_distribution kept(keep);
  for (int id = 0; id < vocab; ++id)
    if (kept(rng)) mask[id / 32] |= 1u << (id % 32);
  if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; })) mask[0] |= 1u;
  return mask;
}

TEST(SamplingGpu, TokenBitmaskLeavesOutMaskedTokens) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(708);
  for (int vocab : {152064, 50257, 1000}) {
    const std::vector<Spec> specs = {{0.0f, 0, 1.0f, 0.0f}, {0.0f, 0, 1.0f, 0.0f}, {0.9f, 0, 1.0f, 0.0f},
                                     {0.8f, 40, 0.9f, 0.0f}, {1.0f, 0, 0.95f, 0.02f}, {0.7f, 5, 1.0f, 0.0f},
                                     {1.0f, 0, 1.0f, 0.0f}};
    std::vector<float> logits;
    std::vector<uint32_t> masks;
    const size_t words = token_bitmask_words(vocab);
    for (size_t b = 0; b < specs.size(); ++b) {
      std::vector<float> row = llm_like_logits(rng, vocab);
      std::vector<uint32_t> mask;
      switch (b) {
        case 0: {  // greedy, the argmax and its runners-up left out
          mask.assign(words, ~0u);
          std::vector<int> order(vocab);
          for (int i = 0; i < vocab; ++i) order[i] = i;
          std::partial_sort(order.begin(), order.begin() + 10, order.end(), [&](int a, int c) { return row[a] > row[c]; });
          for (int i = 0; i < 10; ++i) mask[order[i] / 32] &= ~(1u << (order[i] % 32));
          break;
        }
        case 1: mask = random_mask(rng, vocab, 0.5); break;  // greedy
        case 2: {  // a single id allowed: every draw is that id
          mask.assign(words, 0u);
          const int only = std::uniform_int_distribution<int>(0, vocab - 1)(rng);
          mask[only / 32] |= 1u << (only % 32);
          break;
        }
        case 3: mask = random_mask(rng, vocab, 0.001); break;  // fewer allowed ids than top_k
        case 4: mask = random_mask(rng, vocab, 0.3); break;
        case 5: mask = random_mask(rng, vocab, 0.9); break;
        default: mask.assign(words, ~0u); break;  // a free row in a masked batch
      }
      logits.insert(logits.end(), row.begin(), row.end());
      masks.insert(masks.end(), mask.begin(), mask.end());
    }
    const std::vector<SamplingSlot> slots = slots_for(rng, specs);
    for (size_t b = 0; b < specs.size(); ++b) {  // the reference itself never picks a left-out id
      const std::vector<float> row = reference_row(logits, vocab, static_cast<int>(b), masks);
      const int32_t id = reference::sample(row, reference_params(slots[b]), {}, slots[b].step);
      ASSERT_TRUE(token_allowed(masks.data() + b * words, id)) << "vocab " << vocab << " row " << b;
    }
    expect_matches_reference(logits, vocab, slots, draws_for(100), "masked vocab " + std::to_string(vocab), masks);
  }
}

// Captured once, replayed: each replay draws the next step, and slot changes made between
// replays (in device memory) take effect.
// A decode step's rows fed a negative id sat it out: they keep their draw index, the others draw
// at theirs and advance, whether the fed ids are a buffer of their own or the ids the sampler
// overwrites (as the engine passes decode_ids); every row's id is written either way.
TEST(SamplingGpu, RowsThatSatOutKeepTheirDrawIndex) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(707);
  const int vocab = 5003, batch = 4;
  std::vector<float> logits;
  for (int b = 0; b < batch; ++b) {
    const std::vector<float> row = llm_like_logits(rng, vocab);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const std::vector<SamplingSlot> slots =
      slots_for(rng, {{0.9f, 0, 1.0f, 0.0f}, {0.9f, 0, 1.0f, 0.0f}, {0.0f, 0, 1.0f, 0.0f}, {1.2f, 50, 0.9f, 0.0f}});
  const std::vector<int32_t> fed = {17, -1, 3, -1};
  for (bool aliased : {false, true}) {
    SCOPED_TRACE(aliased ? "fed ids are the ids" : "fed ids of their own");
    DeviceBuffer logits_dev = DeviceBuffer::from_host(logits);
    DeviceBuffer slots_dev = DeviceBuffer::from_host(slots);
    DeviceBuffer fed_dev = DeviceBuffer::from_host(fed);
    DeviceBuffer ids_dev = DeviceBuffer::from_host(aliased ? fed : std::vector<int32_t>(batch, kPoisonId));
    DeviceBuffer workspace(std::max<size_t>(kernels::sampling_workspace_bytes(batch, vocab), 1));
    kernels::SamplingParams params;
    params.logits = logits_dev.as<float>();
    params.slots = slots_dev.as<SamplingSlot>();
    params.ids = ids_dev.as<int32_t>();
    params.fed_ids = aliased ? ids_dev.as<int32_t>() : fed_dev.as<int32_t>();
    params.workspace = workspace.data();
    params.batch = batch;
    params.vocab = vocab;
    DF_CHECK_CUDA(kernels::launch_sampling(params, nullptr));
    DF_CHECK_CUDA(cudaDeviceSynchronize());
    const auto ids = ids_dev.to_host<int32_t>(batch);
    const auto after = slots_dev.to_host<SamplingSlot>(batch);
    for (int b = 0; b < batch; ++b) {
      EXPECT_TRUE(ids[b] >= 0 && ids[b] < vocab) << "row " << b << ": id " << ids[b];
      EXPECT_EQ(after[b].step, slots[b].step + (fed[b] >= 0 ? 1 : 0)) << "row " << b;
      const std::span<const float> row(logits.data() + static_cast<size_t>(b) * vocab, vocab);
      if (fed[b] >= 0 && slots[b].temperature > 0.0f)  // drew at its own index
        EXPECT_GT(reference::sampling_distribution(row, reference_params(slots[b]), {})[ids[b]], 0.0) << "row " << b;
    }
  }
}

TEST(SamplingGpu, GraphReplayDrawsTheNextSteps) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(706);
  const int vocab = 32000, batch = 2, replays = draws_for(100);
  std::vector<float> logits = llm_like_logits(rng, vocab);
  const std::vector<float> second = llm_like_logits(rng, vocab);
  logits.insert(logits.end(), second.begin(), second.end());
  std::vector<SamplingSlot> slots = slots_for(rng, {{0.8f, 40, 0.9f, 0.0f}, {1.1f, 0, 0.95f, 0.05f}});
  std::vector<std::vector<double>> probs;
  for (int b = 0; b < batch; ++b)
    probs.push_back(reference::sampling_distribution(
        std::span<const float>(logits.data() + static_cast<size_t>(b) * vocab, vocab), reference_params(slots[b]), {}));

  DeviceBuffer logits_dev = DeviceBuffer::from_host(logits);
  DeviceBuffer slots_dev = DeviceBuffer::from_host(slots);
  DeviceBuffer ids_dev = DeviceBuffer::from_host(std::vector<int32_t>(batch, kPoisonId));
  // The ids also go straight to mapped pinned host memory, as the engine's decode step takes them.
  const runtime::PinnedBuffer host_buffer(batch * sizeof(int32_t), runtime::PinnedBuffer::Access::mapped);
  int32_t* host_ids = host_buffer.as<int32_t>();
  kernels::SamplingParams params;
  params.logits = logits_dev.as<float>();
  params.slots = slots_dev.as<SamplingSlot>();
  params.ids = ids_dev.as<int32_t>();
  params.host_ids = host_buffer.device_as<int32_t>();
  params.batch = batch;
  params.vocab = vocab;
  cudaStream_t stream;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  DF_CHECK_CUDA(kernels::launch_sampling(params, stream));
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  DF_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<int> matches(batch, 0);
  for (int r = 0; r < replays; ++r) {
    DF_CHECK_CUDA(cudaMemsetAsync(ids_dev.data(), 0xff, batch * sizeof(int32_t), stream));  // -1: poisoned
    std::fill(host_ids, host_ids + batch, kPoisonId);
    DF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto ids = ids_dev.to_host<int32_t>(batch);
    for (int b = 0; b < batch; ++b) {
      ASSERT_EQ(host_ids[b], ids[b]) << "replay " << r << " row " << b << ": the host copy";
      ASSERT_TRUE(ids[b] >= 0 && ids[b] < vocab) << "replay " << r << " row " << b << ": id " << ids[b];
      EXPECT_GT(probs[b][ids[b]], 0.0) << "replay " << r << " row " << b;
      matches[b] += ids[b] == draw_from(probs[b], reference::sampling_uniform(slots[b].seed, slots[b].step + r));
    }
  }
  for (int b = 0; b < batch; ++b)
    EXPECT_GE(matches[b], (replays * 99 + 99) / 100) << "row " << b << ": of " << replays << " replays";

  // Row 1 turns greedy in device memory; the same graph now returns its argmax.
  SamplingSlot greedy = slots[1];
  greedy.temperature = 0.0f;
  greedy.step = slots[1].step + replays;
  DF_CHECK_CUDA(cudaMemcpyAsync(params.slots + 1, &greedy, sizeof greedy, cudaMemcpyHostToDevice, stream));
  DF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
  DF_CHECK_CUDA(cudaStreamSynchronize(stream));
  const auto ids = ids_dev.to_host<int32_t>(batch);
  const auto row1 = std::span<const float>(logits.data() + vocab, vocab);
  EXPECT_EQ(ids[1], static_cast<int32_t>(std::max_element(row1.begin(), row1.end()) - row1.begin()));
  const auto final_slots = slots_dev.to_host<SamplingSlot>(batch);
  EXPECT_EQ(final_slots[0].step, slots[0].step + replays + 1);
  EXPECT_EQ(final_slots[1].step, slots[1].step + replays + 1);

  EXPECT_EQ(host_ids[1], ids[1]);

  DF_CHECK_CUDA(cudaGraphExecDestroy(exec));
  DF_CHECK_CUDA(cudaGraphDestroy(graph));
  DF_CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace deepfuse
