// `deepfuse make-model`: a random-weight checkpoint from a preset, optionally with other sizes,
// with a matching tokenizer (tokenizer.json + tokenizer_config.json) so the model takes text.
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/commands.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/tokenizer.hpp"

namespace deepfuse::cli {

namespace {

struct MakeModelArgs {
  std::string out_dir;
  std::string preset = "tiny";
  std::optional<std::string> architecture;
  std::optional<int> vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_position, sliding_window;
  std::optional<double> rope_theta;
  std::optional<bool> tie_embeddings;
  std::string dtype = "bf16";
  uint64_t seed = 0;
  int shards = 1;
};

Architecture parse_architecture(const std::string& name) {
  if (name == "llama") return Architecture::llama;
  if (name == "qwen2") return Architecture::qwen2;
  if (name == "mistral") return Architecture::mistral;
  throw Error("--arch '" + name + "': unknown architecture (llama, qwen2, mistral)");
}

// fp8 / fp8-block128: BF16 tensors but the projections, which are FP8 in that format (the
// config's quantization_config says so).
SafetensorsDType parse_dtype(const std::string& name) {
  if (name == "bf16" || name == "fp8" || name == "fp8-block128") return SafetensorsDType::BF16;
  if (name == "f16") return SafetensorsDType::F16;
  if (name == "f32") return SafetensorsDType::F32;
  throw Error("--dtype '" + name + "': unknown weight dtype (bf16, f16, f32, fp8, fp8-block128)");
}

// Vocabularies too small for the 256 byte tokens and the specials stay ids-only.
bool has_tokenizer(const ModelConfig& config) { return config.vocab_size >= kTinyTokenizerMinVocab; }

// The preset, with every explicitly given dimension replacing the preset's.
ModelConfig build_config(const MakeModelArgs& args) {
  ModelConfig c = model_preset(args.preset);
  if (args.architecture) {
    c.architecture = parse_architecture(*args.architecture);
    c.qkv_bias = c.architecture == Architecture::qwen2;
    if (c.architecture != Architecture::mistral) c.sliding_window = 0;
  }
  c.vocab_size = args.vocab.value_or(c.vocab_size);
  c.hidden_size = args.hidden.value_or(c.hidden_size);
  c.intermediate_size = args.intermediate.value_or(c.intermediate_size);
  c.num_hidden_layers = args.layers.value_or(c.num_hidden_layers);
  c.num_attention_heads = args.heads.value_or(c.num_attention_heads);
  c.num_key_value_heads = args.kv_heads.value_or(std::min(c.num_key_value_heads, c.num_attention_heads));
  DF_CHECK(args.head_dim || c.hidden_size % c.num_attention_heads == 0,
           "--heads must divide --hidden unless --head-dim is given");
  c.head_dim = args.head_dim.value_or(c.hidden_size / c.num_attention_heads);
  c.rope.head_dim = c.head_dim;
  c.max_position_embeddings = args.max_position.value_or(c.max_position_embeddings);
  c.rope.theta = args.rope_theta.value_or(c.rope.theta);
  c.tie_word_embeddings = args.tie_embeddings.value_or(c.tie_word_embeddings);
  if (args.sliding_window) {
    DF_CHECK(c.architecture == Architecture::mistral, "--sliding-window needs --arch mistral");
    c.sliding_window = *args.sliding_window;
  }
  // Every preset gets the same Llama-3-style tokenizer, sized to its vocabulary, so BOS and EOS
  // are that tokenizer's (also for presets whose real checkpoints number them otherwise).
  if (has_tokenizer(c)) {
    const TinyTokenizerIds ids = tiny_tokenizer_ids(c.vocab_size);
    c.bos_token_id = ids.begin_of_text;
    c.eos_token_ids = {ids.end_of_text, ids.eot};
  }
  return c;
}

int run_make_model(const MakeModelArgs& args) {
  ModelConfig config = build_config(args);
  MakeModelOptions options;
  options.dtype = parse_dtype(args.dtype);
  if (args.dtype == "fp8") config.quantization = fp8_checkpoint_quantization(WeightFormat::fp8_e4m3);
  if (args.dtype == "fp8-block128") config.quantization = fp8_checkpoint_quantization(WeightFormat::fp8_e4m3_block128);
  options.seed = args.seed;
  options.shards = args.shards;
  const std::filesystem::path dir = args.out_dir;
  DF_CHECK(!std::filesystem::exists(dir) || std::filesystem::is_empty(dir),
           "--out " + args.out_dir + ": directory exists and is not empty");
  write_random_checkpoint(config, dir, options);
  if (has_tokenizer(config)) write_tiny_tokenizer(dir, config.vocab_size);
  std::printf("wrote %s: %s, %d layers, hidden %d, vocab %d, %s, %d file%s, %s\n", args.out_dir.c_str(),
              architecture_name(config.architecture), config.num_hidden_layers, config.hidden_size, config.vocab_size,
              args.dtype.c_str(), args.shards, args.shards > 1 ? "s + index" : "",
              has_tokenizer(config) ? "tokenizer" : "no tokenizer (vocab below 261: token ids only)");
  return 0;
}

}  // namespace

void register_make_model(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand("make-model", "Write a random-weight checkpoint (preset or explicit sizes)");
  auto args = std::make_shared<MakeModelArgs>();
  command->add_option("--out", args->out_dir, "directory to create")->required();
  std::string presets;
  for (const auto& name : model_preset_names()) presets += (presets.empty() ? "" : ", ") + name;
  command->add_option("--preset", args->preset, "starting point: " + presets + " (default tiny)");
  command->add_option("--arch", args->architecture, "llama | qwen2 | mistral");
  command->add_option("--vocab", args->vocab, "vocabulary size")->check(CLI::PositiveNumber);
  command->add_option("--hidden", args->hidden, "hidden size")->check(CLI::PositiveNumber);
  command->add_option("--intermediate", args->intermediate, "MLP intermediate size")->check(CLI::PositiveNumber);
  command->add_option("--layers", args->layers, "decoder layers")->check(CLI::PositiveNumber);
  command->add_option("--heads", args->heads, "attention heads")->check(CLI::PositiveNumber);
  command->add_option("--kv-heads", args->kv_heads, "key/value heads (GQA)")->check(CLI::PositiveNumber);
  command->add_option("--head-dim", args->head_dim, "head dimension (default hidden/heads)")->check(CLI::PositiveNumber);
  command->add_option("--max-position", args->max_position, "max_position_embeddings")->check(CLI::PositiveNumber);
  command->add_option("--sliding-window", args->sliding_window, "Mistral sliding window (0: none)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--rope-theta", args->rope_theta, "rope base frequency");
  command->add_option("--tie-embeddings", args->tie_embeddings, "true | false: lm_head shares embed_tokens");
  command->add_option("--dtype", args->dtype,
                      "bf16 | f16 | f32 | fp8 (compressed-tensors FP8 projections with per-channel scales, the "
                      "rest bf16, lm_head kept bf16) | fp8-block128 (quant_method fp8 projections with a scale per "
                      "128x128 block, as Qwen's and DeepSeek's FP8 checkpoints: every projection's sizes must be "
                      "multiples of 128) (default bf16)");
  command->add_option("--seed", args->seed, "weight seed (default 0)");
  command->add_option("--shards", args->shards, "split into this many safetensors files (default 1)")
      ->check(CLI::PositiveNumber);
  command->callback([args, &action] { action = [args] { return run_make_model(*args); }; });
}

}  // namespace deepfuse::cli
