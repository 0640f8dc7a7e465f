// config.json parsing for Llama (2, 3, 3.1+ rope scaling), Qwen2 and Mistral, and its errors.
#include <gtest/gtest.h>

#include "deepfuse/model_config.hpp"
#include "model/model_test_util.hpp"

namespace deepfuse {
namespace {

using testing::expect_error;

// Llama 3.2 1B's config.json (transformers 4.x spelling: rope_theta and rope_scaling).
const std::string kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})";

TEST(ModelConfig, Llama32WithLlama3RopeScaling) {
  const ModelConfig c = parse_model_config(kLlama32, "config.json");
  EXPECT_EQ(c.architecture, Architecture::llama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope.head_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_TRUE(c.rope.llama3_scaling);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, DefaultsFollowTheTransformersClasses) {
  // Llama 2 style: no head_dim, no num_key_value_heads, no rope_theta, no tie flag.
  const ModelConfig c = parse_model_config(
      R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":64,"intermediate_size":96,
          "num_hidden_layers":2,"num_attention_heads":4,"eos_token_id":2})", "config.json");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.rope.llama3_scaling);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2}));
}

TEST(ModelConfig, Qwen2HasQkvBiasAndMistralASlidingWindow) {
  const std::string dims = R"("vocab_size":100,"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,
                              "num_attention_heads":4,"num_key_value_heads":2)";
  const ModelConfig qwen = parse_model_config(
      R"({"architectures":["Qwen2ForCausalLM"],"use_sliding_window":false,"sliding_window":4096,)" + dims +
          R"(,"rope_parameters":{"rope_type":"default","rope_theta":1000000.0}})", "config.json");
  EXPECT_EQ(qwen.architecture, Architecture::qwen2);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.o_proj_bias);
  EXPECT_EQ(qwen.sliding_window, 0);
  EXPECT_DOUBLE_EQ(qwen.rope.theta, 1e6);
  const ModelConfig mistral =
      parse_model_config(R"({"model_type":"mistral","sliding_window":4096,)" + dims + "}", "config.json");
  EXPECT_EQ(mistral.architecture, Architecture::mistral);
  EXPECT_EQ(mistral.sliding_window, 4096);
  const ModelConfig mistral_v3 =
      parse_model_config(R"({"model_type":"mistral","sliding_window":null,)" + dims + "}", "config.json");
  EXPECT_EQ(mistral_v3.sliding_window, 0);
}

TEST(ModelConfig, GenerationConfigFillsSamplingDefaults) {
  ModelConfig c = parse_model_config(kLlama32, "config.json");
  parse_generation_config(R"({"do_sample":true,"temperature":0.6,"top_p":0.9,"eos_token_id":[1,2]})",
                          "generation_config.json", c);
  EXPECT_EQ(c.generation.do_sample, true);
  EXPECT_FLOAT_EQ(*c.generation.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*c.generation.top_p, 0.9f);
  EXPECT_FALSE(c.generation.top_k.has_value());
  EXPECT_EQ(c.generation.eos_token_ids, (std::vector<int32_t>{1, 2}));
  expect_error([&] { parse_generation_config(R"({"top_k":"many"})", "generation_config.json", c); },
               {"generation_config.json", "'top_k'", "integer"});
}

// Replaces the first occurrence of `from` in the Llama 3.2 config.
std::string llama_with(const std::string& from, const std::string& to) {
  std::string text = kLlama32;
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(ModelConfig, ErrorsNameTheFileAndField) {
  auto parse = [](const std::string& text) { return [=] { parse_model_config(text, "dir/config.json"); }; };
  expect_error(parse(R"({"architectures":)"), {"dir/config.json", "invalid JSON"});
  expect_error(parse("[]"), {"dir/config.json", "object"});
  expect_error(parse(llama_with("LlamaForCausalLM", "GPT2LMHeadModel")),
               {"dir/config.json", "'architectures'", "unsupported architecture 'GPT2LMHeadModel'"});
  expect_error(parse(llama_with(R"("hidden_size": 2048)", R"("hidden_size": "2048")")),
               {"dir/config.json", "'hidden_size'", "must be an integer"});
  expect_error(parse(llama_with(R"("hidden_size": 2048,)", "")), {"'hidden_size'", "missing"});
  expect_error(parse(llama_with(R"("num_key_value_heads": 8)", R"("num_key_value_heads": 7)")),
               {"'num_key_value_heads'", "divide"});
  expect_error(parse(llama_with(R"("vocab_size": 128256)", R"("vocab_size": -3)")), {"'vocab_size'", "outside"});
  expect_error(parse(llama_with(R"("rope_type": "llama3")", R"("rope_type": "yarn")")),
               {"'rope_scaling.rope_type'", "yarn"});
  expect_error(parse(llama_with(R"("factor": 32.0,)", "")), {"'rope_scaling.factor'", "missing"});
  expect_error(parse(llama_with(R"("rope_theta": 500000.0)", R"("rope_theta": "big")")),
               {"'rope_theta'", "number"});
  expect_error(parse(llama_with(R"("tie_word_embeddings": true)", R"("tie_word_embeddings": 1)")),
               {"'tie_word_embeddings'", "true or false"});
  expect_error(parse(llama_with(R"("eos_token_id": [128001,)", R"("eos_token_id": ["x",)")), {"'eos_token_id'"});
  expect_error(parse(llama_with(R"("hidden_act": "silu")", R"("hidden_act": "gelu")")), {"'hidden_act'"});
  expect_error(parse(llama_with(R"("head_dim": 64)", R"("head_dim": 63)")), {"'head_dim'", "even"});
}

TEST(ModelConfig, LoadReadsBothFilesAndNamesMissingOnes) {
  testing::ScratchDir dir;
  expect_error([&] { load_model_config(dir.path()); }, {"config.json", "not found"});
  testing::write_file(dir.path() / "config.json", kLlama32);
  testing::write_file(dir.path() / "generation_config.json", R"({"top_k": 5})");
  const ModelConfig c = load_model_config(dir.path());
  EXPECT_EQ(c.generation.top_k, 5);
}

}  // namespace
}  // namespace deepfuse
