// The reference backend against logits Hugging Face transformers computed for the same
// checkpoints (tests/fixtures/hf, made by scripts/fixtures/make_hf_fixtures.py): full forward and
// teacher-forced incremental decode, fp32 relative error per position below 1e-4.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deepfuse/model_config.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

const std::filesystem::path kFixtures = DEEPFUSE_FIXTURES_DIR "/hf";

// ||ours - theirs|| / ||theirs|| for one position's logits.
double row_error(std::span<const float> ours, const nlohmann::json& theirs) {
  std::vector<double> expected = theirs.get<std::vector<double>>();
  return testing::relative_error(std::vector<float>(ours.begin(), ours.end()), expected);
}

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, ReferenceBackendMatchesTransformers) {
  const auto dir = kFixtures / GetParam();
  const ModelConfig config = load_model_config(dir);
  const Checkpoint checkpoint(dir);
  const reference::Decoder decoder(config, load_reference_weights(checkpoint, config));
  const auto fixture = nlohmann::json::parse(read_text_file(dir / "logits.json"));
  const size_t vocab = config.vocab_size;
  ASSERT_FALSE(fixture["prompts"].empty());
  for (const auto& prompt : fixture["prompts"]) {
    const auto ids = prompt["input_ids"].get<std::vector<int32_t>>();
    auto cache = decoder.new_cache();
    const std::vector<float> full = decoder.forward(ids, cache);
    for (size_t t = 0; t < ids.size(); ++t)
      EXPECT_LT(row_error(std::span(full).subspan(t * vocab, vocab), prompt["full_logits"][t]), 1e-4)
          << "full forward, position " << t;

    const size_t prefill = prompt["prefill_length"].get<size_t>();
    cache = decoder.new_cache();
    std::vector<float> incremental = decoder.forward(std::span(ids).first(prefill), cache);
    for (size_t t = prefill; t < ids.size(); ++t) {
      const auto step = decoder.forward(std::span(ids).subspan(t, 1), cache);
      incremental.insert(incremental.end(), step.begin(), step.end());
    }
    for (size_t t = 0; t < ids.size(); ++t)
      EXPECT_LT(row_error(std::span(incremental).subspan(t * vocab, vocab), prompt["incremental_logits"][t]), 1e-4)
          << "incremental decode, position " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity,
                         ::testing::Values("llama3_gqa_headdim", "qwen2_bias_tied", "mistral_sliding_window"));

}  // namespace
}  // namespace deepfuse
