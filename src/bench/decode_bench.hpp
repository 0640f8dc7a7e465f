// `deepfuse bench decode`: the whole engine's decode step on real-shaped random-weight models,
// per (architecture, weight format, batch, context), against its roofline: the bytes one step must
// read (every weight once in its format, scales included, plus each sequence's K and V up to its
// context) over the copy bandwidth measured in the same run. Also time to first token for random prompts at batch 1.
//
// Long contexts need no prefill: runtime::EngineBench::add_prefilled gives sequences whose KV
// pages count as filled, so a 32k-context step costs a 32k-context step and nothing else.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse::bench {

struct DecodeBenchOptions {
  std::vector<std::string> archs;      // names from random_arch_names()
  // Each arch's linear weights in each of these formats, one engine each (EngineOptions::weights:
  // drawn in bf16, then quantized, so the formats hold the same model).
  std::vector<WeightFormat> weights{WeightFormat::bf16};
  std::vector<int> batches;            // sequences decoded together
  std::vector<int> contexts;           // tokens already in each sequence's KV cache
  std::vector<int> ttft_prompts;       // prompt lengths for time to first token (batch 1)
  int steps = 32;                      // timed decode steps per case
  int warmup = 4;                      // untimed steps first
  int ttft_repetitions = 3;            // timed first tokens per prompt length (median)
  bool cuda_graphs = true;
  bool overlap_steps = true;
  std::vector<PlanOverride> plan_overrides;  // EngineOptions::plan_overrides
  std::string plan_override_text;            // as given, for the results
  std::filesystem::path tuning_cache;        // EngineOptions::tuning_cache (empty: built-in plans)
  bool keep_mlp_copy = true;                 // EngineOptions::keep_mlp_copy
  bool print_plan = false;                   // --plan: each engine's plan before its rows
  bool tune_gemms = false;             // EngineOptions::tune_gemms; the timings go in a table of their own
  size_t kv_cache_bytes = 0;           // 0: the engine's default share of free GPU memory
  int max_context = 0;                 // the engine's planned context; 0: the longest case needs
  int tensor_parallel = 1;             // EngineOptions::tensor_parallel (GPUs 0..N-1)
  uint64_t seed = 1;                   // weights and TTFT prompts
  std::string json_path;               // empty: no JSON
  std::string trace_path;              // per-block timelines of one step per case (a DEEPFUSE_TRACE build)
  // Speculative decoding (speculative_bench.hpp): drafts per sequence in the verify rows (0: none),
  // and the drafter of the request rows (off: none), whose requests have request_prompt random
  // prompt tokens and generate request_tokens.
  int verify_drafts = 0;
  SpeculativeChoice speculative = SpeculativeChoice::off;
  int request_prompt = 256;
  int request_tokens = 128;
};

// llama3-8b, llama3.2-1b, qwen2.5-7b; batches 1, 8, 32; contexts 512, 8192, 32768; TTFT 512, 4096.
std::vector<std::string> default_decode_bench_archs();
std::vector<int> default_decode_bench_batches();
std::vector<int> default_decode_bench_contexts();
std::vector<int> default_decode_bench_ttft_prompts();

// Needs a CUDA device (throws deepfuse::Error without one). One engine per architecture, built
// for the largest batch and context; cases that do not fit its KV cache are skipped with the
// reason printed. Prints the tables to stdout; returns 0, or 1 when a decode row (its ms per
// step or its replay) beats the physical floor (core/roofline.hpp): a timing bug, never a result.
int run_decode_bench(const DecodeBenchOptions& options);

}  // namespace deepfuse::bench
