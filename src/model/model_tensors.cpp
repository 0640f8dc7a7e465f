// Shapes, names and group offsets from the model table (include/deepfuse/model_tensors.hpp).
#include "deepfuse/model_tensors.hpp"

#include "deepfuse/error.hpp"

namespace deepfuse {

std::vector<const TensorSpec*> tensors_in(TensorScope scope) {
  std::vector<const TensorSpec*> specs;
  for (const TensorSpec& spec : kModelTensors)
    if (spec.scope == scope) specs.push_back(&spec);
  return specs;
}

int64_t extent_size(Extent extent, const ModelConfig& c) {
  switch (extent) {
    case Extent::none: return 1;
    case Extent::hidden: return c.hidden_size;
    case Extent::q: return c.q_size();
    case Extent::kv: return c.kv_size();
    case Extent::intermediate: return c.intermediate_size;
    case Extent::vocab: return c.vocab_size;
  }
  throw Error("internal: unknown tensor extent");
}

std::vector<int64_t> tensor_shape(const TensorSpec& spec, const ModelConfig& config) {
  if (spec.columns == Extent::none) return {extent_size(spec.rows, config)};
  return {extent_size(spec.rows, config), extent_size(spec.columns, config)};
}

std::string tensor_name(const TensorSpec& spec, int layer) {
  if (spec.scope != TensorScope::layer) return spec.name;
  return "model.layers." + std::to_string(layer) + "." + spec.name;
}

int64_t group_rows(TensorGroup group, const ModelConfig& config) {
  int64_t rows = 0;
  for (const TensorSpec& spec : kModelTensors)
    if (spec.group == group && spec.present(config)) rows += extent_size(spec.rows, config);
  return rows;
}

int64_t group_columns(TensorGroup group, const ModelConfig& config) {
  for (const TensorSpec& spec : kModelTensors)
    if (spec.group == group) return extent_size(spec.columns, config);
  throw Error("internal: a tensor group with no tensor in the model table");
}

int64_t row_in_group(const TensorSpec& target, const ModelConfig& config) {
  int64_t row = 0;
  for (const TensorSpec& spec : kModelTensors) {
    if (&spec == &target) return row;
    if (spec.group == target.group && spec.present(config)) row += extent_size(spec.rows, config);
  }
  throw Error("internal: tensor spec outside the model table");
}

}  // namespace deepfuse
