// Structured output on the CUDA engine: sequences constrained by a JSON schema's grammar (xgrammar,
// src/server/grammar) run next to free ones on tiny random models, with CUDA graphs on and off,
// mixed steps on and off, steps launched ahead and not, a cache that preempts. A step that samples
// a constrained row is launched without its sampler; once the step before is read back and its
// tokens fed to the grammars (which throw on an id the mask left out), the engine fills the masks
// and launches the sampler, which applies them. Checked per sequence:
// - constrained: it ends on the stop id, its text parses and validates against the schema, and
//   greedy ones follow the CPU reference decoder's masked greedy decode (the first divergence a
//   near tie of the reference among allowed ids; after it the texts differ and are not compared);
//   a sampled one is valid; logprobs are of the masked logits (no left-out alternative);
// - free: the reference's greedy decode, so the all-ones rows of a masked step leave them alone.
// The step buffers (token masks included) are NaN-poisoned first, so a masked step that samples a
// row it did not upload reads garbage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/engine.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"
#include "deepfuse/token_bitmask.hpp"
#include "deepfuse/tokenizer.hpp"
#include "logits_check.hpp"
#include "model/model_test_util.hpp"
#include "runtime/engine_bench.hpp"
#include "runtime/engine_test_util.hpp"
#include "server/grammar/structured_output.hpp"
#include "test_util.hpp"

namespace deepfuse::server {
namespace {

using nlohmann::json;

constexpr int kTokenizerVocab = 300;  // the model's vocabulary is larger: ids past it are never allowed

// Bounded values only, so every answer completes within max_new_tokens.
const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "color": {"type": "string", "enum": ["red", "green", "blue"]},
    "size": {"type": "integer", "minimum": 1, "maximum": 99},
    "ok": {"type": "boolean"},
    "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "enum": ["a", "bc"]}}
  },
  "required": ["color", "size", "ok", "tags"],
  "additionalProperties": false
})");

// Empty when `text` validates against kSchema, else what is wrong.
std::string schema_error(const std::string& text) {
  const json value = json::parse(text, nullptr, false);
  if (value.is_discarded() || !value.is_object()) return "not a JSON object";
  if (value.size() != 4) return "not exactly the four properties";
  const json colors = kSchema["properties"]["color"]["enum"];
  if (!value.contains("color") || std::find(colors.begin(), colors.end(), value["color"]) == colors.end())
    return "color outside its enum";
  if (!value.contains("size") || !value["size"].is_number_integer() || value["size"] < 1 || value["size"] > 99)
    return "size not an integer in 1..99";
  if (!value.contains("ok") || !value["ok"].is_boolean()) return "ok not a boolean";
  if (!value.contains("tags") || !value["tags"].is_array() || value["tags"].size() > 2) return "tags not an array of <= 2";
  for (const json& tag : value["tags"])
    if (tag != "a" && tag != "bc") return "a tag outside its enum";
  return {};
}

struct Request {
  int arrival = 0;  // added before this step() call
  std::vector<int32_t> prompt;
  int new_tokens = 0;
  bool constrained = false;
  float temperature = 0.0f;
  int top_logprobs = -1;
};

struct Variant {
  bool graphs, mixed, overlap;
  int kv_pages = 0;  // > 0: a cache this small, so running sequences are preempted and recompute
  std::string name() const {
    return std::string(graphs ? "graphs" : "eager") + (mixed ? ", mixed" : ", separate") +
           (overlap ? ", overlapped" : ", one step per call") +
           (kv_pages > 0 ? ", " + std::to_string(kv_pages) + " KV pages" : "");
  }
};

class StructuredOutputGpu : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    rng_ = testing::make_rng(900 + GetParam());
    const ModelConfig made = testing::tiny_models()[GetParam()].config;
    MakeModelOptions options;
    options.seed = rng_();
    write_random_checkpoint(made, scratch_.path() / "model", options);
    config_ = load_model_config(scratch_.path() / "model");
    reference_ = std::make_unique<reference::Decoder>(
        config_, load_reference_weights(Checkpoint(scratch_.path() / "model"), config_));
    write_tiny_tokenizer(scratch_.path() / "tokenizer", kTokenizerVocab);
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_directory(scratch_.path() / "tokenizer"));
    stop_ = tiny_tokenizer_ids(kTokenizerVocab).eot;
    structured_ = std::make_unique<StructuredOutput>(*tokenizer_, config_.vocab_size, std::vector<int32_t>{stop_},
                                                     std::vector<int32_t>{});
    grammar_ = structured_->json_schema(kSchema, "response_format.json_schema.schema");
  }

  EngineOptions options(const Variant& v) const {
    EngineOptions o;
    o.max_batch = 4;
    o.max_context = 192;
    const size_t page_bytes = size_t{2} * config_.num_hidden_layers * config_.kv_size() * 16 * sizeof(uint16_t);
    o.kv_cache_bytes = v.kv_pages > 0 ? v.kv_pages * page_bytes : size_t{16} << 20;
    o.cuda_graphs = v.graphs;
    o.mixed_steps = v.mixed;
    o.overlap_steps = v.overlap;
    o.prefill_tokens_per_step = 16;
    return o;
  }

  // Every request's tokens, through a fresh poisoned engine (each added before its arrival step).
  std::vector<std::vector<StepToken>> run(const Variant& variant, const std::vector<Request>& requests) const {
    Engine engine = Engine::from_checkpoint(scratch_.path() / "model", options(variant));
    runtime::EngineBench::poison_buffers(engine);
    std::vector<std::vector<StepToken>> tokens(requests.size());
    std::map<SequenceId, size_t> index;
    size_t added = 0;
    for (int step = 0; step < 4000; ++step) {
      for (; added < requests.size() && requests[added].arrival <= step; ++added) {
        const Request& r = requests[added];
        SequenceRequest request;
        request.prompt = r.prompt;
        request.max_new_tokens = r.new_tokens;
        request.sampling.temperature = r.temperature;
        request.sampling.seed = 1000 + added;
        request.top_logprobs = r.top_logprobs;
        if (r.constrained) {  // free ones run to their length: a random model may pick the stop id
          request.stop_ids = {stop_};
          request.constraint = grammar_->start();
        }
        index[engine.add_sequence(request)] = added;
      }
      if (added == requests.size() && engine.running_sequences() == 0) break;
      for (const StepToken& token : engine.step()) tokens[index.at(token.sequence)].push_back(token);
    }
    EXPECT_EQ(engine.running_sequences(), 0);
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total) << "pages leaked";
    std::printf("%s: %llu preemptions\n", variant.name().c_str(),
                static_cast<unsigned long long>(engine.scheduling_stats().preemptions));
    return tokens;
  }

  // The ids before the stop id, checked to parse and validate; a fresh matcher replays them and
  // checks each (and each reported alternative with a finite logprob) against its mask.
  void check_constrained(const std::vector<StepToken>& tokens, const std::string& what) const {
    ASSERT_FALSE(tokens.empty()) << what;
    EXPECT_EQ(tokens.back().finish, FinishReason::stop_token) << what << ": the grammar did not complete";
    EXPECT_EQ(tokens.back().id, stop_) << what;
    const auto matcher = grammar_->start();
    std::vector<uint32_t> mask(token_bitmask_words(config_.vocab_size));
    std::vector<int32_t> text;
    for (const StepToken& token : tokens) {
      matcher->fill_next_mask(mask);
      ASSERT_TRUE(token_allowed(mask.data(), token.id)) << what << ": id " << token.id << " after "
                                                        << tokenizer_->decode(text);
      for (const TokenLogprob& alternative : token.top_logprobs)
        if (std::isfinite(alternative.logprob))
          EXPECT_TRUE(token_allowed(mask.data(), alternative.id)) << what << ": alternative " << alternative.id;
      matcher->accept(token.id);
      if (token.id != stop_) text.push_back(token.id);
    }
    const std::string decoded = tokenizer_->decode(text);
    EXPECT_EQ(schema_error(decoded), "") << what << ": " << decoded;
  }

  // How many of `ours` follow the reference decoder's greedy decode under the grammar's masks; the
  // first divergence must be a near tie of the reference between two allowed ids.
  int reference_masked_greedy_matches(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ours,
                                      const std::string& what) const {
    const size_t vocab = config_.vocab_size;
    const auto matcher = grammar_->start();
    std::vector<uint32_t> mask(token_bitmask_words(config_.vocab_size));
    reference::KvCache cache = reference_->new_cache();
    std::vector<float> logits = reference_->forward(prompt, cache);
    for (size_t t = 0; t < ours.size(); ++t) {
      const std::span<const float> row(logits.data() + logits.size() - vocab, vocab);
      matcher->fill_next_mask(mask);
      size_t best = vocab;
      for (size_t id = 0; id < vocab; ++id)
        if (token_allowed(mask.data(), static_cast<int>(id)) && (best == vocab || row[id] > row[best])) best = id;
      if (static_cast<size_t>(ours[t]) != best) {
        EXPECT_TRUE(token_allowed(mask.data(), ours[t]) && testing::near_tie(row, ours[t], best))
            << what << " token " << t << ": engine " << ours[t] << ", reference " << best;
        return static_cast<int>(t);
      }
      matcher->accept(ours[t]);
      logits = reference_->forward(std::span(ours).subspan(t, 1), cache);
    }
    return static_cast<int>(ours.size());
  }

  testing::ScratchDir scratch_;
  std::mt19937_64 rng_;
  ModelConfig config_;
  std::unique_ptr<reference::Decoder> reference_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int32_t stop_ = 0;
  std::unique_ptr<StructuredOutput> structured_;
  std::shared_ptr<const OutputGrammar> grammar_;
};

std::vector<int32_t> ids_of(const std::vector<StepToken>& tokens) {
  std::vector<int32_t> ids;
  for (const StepToken& token : tokens) ids.push_back(token.id);
  return ids;
}

TEST_P(StructuredOutputGpu, ConstrainedRowsFollowTheGrammarBesideFreeOnes) {
  DF_REQUIRE_GPU();
  const int vocab = config_.vocab_size;
  // Six requests through four rows (two wait); prompts of 33 and 40 tokens take several steps of
  // the 16-token budget while the others decode.
  const std::vector<Request> requests = {
      {0, testing::random_ids(rng_, 9, vocab), 120, true},
      {0, testing::random_ids(rng_, 20, vocab), 16, false},
      {1, testing::random_ids(rng_, 33, vocab), 120, true, 0.0f, 3},
      {2, testing::random_ids(rng_, 5, vocab), 120, true, 0.8f},
      {3, testing::random_ids(rng_, 12, vocab), 12, false},
      {5, testing::random_ids(rng_, 40, vocab), 120, true},
  };
  // The last: 12 pages for four rows whose sequences need up to 10 each (the longest prompt and
  // max_new_tokens), and about 17 together as the answers run: preempted constrained sequences
  // recompute and carry on under the grammar state they had.
  const Variant variants[] = {{true, true, true},   {false, true, true},      {true, false, true},
                              {false, false, false}, {true, true, true, 12}};
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name());
    const std::vector<std::vector<StepToken>> tokens = run(variant, requests);
    int followed = 0, compared = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      const std::string what = variant.name() + ", request " + std::to_string(r);
      const std::vector<int32_t> ours = ids_of(tokens[r]);
      if (!requests[r].constrained) {
        ASSERT_EQ(ours.size(), static_cast<size_t>(requests[r].new_tokens)) << what;
        testing::reference_greedy_matches(*reference_, requests[r].prompt, ours, vocab, what);
        continue;
      }
      check_constrained(tokens[r], what);
      if (requests[r].temperature > 0.0f) continue;
      ++compared;
      followed += reference_masked_greedy_matches(requests[r].prompt, ours, what) == static_cast<int>(ours.size());
    }
    std::printf("[ %s ] %s: %d of %d greedy constrained answers equal to the reference's throughout\n",
                testing::tiny_models()[GetParam()].name.c_str(), variant.name().c_str(), followed, compared);
  }
}

// llama_gqa (vocabulary 512, whole mask words) and qwen2_bias_tied (997: a partial last word).
INSTANTIATE_TEST_SUITE_P(TinyModels, StructuredOutputGpu, ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return testing::tiny_models()[info.param].name;
                         });

}  // namespace
}  // namespace deepfuse::server
