// The all-reduce oracle (declared in deepfuse/reference.hpp): fp32 on purpose, not double, since
// the kernel's exact fp32 summation order is part of its contract (bit-identical ranks).
#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"

namespace deepfuse::reference {

std::vector<uint16_t> all_reduce_sum_bf16(const std::vector<std::vector<uint16_t>>& inputs) {
  DF_CHECK(!inputs.empty(), "all_reduce_sum_bf16: no inputs");
  const size_t elements = inputs[0].size();
  for (const auto& input : inputs)
    DF_CHECK(input.size() == elements, "all_reduce_sum_bf16: inputs of different lengths");
  std::vector<uint16_t> out(elements);
  for (size_t i = 0; i < elements; ++i) {
    float sum = bf16_bits_to_float(inputs[0][i]);
    for (size_t r = 1; r < inputs.size(); ++r) sum += bf16_bits_to_float(inputs[r][i]);
    out[i] = float_to_bf16_bits(sum);
  }
  return out;
}

}  // namespace deepfuse::reference
