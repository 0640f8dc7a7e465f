// The architectures `--random-weights --arch` offers: make-model's presets at full size, plus
// Llama 3.1 70B: 141 GB of bf16 weights, just inside one H200 and beyond any smaller GPU (where
// the engine reports the bytes needed and free before allocating anything).
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"

namespace deepfuse {

std::vector<std::string> random_arch_names() {
  return {"llama3-8b", "llama3.2-1b", "qwen2.5-7b", "mistral-7b", "llama3-70b"};
}

ModelConfig random_arch_config(const std::string& name) {
  if (name == "llama3-70b") {
    ModelConfig c = model_preset("llama3-8b");  // same family: vocabulary, norms, BOS/EOS
    c.hidden_size = 8192;
    c.intermediate_size = 28672;
    c.num_hidden_layers = 80;
    c.num_attention_heads = 64;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 131072;
    c.rope.head_dim = 128;
    c.rope.theta = 500000.0;
    c.rope.llama3_scaling = true;
    c.rope.factor = 8.0;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
    c.rope.original_max_position = 8192;
    return c;
  }
  for (const std::string& known : random_arch_names())
    if (name == known) return model_preset(name);
  std::string list;
  for (const std::string& known : random_arch_names()) list += (list.empty() ? "" : ", ") + known;
  throw Error("unknown architecture '" + name + "' for random weights (known: " + list + ")");
}

}  // namespace deepfuse
