// Shapes and GPUs the scheduler tests run over: the three README models, an odd tiny shape the
// fused kernels refuse, and one GPU of each built-in class.
#pragma once

#include <string>
#include <vector>

#include "scheduler/variants.hpp"

namespace deepfuse::testing {

struct NamedShape {
  std::string name;
  scheduler::PlanShape shape;
};

inline scheduler::PlanShape plan_shape(int hidden, int intermediate, int q, int kv, int d, int layers, int vocab,
                                       bool bias = false) {
  scheduler::PlanShape s;
  s.hidden = hidden, s.intermediate = intermediate, s.q_heads = q, s.kv_heads = kv, s.head_dim = d;
  s.layers = layers, s.vocab = vocab, s.qkv_bias = bias;
  return s;
}

inline std::vector<NamedShape> model_shapes() {
  return {{"llama3-8b", plan_shape(4096, 14336, 32, 8, 128, 32, 128256)},
          {"llama3.2-1b", plan_shape(2048, 8192, 32, 8, 64, 16, 128256)},
          {"qwen2.5-7b", plan_shape(3584, 18944, 28, 4, 128, 28, 152064, true)},
          {"tiny-d16", plan_shape(64, 128, 4, 2, 16, 2, 256)}};
}

inline scheduler::GpuInfo gpu(const std::string& name, int major, int minor, int sms, size_t gib) {
  scheduler::GpuInfo g;
  g.name = name, g.major = major, g.minor = minor, g.sms = sms, g.memory_bytes = gib << 30;
  return g;
}
inline scheduler::GpuInfo h100() { return gpu("NVIDIA H100 80GB HBM3", 9, 0, 132, 80); }
inline scheduler::GpuInfo a100() { return gpu("NVIDIA A100-SXM4-80GB", 8, 0, 108, 80); }
inline scheduler::GpuInfo l40s() { return gpu("NVIDIA L40S", 8, 9, 142, 48); }
inline std::vector<scheduler::GpuInfo> gpus() { return {h100(), a100(), l40s()}; }

inline const std::vector<int>& buckets() {
  static const std::vector<int> b{1, 2, 4, 8, 16, 32, 64};
  return b;
}

}  // namespace deepfuse::testing
