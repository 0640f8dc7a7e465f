// `deepfuse inspect`: what a checkpoint directory holds, after validating it fully; with --plan,
// the decode plan the CUDA engine would run for it on this GPU, and where each choice came from.
#include <cstdio>
#include <map>

#include "cli/commands.hpp"
#include "cli/engine_options.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse::cli {

namespace {

struct InspectArgs {
  std::string model_dir;
  bool plan = false;
  EngineArgs engine;
};

void print_plan(const ModelConfig& config, const EngineArgs& args) {
  const EngineOptions options = engine_options(args);  // bad flags fail before any GPU work
  DF_CHECK(cuda_device_available(), "inspect --plan: no CUDA device found on this machine (plans are per GPU)");
  const PlanPreview preview = preview_plan(config, options);
  if (!preview.notice.empty()) std::fprintf(stderr, "%s\n", preview.notice.c_str());
  std::printf("\ndecode plan (max_batch %d, tuning cache %s):\n%s", options.max_batch,
              options.tuning_cache.empty() ? "none" : options.tuning_cache.string().c_str(),
              describe(preview.plan).c_str());
  std::printf("%s\n", describe_steps(options).c_str());
  std::printf("weights on the GPU: %zu bytes (%.2f GiB) in the layouts this plan runs\n", preview.gpu_weight_bytes,
              static_cast<double>(preview.gpu_weight_bytes) / (1ull << 30));
}

// Each linear weight's format and bytes as the backend stores it (after --quantize), summed over
// the layers: "mlp.down_proj  fp8_e4m3  x2  33280 bytes".
void print_linear_formats(const ModelConfig& config, const WeightLoadOptions& options) {
  struct Row {
    int count = 0;
    size_t bytes = 0;
  };
  std::map<std::pair<int, std::string>, Row> rows;  // by role (table order), then format
  for (const ExpectedTensor& tensor : expected_tensors(config)) {
    if (tensor.shape.size() != 2 || !tensor.spec->formats.has(WeightFormat::fp8_e4m3)) continue;
    const WeightFormat format = loaded_weight_format(config, tensor, options);
    Row& row = rows[{static_cast<int>(tensor.spec->role), weight_format_name(format)}];
    ++row.count;
    row.bytes += linear_weight_bytes(format, static_cast<size_t>(tensor.shape[0]), static_cast<size_t>(tensor.shape[1]));
  }
  std::printf("linear weights (format as loaded, bytes with scales):\n");
  for (const auto& [key, row] : rows)
    std::printf("  %-24s %-18s x%-4d %zu bytes\n", kModelTensors[key.first].name, key.second.c_str(), row.count,
                row.bytes);
}

int run_inspect(const InspectArgs& args) {
  const std::string& model_dir = args.model_dir;
  if (args.plan) {  // the plan's flags and its GPU are checked before anything is printed
    engine_options(args.engine);
    DF_CHECK(cuda_device_available(), "inspect --plan: no CUDA device found on this machine (plans are per GPU)");
  }
  const WeightLoadOptions load_options = weight_load_options(args.engine);
  const ModelConfig c = load_model_config(model_dir);
  const Checkpoint checkpoint(model_dir);
  validate_checkpoint(checkpoint, c);

  uint64_t parameters = 0, bytes = 0;
  std::map<std::string, int> tensors_per_dtype;
  for (const auto& [name, entry] : checkpoint.tensors()) {
    parameters += entry.info->element_count();
    bytes += entry.info->byte_size();
    ++tensors_per_dtype[dtype_name(entry.info->dtype)];
  }
  std::string dtypes;
  for (const auto& [dtype, count] : tensors_per_dtype)
    dtypes += (dtypes.empty() ? "" : ", ") + dtype + " (" + std::to_string(count) + " tensors)";

  std::printf("model:         %s\n", model_dir.c_str());
  std::printf("architecture:  %s\n", architecture_name(c.architecture));
  std::printf("sizes:         vocab %d, hidden %d, intermediate %d, layers %d\n", c.vocab_size, c.hidden_size,
              c.intermediate_size, c.num_hidden_layers);
  std::printf("attention:     %d heads, %d kv heads, head_dim %d%s%s\n", c.num_attention_heads,
              c.num_key_value_heads, c.head_dim, c.qkv_bias ? ", q/k/v bias" : "",
              c.sliding_window > 0 ? (", sliding window " + std::to_string(c.sliding_window)).c_str() : "");
  std::printf("positions:     %d, rope theta %g%s\n", c.max_position_embeddings, c.rope.theta,
              c.rope.llama3_scaling ? (", llama3 scaling x" + std::to_string(c.rope.factor)).c_str() : "");
  std::printf("embeddings:    %s\n", c.tie_word_embeddings ? "tied (lm_head = embed_tokens)" : "separate lm_head");
  std::printf("files:         %zu safetensors\n", checkpoint.files().size());
  std::printf("dtype:         %s\n", dtypes.c_str());
  std::printf("quantization:  %s\n", c.quantization.quantized()
                                         ? (std::string(quantization_method_name(c.quantization.method)) + " (" +
                                            weight_format_name(c.quantization.format) + ")").c_str()
                                         : "none");
  std::printf("parameters:    %llu\n", static_cast<unsigned long long>(parameters));
  std::printf("bytes:         %llu (%.2f GiB)\n", static_cast<unsigned long long>(bytes),
              static_cast<double>(bytes) / (1ull << 30));
  print_linear_formats(c, load_options);
  if (args.plan) print_plan(c, args.engine);
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand("inspect", "Validate a checkpoint and print its architecture, sizes and dtype");
  auto args = std::make_shared<InspectArgs>();
  command->add_option("--model", args->model_dir, "checkpoint directory")->required();
  command->add_flag("--plan", args->plan,
                    "also print the decode plan the CUDA engine would run on this GPU (the engine flags below shape it)");
  add_engine_options(*command, args->engine);
  command->callback([args, &action] { action = [args] { return run_inspect(*args); }; });
}

}  // namespace deepfuse::cli
