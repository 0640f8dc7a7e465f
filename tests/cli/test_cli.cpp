// The `deepfuse` binary end to end: make-model -> inspect / generate / score work, with token ids
// and with text and chat prompts through the tokenizer make-model writes, and every bad input
// exits with code 2, one line on stderr naming the file and field or tensor, and nothing on stdout
// (no partial output).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.hpp"
#include "deepfuse/chat_template.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/tokenizer.hpp"

namespace deepfuse {
namespace {

using testing::expect_bad_input;
using testing::generated_ids;
using testing::generated_output;
using testing::RunResult;
using testing::run_cli;
using testing::ScratchDir;
using testing::stats_line;
using testing::write_file;

class Cli : public ::testing::Test {
 protected:
  // A tiny valid checkpoint in model/, which cases then break one way each.
  void SetUp() override {
    model_ = scratch_.path() / "model";
    const RunResult made = run_cli(scratch_, "make-model --out " + model_.string() + " --layers 1 --seed 3");
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  RunResult inspect() { return run_cli(scratch_, "inspect --model " + model_.string()); }
  void replace_weights(const std::string& image) { write_file(model_ / "model.safetensors", image); }
  // Without a tokenizer, generate prints ids and text prompts are refused.
  void remove_tokenizer() {
    std::filesystem::remove(model_ / "tokenizer.json");
    std::filesystem::remove(model_ / "tokenizer_config.json");
  }
  void replace_config_field(const std::string& from, const std::string& to) {
    std::string text = read_text_file(model_ / "config.json");
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    write_file(model_ / "config.json", text.replace(at, from.size(), to));
  }

  ScratchDir scratch_;
  std::filesystem::path model_;
};

TEST_F(Cli, GoodCheckpointInspectsGeneratesAndScores) {
  const RunResult info = inspect();
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("LlamaForCausalLM"), std::string::npos);
  const RunResult generated = run_cli(scratch_, "generate --backend reference --model " + model_.string() +
                                                    " --prompt-ids 1,7,9 --max-tokens 4 --ignore-eos");
  EXPECT_EQ(generated.exit_code, 0) << generated.err;
  EXPECT_NE(generated.out.find("prompt tokens: 3, generated tokens: 4, time to first token:"), std::string::npos)
      << generated.out;
  const auto json = scratch_.path() / "scores.json";
  const RunResult scored =
      run_cli(scratch_, "score --backend reference --model " + model_.string() + " --prompt-ids 1,7,9 --json " + json.string());
  EXPECT_EQ(scored.exit_code, 0) << scored.err;
  const auto parsed = nlohmann::json::parse(read_text_file(json));
  EXPECT_EQ(parsed["input_ids"], nlohmann::json::parse("[1,7,9]"));
  EXPECT_EQ(parsed["logits"].size(), 3u);
  EXPECT_EQ(parsed["logits"][0].size(), 320u);
}

TEST_F(Cli, GreedyGenerationPicksTheArgmaxOfTheTeacherForcedLogits) {
  remove_tokenizer();
  const RunResult generated =
      run_cli(scratch_, "generate --backend reference --model " + model_.string() + " --prompt-ids 3,1,4,1,5 --max-tokens 6 --ignore-eos");
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const std::vector<int> ids = generated_ids(generated);
  ASSERT_EQ(ids.size(), 6u);
  std::string all = "3,1,4,1,5";
  for (int id : ids) all += "," + std::to_string(id);
  const auto json = scratch_.path() / "scores.json";
  ASSERT_EQ(run_cli(scratch_, "score --backend reference --model " + model_.string() + " --prompt-ids " + all + " --json " + json.string())
                .exit_code, 0);
  const auto logits = nlohmann::json::parse(read_text_file(json))["logits"];
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto row = logits[4 + i].get<std::vector<float>>();  // the position before token i
    EXPECT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), ids[i]) << "generated token " << i;
  }
}

TEST_F(Cli, SamplingFollowsTheSeedAndGenerationConfig) {
  remove_tokenizer();
  write_file(model_ / "generation_config.json", R"({"do_sample": true, "temperature": 1.5, "top_k": 0})");
  auto sample = [&](const std::string& extra) {
    const RunResult r = run_cli(scratch_, "generate --backend reference --model " + model_.string() +
                                              " --prompt-ids 1 --max-tokens 12 --ignore-eos " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return generated_ids(r);
  };
  const auto first = sample("--seed 11");
  EXPECT_EQ(sample("--seed 11"), first);
  EXPECT_NE(sample("--seed 12"), first);  // 12 near-uniform draws from 320 ids: a clash is ~impossible
  const auto greedy = sample("--temperature 0");  // the flag overrides generation_config.json
  EXPECT_EQ(sample("--temperature 0 --seed 99"), greedy);
}

TEST_F(Cli, SpeculativeGenerationPrintsTheSameTokens) {
  remove_tokenizer();
  const std::string base = "generate --backend reference --model " + model_.string() +
                           " --prompt-ids 3,1,4,1,5,9,2,6,3,1,4,1,5 --max-tokens 40 --ignore-eos";
  for (const std::string sampling : {"", " --temperature 0.8 --seed 5"}) {
    const RunResult plain = run_cli(scratch_, base + sampling);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_EQ(plain.out.find("speculative"), std::string::npos);
    for (const std::string drafter : {"ngram", "suffix"}) {
      const RunResult spec = run_cli(scratch_, base + sampling + " --speculative " + drafter);
      ASSERT_EQ(spec.exit_code, 0) << spec.err;
      EXPECT_EQ(generated_ids(spec), generated_ids(plain)) << drafter << sampling;
      EXPECT_NE(stats_line(spec).find("\nspeculative " + drafter + ": "), std::string::npos) << spec.out;
    }
  }
  expect_bad_input(run_cli(scratch_, base + " --speculative eagle"),
                   {"--speculative 'eagle'", "unknown drafter", "off, ngram or suffix"});
}

TEST_F(Cli, BrokenSafetensorsFiles) {
  const std::string file = (model_ / "model.safetensors").string();
  const std::string good = read_text_file(model_ / "model.safetensors");
  replace_weights(good.substr(0, 5));
  expect_bad_input(inspect(), {file, "truncated"});
  replace_weights(good.substr(0, good.size() - 10));
  expect_bad_input(inspect(), {file, "past the end"});
  replace_weights(testing::safetensors_image("{}", 0, 4096));
  expect_bad_input(inspect(), {file, "header length 4096"});
  replace_weights(testing::safetensors_image("{\"a\": nope}", 0));
  expect_bad_input(inspect(), {file, "JSON"});
  replace_weights(testing::safetensors_image(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}})", 1));
  expect_bad_input(inspect(), {file, "tensor 'w'", "unknown dtype 'Q4'"});
  replace_weights(testing::safetensors_image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}})", 7));
  expect_bad_input(inspect(), {file, "tensor 'b'", "overlaps"});
  replace_weights(testing::safetensors_image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                             R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})", 3));
  expect_bad_input(inspect(), {file, "gap", "tensor 'b'"});
  replace_weights(testing::safetensors_image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                             R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2));
  expect_bad_input(inspect(), {file, "duplicate key 'a'"});
}

TEST_F(Cli, MissingAndMisShapedTensors) {
  const ModelConfig config = load_model_config(model_);
  auto tensors = testing::expected_as_pairs(config);
  const auto removed = tensors[4];
  tensors.erase(tensors.begin() + 4);
  testing::write_checkpoint_with(model_, config, tensors);
  expect_bad_input(inspect(), {"missing tensor '" + removed.first + "'"});
  tensors = testing::expected_as_pairs(config);
  tensors[0].second = {7, 64};
  testing::write_checkpoint_with(model_, config, tensors);
  expect_bad_input(inspect(), {"model.safetensors", "tensor 'model.embed_tokens.weight'", "shape [7, 64]"});
}

TEST_F(Cli, BrokenConfigs) {
  const std::string file = (model_ / "config.json").string();
  replace_config_field("LlamaForCausalLM", "FalconForCausalLM");
  expect_bad_input(inspect(), {file, "'architectures'", "FalconForCausalLM"});
  replace_config_field("FalconForCausalLM", "LlamaForCausalLM");
  replace_config_field("\"hidden_size\": 64", "\"hidden_size\": [64]");
  expect_bad_input(inspect(), {file, "'hidden_size'", "integer"});
  write_file(model_ / "config.json", "{ not json");
  expect_bad_input(inspect(), {file, "invalid JSON"});
  expect_bad_input(run_cli(scratch_, "inspect --model " + (scratch_.path() / "nowhere").string()),
                   {"config.json", "not found"});
}

TEST_F(Cli, PromptProblemsFailBeforeAnyWork) {
  // Weights that would fail to load: the prompt check must come first.
  replace_config_field("\"max_position_embeddings\": 512", "\"max_position_embeddings\": 4");
  replace_weights("garbage");
  const std::string json = (scratch_.path() / "never.json").string();
  const std::string model = " --backend reference --model " + model_.string();
  expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt-ids 1,2,3,4,5"),
                   {"--prompt-ids", "5 tokens", "max_position_embeddings (4)", "config.json"});
  expect_bad_input(run_cli(scratch_, "score" + model + " --prompt-ids 1,2,3,4,5 --json " + json),
                   {"max_position_embeddings (4)"});
  EXPECT_FALSE(std::filesystem::exists(json)) << "no partial output";
  expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt-ids 1,999"), {"token id 999", "[0, 320)"});
  expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt hello --prompt-ids 1"), {"exactly one prompt"});
  expect_bad_input(run_cli(scratch_, "generate" + model), {"exactly one prompt"});
  // Text goes through the tokenizer before the weights are read.
  const std::string long_text = " --prompt 'The capital of France is Paris.'";
  expect_bad_input(run_cli(scratch_, "generate" + model + long_text), {"--prompt", "max_position_embeddings (4)"});
  // A prompt that fits reaches the weights, which are garbage here.
  expect_bad_input(run_cli(scratch_, "score" + model + " --prompt-ids 1,2 --json " + json), {"model.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(json)) << "no partial output";
}

TEST_F(Cli, BackendAndModelSourceProblems) {
  const std::string model = " --model " + model_.string();
  expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt-ids 1 --backend tpu"),
                   {"--backend 'tpu'", "unknown backend"});
  expect_bad_input(run_cli(scratch_, "score" + model + " --prompt-ids 1 --plan-override mlp=fastest"),
                   {"--plan-override 'mlp=fastest'", "fastest"});
  expect_bad_input(run_cli(scratch_, "score" + model + " --prompt-ids 1 --plan-override warp_drive=on"),
                   {"--plan-override 'warp_drive=on'", "warp_drive"});
  expect_bad_input(run_cli(scratch_, "score" + model + " --prompt-ids 1 --tuning-cache " + scratch_.path().string()),
                   {"--tuning-cache", scratch_.path().string()});
  expect_bad_input(run_cli(scratch_, "tune --random-weights --arch llama3-8b --tuning-cache /proc/deepfuse/t.json"),
                   {"--tuning-cache", "/proc/deepfuse/t.json"});
  if (!cuda_device_available())
    expect_bad_input(run_cli(scratch_, "inspect --plan" + model), {"inspect --plan", "no CUDA device"});
  expect_bad_input(run_cli(scratch_, "generate --prompt-ids 1"), {"--model DIR", "--random-weights --arch NAME"});
  expect_bad_input(run_cli(scratch_, "generate" + model + " --random-weights --arch llama3-8b --prompt-ids 1"),
                   {"--model and --random-weights"});
  expect_bad_input(run_cli(scratch_, "generate --arch llama3-8b --prompt-ids 1"), {"--arch needs --random-weights"});
  expect_bad_input(run_cli(scratch_, "generate --random-weights --prompt-ids 1"),
                   {"--random-weights needs --arch", "llama3-8b"});
  expect_bad_input(run_cli(scratch_, "score --random-weights --arch gpt-5 --prompt-ids 1"),
                   {"--arch 'gpt-5'", "unknown", "llama3.2-1b"});
  expect_bad_input(run_cli(scratch_, "generate --random-weights --arch llama3-8b --backend reference --prompt-ids 1"),
                   {"--random-weights", "cuda backend only"});
  // auto runs this model (head_dim 16: no CUDA kernels) on the reference backend with or without a
  // GPU, where the engine flags do not apply; with a GPU it says so in a note.
  const RunResult fallback =
      run_cli(scratch_, "generate" + model + " --prompt-ids 1 --max-tokens 2 --ignore-eos --no-cuda-graphs");
  EXPECT_EQ(fallback.exit_code, 0) << fallback.err;
  EXPECT_EQ(stats_line(fallback).rfind("prompt tokens: 1, generated tokens: 2,", 0), 0u) << fallback.out;
  // Checked before any device work: a planned context below what the longest case needs (512
  // tokens, 4 warm-up and 32 timed steps and one to spare).
  expect_bad_input(run_cli(scratch_, "bench decode --archs llama3.2-1b --contexts 512 --no-ttft --max-context 500"),
                   {"--max-context 500", "549 tokens"});
  if (cuda_device_available()) {
    EXPECT_NE(fallback.err.find("head_dim 16"), std::string::npos) << fallback.err;
    return;  // the rest is about machines without a GPU
  }
  EXPECT_EQ(fallback.err, "");
  expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt-ids 1 --backend cuda"),
                   {"--backend cuda", "no CUDA device"});
  expect_bad_input(run_cli(scratch_, "generate --random-weights --arch llama3-8b --prompt-ids 1"),
                   {"--random-weights", "no CUDA device"});
  expect_bad_input(run_cli(scratch_, "bench decode --archs llama3.2-1b"), {"bench decode", "no CUDA device"});
}

// FP8 (issue 51): make-model --dtype fp8 writes a compressed-tensors checkpoint that inspect
// describes per linear and the reference backend runs; --quantize fp8 rounds a 16-bit checkpoint
// at load and --compare-unquantized reports what that costs; bad flags and bad scales exit 2.
TEST_F(Cli, Fp8CheckpointsAndQuantizeAtLoad) {
  const std::filesystem::path fp8 = scratch_.path() / "fp8";
  const RunResult made = run_cli(scratch_, "make-model --out " + fp8.string() + " --layers 1 --seed 3 --dtype fp8");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const RunResult info = run_cli(scratch_, "inspect --model " + fp8.string());
  ASSERT_EQ(info.exit_code, 0) << info.err;
  // inspect's line for one linear: "  <name> <format> x<layers> <bytes> bytes".
  auto linear_line = [](const std::string& out, const std::string& name) {
    const size_t at = out.find("  " + name + " ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_NE(info.out.find("quantization:  compressed-tensors (fp8_e4m3)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("F8_E4M3"), std::string::npos) << info.out;
  // tiny: q_proj [64, 64] in fp8 is 64 * 64 bytes plus 64 fp32 scales; lm_head [320, 64] stays bf16.
  const std::string q_proj = linear_line(info.out, "self_attn.q_proj.weight");
  EXPECT_NE(q_proj.find(" fp8_e4m3 "), std::string::npos) << info.out;
  EXPECT_NE(q_proj.find(" x1 "), std::string::npos) << q_proj;
  EXPECT_NE(q_proj.find(" " + std::to_string(64 * 64 + 64 * 4) + " bytes"), std::string::npos) << q_proj;
  const std::string lm_head = linear_line(info.out, "lm_head.weight");
  EXPECT_NE(lm_head.find(" bf16 "), std::string::npos) << info.out;
  EXPECT_NE(lm_head.find(" " + std::to_string(320 * 64 * 2) + " bytes"), std::string::npos) << lm_head;
  const RunResult generated = run_cli(scratch_, "generate --backend reference --model " + fp8.string() +
                                                    " --prompt-ids 1,7,9 --max-tokens 4 --ignore-eos");
  EXPECT_EQ(generated.exit_code, 0) << generated.err;
  EXPECT_NE(stats_line(generated).find("generated tokens: 4,"), std::string::npos) << generated.out;
  const RunResult scored = run_cli(scratch_, "score --backend reference --model " + fp8.string() + " --prompt-ids 1,7,9");
  EXPECT_EQ(scored.exit_code, 0) << scored.err;

  const std::string model = " --backend reference --model " + model_.string() + " --prompt-ids 1,7,9,4,30,2";
  const RunResult compared = run_cli(scratch_, "score" + model + " --quantize fp8 --compare-unquantized");
  ASSERT_EQ(compared.exit_code, 0) << compared.err;
  EXPECT_NE(compared.out.find("--quantize fp8 against the 16-bit weights: top-1 agreement "), std::string::npos)
      << compared.out;
  const RunResult quantized_info = run_cli(scratch_, "inspect --quantize fp8 --model " + model_.string());
  EXPECT_NE(linear_line(quantized_info.out, "self_attn.q_proj.weight").find(" fp8_e4m3 "), std::string::npos)
      << quantized_info.out;
  EXPECT_NE(linear_line(quantized_info.out, "lm_head.weight").find(" bf16 "), std::string::npos) << quantized_info.out;
  expect_bad_input(run_cli(scratch_, "score" + model + " --quantize int4"), {"--quantize 'int4'", "fp8"});
  expect_bad_input(run_cli(scratch_, "score" + model + " --quantize-lm-head"), {"--quantize-lm-head", "--quantize fp8"});
  expect_bad_input(run_cli(scratch_, "score" + model + " --compare-unquantized"), {"--compare-unquantized", "--quantize"});
  // --weights: the random weights' format of bench decode and tune.
  expect_bad_input(run_cli(scratch_, "bench decode --archs llama3-8b --weights bf16,fp9"), {"--weights 'fp9'", "bf16, fp8"});
  expect_bad_input(run_cli(scratch_, "tune --model " + model_.string() + " --weights fp8"),
                   {"--weights", "random weights' format"});
  expect_bad_input(run_cli(scratch_, "tune --random-weights --arch llama3-8b --weights fp8 --quantize fp8"),
                   {"--weights or --quantize"});
  expect_bad_input(run_cli(scratch_, "score --backend reference --model " + fp8.string() + " --prompt-ids 1 --quantize fp8"),
                   {"--quantize fp8", "already quantized", "compressed-tensors"});
  if (!cuda_device_available())
    expect_bad_input(run_cli(scratch_, "generate --random-weights --arch llama3-8b --prompt-ids 1 --quantize fp8"),
                     {"--random-weights", "no CUDA device"});
  // A NaN among the scales: one line naming the scale tensor.
  const std::filesystem::path file = fp8 / "model.safetensors";
  std::string image = read_text_file(file);
  const std::string scale = "model.layers.0.self_attn.k_proj.weight_scale";
  const size_t header_end = 8 + static_cast<size_t>(static_cast<unsigned char>(image[0]) | static_cast<unsigned char>(image[1]) << 8);
  const nlohmann::json header = nlohmann::json::parse(image.substr(8, header_end - 8));
  const size_t at = header_end + header[scale]["data_offsets"][0].get<size_t>();
  image[at] = '\xc0';
  image[at + 1] = '\x7f';  // bf16 0x7fc0: NaN
  write_file(file, image);
  expect_bad_input(run_cli(scratch_, "score --backend reference --model " + fp8.string() + " --prompt-ids 1"),
                   {"tensor '" + scale + "'", "non-finite"});
}

// --tp: more ranks than GPUs (this machine's count), out of range, or a model that cannot split.
TEST_F(Cli, TensorParallelProblems) {
  const std::string model = " --model " + model_.string();
  const int gpus = cuda_device_count();
  const int too_many = std::max(2, gpus + 1);
  if (too_many <= 8)
    expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt-ids 1 --tp " + std::to_string(too_many)),
                     {"--tp " + std::to_string(too_many), "this machine has " + std::to_string(gpus)});
  EXPECT_EQ(run_cli(scratch_, "generate" + model + " --prompt-ids 1 --tp 9").exit_code, 2);
  EXPECT_EQ(run_cli(scratch_, "generate" + model + " --prompt-ids 1 --tp 0").exit_code, 2);
  if (gpus < 2) return;
  // 32 query heads do not split 3 ways (on a machine with three or more GPUs), and the tiny model
  // runs on the reference backend, which has no --tp.
  if (gpus >= 3)
    expect_bad_input(run_cli(scratch_, "generate --random-weights --arch llama3-8b --prompt-ids 1 --tp 3"),
                     {"num_attention_heads 32", "3"});
  expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt-ids 1 --backend reference --tp 2"),
                   {"--tp 2", "cuda backend"});
}

// bench sampling: a table on any machine (the GPU kernel, or the CPU reference without one),
// and a one-line error naming an unknown mode or an impossible size before any work.
TEST_F(Cli, BenchSamplingRunsAndNamesBadArguments) {
  const RunResult ok = run_cli(scratch_, "bench sampling --vocabs 1000 --batches 2 --modes greedy,top-k+top-p --reps 3");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("top-k+top-p"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find(cuda_device_available() ? "us graph" : "reference"), std::string::npos) << ok.out;
  expect_bad_input(run_cli(scratch_, "bench sampling --modes nucleus"), {"unknown mode 'nucleus'", "top-p"});
  expect_bad_input(run_cli(scratch_, "bench sampling --vocabs 0 --modes greedy"), {"vocab 0"});
}

TEST_F(Cli, MakeModelWritesATokenizerTheConfigAgreesWith) {
  const Tokenizer tokenizer = Tokenizer::from_directory(model_);
  const ModelConfig config = load_model_config(model_);
  EXPECT_EQ(tokenizer.vocab_size(), static_cast<size_t>(config.vocab_size));
  EXPECT_EQ(tokenizer.bos_id(), config.bos_token_id);
  EXPECT_EQ(tokenizer.token_to_id("<|begin_of_text|>"), config.bos_token_id);
  EXPECT_EQ(tokenizer.eos_id(), tokenizer.token_to_id("<|eot_id|>"));
  for (const TokenId id : tokenizer.stop_ids())
    EXPECT_NE(std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id), config.eos_token_ids.end()) << id;
  EXPECT_FALSE(tokenizer.chat_template().empty());
}

TEST(CliMakeModel, VocabTooSmallForATokenizerStaysIdsOnly) {
  const ScratchDir scratch;
  const auto model = scratch.path() / "model";
  const RunResult made = run_cli(scratch, "make-model --out " + model.string() + " --layers 1 --vocab 100");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_NE(made.out.find("no tokenizer"), std::string::npos) << made.out;
  EXPECT_FALSE(std::filesystem::exists(model / "tokenizer.json"));
}

TEST_F(Cli, GenerateFromATextPrompt) {
  const std::string text = "The capital of France is";
  const RunResult generated =
      run_cli(scratch_, "generate --backend reference --model " + model_.string() + " --prompt '" + text + "' --max-tokens 8 --ignore-eos");
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const size_t prompt_tokens = Tokenizer::from_directory(model_).encode(text).size();
  EXPECT_EQ(stats_line(generated).rfind("prompt tokens: " + std::to_string(prompt_tokens) + ", generated tokens: 8,", 0),
            0u)
      << generated.out;
  EXPECT_FALSE(generated_output(generated).empty()) << "no text streamed";
  // score takes the same text and scores the same ids.
  const auto json = scratch_.path() / "scores.json";
  const RunResult scored =
      run_cli(scratch_, "score --backend reference --model " + model_.string() + " --prompt '" + text + "' --json " + json.string());
  ASSERT_EQ(scored.exit_code, 0) << scored.err;
  EXPECT_EQ(nlohmann::json::parse(read_text_file(json))["input_ids"].size(), prompt_tokens);
}

TEST_F(Cli, GenerateFromChatMessagesRendersTheTemplate) {
  const Tokenizer tokenizer = Tokenizer::from_directory(model_);
  ChatRenderOptions options;
  options.bos_token = tokenizer.bos_token();
  options.eos_token = tokenizer.eos_token();
  const std::string rendered = ChatTemplate(tokenizer.chat_template())
                                   .render(std::vector<ChatMessage>{{"system", "Be brief."}, {"user", "Hi!"}}, options);
  const std::string expected = "prompt tokens: " + std::to_string(tokenizer.encode_rendered_chat(rendered).size()) + ",";
  for (const std::string messages : {"'system: Be brief.\nuser: Hi!'",
                                     R"('[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]')"}) {
    const RunResult generated =
        run_cli(scratch_, "generate --backend reference --model " + model_.string() + " --chat " + messages + " --max-tokens 4");
    ASSERT_EQ(generated.exit_code, 0) << generated.err;
    EXPECT_EQ(stats_line(generated).rfind(expected, 0), 0u) << generated.out;
  }
}

// Sampled ids from random weights are often bytes that do not form UTF-8 characters on their own:
// the streamed text must still be exactly the full decode of the ids.
TEST_F(Cli, StreamedTextIsTheDecodeOfTheGeneratedIds) {
  const Tokenizer tokenizer = Tokenizer::from_directory(model_);
  const std::string args = "generate --backend reference --model " + model_.string() +
                           " --prompt-ids 315,84,104,101 --max-tokens 40 --ignore-eos --temperature 1 --top-k 0 --seed 7";
  const RunResult as_text = run_cli(scratch_, args);
  ASSERT_EQ(as_text.exit_code, 0) << as_text.err;
  remove_tokenizer();
  const RunResult as_ids = run_cli(scratch_, args);
  ASSERT_EQ(as_ids.exit_code, 0) << as_ids.err;
  const std::vector<int> ids = generated_ids(as_ids);
  ASSERT_EQ(ids.size(), 40u);
  EXPECT_EQ(generated_output(as_text), tokenizer.decode({ids.begin(), ids.end()}, /*skip_special_tokens=*/true));
}

TEST_F(Cli, TextPromptsNeedTheTokenizer) {
  remove_tokenizer();
  const std::string model = " --backend reference --model " + model_.string();
  const std::string missing = (model_ / "tokenizer.json").string();
  expect_bad_input(run_cli(scratch_, "generate" + model + " --prompt hello"), {"--prompt", missing, "not found"});
  expect_bad_input(run_cli(scratch_, "generate" + model + " --chat 'user: hello'"), {"--chat", missing, "not found"});
  expect_bad_input(run_cli(scratch_, "score" + model + " --prompt hello"), {"--prompt", missing, "not found"});
}

}  // namespace
}  // namespace deepfuse
