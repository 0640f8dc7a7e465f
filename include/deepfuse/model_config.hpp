// What a Hugging Face config.json (and generation_config.json) says about a decoder-only model,
// reduced to the fields deepfuse runs on. A plain data type: the reference decoder and the GPU
// runtime take it as is; parsing lives in the model layer (src/model/config.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "deepfuse/quantization.hpp"
#include "deepfuse/rope.hpp"

namespace deepfuse {

enum class Architecture { llama, qwen2, mistral };

// "LlamaForCausalLM" etc.
const char* architecture_name(Architecture architecture);

// Sampling defaults a checkpoint ships in generation_config.json (absent fields stay empty).
struct GenerationDefaults {
  std::optional<bool> do_sample;
  std::optional<float> temperature;
  std::optional<int> top_k;
  std::optional<float> top_p;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::vector<int32_t> eos_token_ids;  // overrides config.json's when present
};

struct ModelConfig {
  Architecture architecture = Architecture::llama;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // config default: num_attention_heads (no GQA)
  int head_dim = 0;             // config default: hidden_size / num_attention_heads
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeParams rope;   // head_dim, theta and the optional llama3 scaling
  bool qkv_bias = false;        // Qwen2 always; Llama with attention_bias
  bool o_proj_bias = false;     // Llama with attention_bias
  bool tie_word_embeddings = false;
  int sliding_window = 0;       // 0: full attention (Mistral sets it)
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  std::string torch_dtype;      // as written, e.g. "bfloat16" (informational)
  WeightQuantization quantization;  // quantization_config; method none: 16/32-bit weights
  GenerationDefaults generation;

  int q_size() const { return num_attention_heads * head_dim; }
  int kv_size() const { return num_key_value_heads * head_dim; }
};

// Parses config.json text; `source` names the file in error messages. Throws deepfuse::Error
// naming the file and field on anything missing, mistyped, out of range or unsupported.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

// Fills config.generation from generation_config.json text.
void parse_generation_config(const std::string& json_text, const std::string& source, ModelConfig& config);

// Reads DIR/config.json and, when present, DIR/generation_config.json.
ModelConfig load_model_config(const std::filesystem::path& model_dir);

// Reads a whole file; throws deepfuse::Error naming it when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace deepfuse
