// `deepfuse bench <suite>`: speed measurements as tables and JSON.
#include <string>
#include <vector>

#include "bench/all_reduce_bench.hpp"
#include "bench/attention_bench.hpp"
#include "bench/decode_bench.hpp"
#include "bench/mlp_bench.hpp"
#include "bench/sampling_bench.hpp"
#include "cli/engine_options.hpp"
#include "cli/commands.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::cli {
namespace {

// "4096x14336" -> {4096, 14336}
MlpShape parse_shape(const std::string& text) {
  const auto x = text.find('x');
  DF_CHECK(x != std::string::npos, "bad shape '" + text + "' (expected HIDDENxINTERMEDIATE, e.g. 4096x14336)");
  try {
    return {std::stoi(text.substr(0, x)), std::stoi(text.substr(x + 1))};
  } catch (const std::exception&) {
    throw Error("bad shape '" + text + "' (expected HIDDENxINTERMEDIATE, e.g. 4096x14336)");
  }
}

// `deepfuse bench decode`: the CUDA engine's decode step per (arch, batch, context) and TTFT.
void register_bench_decode(CLI::App& bench, Action& action) {
  auto* decode = bench.add_subcommand("decode", "CUDA engine decode step vs its roofline, and time to first token");
  struct DecodeArgs {
    bench::DecodeBenchOptions options;
    EngineArgs plan;  // --plan-override, --tuning-cache, --no-tuning-cache
    bool server_memory_plan = false;
    size_t kv_cache_mb = 0;
    bool no_cuda_graphs = false;
    bool no_overlap_steps = false;
    bool no_ttft = false;
    std::vector<std::string> weights;
    std::string speculative = choice_name(SpeculativeChoice::off);
  };
  auto args = std::make_shared<DecodeArgs>();
  auto& o = args->options;
  decode->add_option("--archs", o.archs, "random-weight presets (default llama3-8b,llama3.2-1b,qwen2.5-7b)")
      ->delimiter(',');
  decode->add_option("--weights", args->weights,
                     "linear weight formats, each arch once per format: bf16, fp8 (per-channel FP8 e4m3 of the same "
                     "random weights; lm_head stays bf16), fp8-block128 (the same with a scale per 128x128 block) "
                     "(default bf16)")
      ->delimiter(',');
  decode->add_option("--batches", o.batches, "sequences decoded together (default 1,8,32)")->delimiter(',');
  decode->add_option("--contexts", o.contexts, "tokens in each sequence's KV cache (default 512,8192,32768)")
      ->delimiter(',');
  decode->add_option("--ttft-prompts", o.ttft_prompts, "prompt lengths for time to first token (default 512,4096)")
      ->delimiter(',');
  decode->add_flag("--no-ttft", args->no_ttft, "skip the time-to-first-token measurements");
  decode->add_option("--steps", o.steps, "timed decode steps per case (one interval over all of them; default 32)")->check(CLI::PositiveNumber);
  decode->add_option("--warmup", o.warmup, "untimed steps first (default 4)")->check(CLI::NonNegativeNumber);
  decode->add_option("--ttft-reps", o.ttft_repetitions, "timed first tokens per prompt length (default 3)")
      ->check(CLI::PositiveNumber);
  decode->add_flag("--no-cuda-graphs", args->no_cuda_graphs, "eager launches instead of CUDA graphs");
  decode->add_flag("--no-overlap-steps", args->no_overlap_steps,
                   "read each decode step back before launching the next (EngineOptions::overlap_steps)");
  add_plan_options(*decode, args->plan);
  decode->add_flag("--plan", o.print_plan, "print each engine's decode plan and where it came from");
  decode->add_flag("--server-memory-plan", args->server_memory_plan,
                   "drop the unfused MLP copy unless max_batch x max_context of KV cache fits too, as "
                   "generate and serve do (default: keep it whenever the weights fit)");
  decode->add_option("--max-context", o.max_context,
                     "the engine's planned context (default: what the longest case needs); the attention plans for it")
      ->check(CLI::PositiveNumber);
  decode->add_option("--kv-cache-mb", args->kv_cache_mb, "KV cache pool in MiB (default: 90% of free GPU memory)")
      ->check(CLI::PositiveNumber);
  decode->add_flag("--tune-gemms", o.tune_gemms,
                   "time cuBLASLt's suggested algorithms at construction and keep the fastest (EngineOptions::tune_gemms)");
  decode->add_option("--verify-drafts", o.verify_drafts,
                     "speculative verify rows: each case's step with every sequence verifying this many random "
                     "drafts, against a one-token step (default 0: none)")
      ->check(CLI::Range(0, 15));
  add_speculative_option(*decode, args->speculative);
  decode->add_option("--request-prompt", o.request_prompt,
                     "with --speculative: random prompt tokens of each request row (default 256)")
      ->check(CLI::PositiveNumber);
  decode->add_option("--request-tokens", o.request_tokens,
                     "with --speculative: tokens each request row generates (default 128)")
      ->check(CLI::Range(2, 1 << 20));
  decode->add_option("--seed", o.seed, "random weights and prompts (default 1)");
  decode->add_option("--json", o.json_path, "write the rows as JSON to this file");
  decode->add_option("--trace", o.trace_path,
                     "write per-block timelines of one more step per case as CSV (needs -DDEEPFUSE_TRACE=ON)");
  decode->callback([args, &action] {
    action = [args] {
      bench::DecodeBenchOptions options = args->options;
      if (options.archs.empty()) options.archs = bench::default_decode_bench_archs();
      if (!args->weights.empty()) options.weights.clear();
      for (const std::string& name : args->weights) options.weights.push_back(parse_weights_flag(name));
      if (options.batches.empty()) options.batches = bench::default_decode_bench_batches();
      if (options.contexts.empty()) options.contexts = bench::default_decode_bench_contexts();
      if (args->no_ttft) options.ttft_prompts.clear();
      else if (options.ttft_prompts.empty()) options.ttft_prompts = bench::default_decode_bench_ttft_prompts();
      options.cuda_graphs = !args->no_cuda_graphs;
      options.overlap_steps = !args->no_overlap_steps;
      const EngineOptions plan = engine_options(args->plan);  // a bad override fails here, before any GPU work
      options.plan_overrides = plan.plan_overrides;
      for (const std::string& text : args->plan.plan_overrides)
        options.plan_override_text += (options.plan_override_text.empty() ? "" : ",") + text;
      options.tuning_cache = plan.tuning_cache;
      options.keep_mlp_copy = !args->server_memory_plan;
      options.kv_cache_bytes = args->kv_cache_mb << 20;
      options.tensor_parallel = plan.tensor_parallel;
      options.speculative = speculative_choice(args->speculative);
      return bench::run_decode_bench(options);
    };
  });
}

// `deepfuse bench sampling`: the GPU sampler per vocabulary, batch and mode.
void register_bench_sampling(CLI::App& bench, Action& action) {
  auto* sampling = bench.add_subcommand("sampling", "GPU sampling (greedy, temperature, top-k, top-p, min-p) per call");
  auto options = std::make_shared<bench::SamplingBenchOptions>();
  sampling->add_option("--vocabs", options->vocabs, "vocabulary sizes (default 128256,152064)")->delimiter(',');
  sampling->add_option("--batches", options->batches, "sequences per call (default 1,8,32)")->delimiter(',');
  std::string mode_names;
  for (const auto& m : bench::sampling_bench_modes()) mode_names += (mode_names.empty() ? "" : ",") + m;
  sampling->add_option("--modes", options->modes, "parameter sets (default all: " + mode_names + ")")->delimiter(',');
  sampling->add_option("--cluster", options->cluster_size, "force blocks per sequence: 1, 4, 8 or 16 (default: the launcher's)")
      ->check(CLI::IsMember({0, 1, 4, 8, 16}));
  sampling->add_option("--reps", options->repetitions, "timed calls per case (median)")->check(CLI::PositiveNumber);
  sampling->add_option("--json", options->json_path, "write the rows as JSON to this file");
  sampling->callback([options, &action] { action = [options] { return bench::run_sampling_bench(*options); }; });
}

// `deepfuse bench allreduce`: NCCL vs the one-shot peer-to-peer all-reduce across --tp GPUs.
void register_bench_allreduce(CLI::App& bench, Action& action) {
  auto* allreduce = bench.add_subcommand("allreduce", "Tensor-parallel all-reduce: NCCL vs the one-shot NVLink kernel");
  auto options = std::make_shared<bench::AllReduceBenchOptions>();
  allreduce->add_option("--tp", options->tp, "GPUs 0..N-1 (2 to 8)")->required()->check(CLI::Range(2, 8));
  allreduce->add_option("--hiddens", options->hiddens, "hidden sizes (default 4096,8192)")->delimiter(',');
  allreduce->add_option("--tokens", options->tokens, "tokens per message (default 1,2,4,...,64)")->delimiter(',');
  allreduce->add_option("--calls", options->calls_per_graph, "all-reduces per captured graph (even; default 100)")
      ->check(CLI::PositiveNumber);
  allreduce->add_option("--reps", options->replays, "timed graph replays per case (median; default 20)")
      ->check(CLI::PositiveNumber);
  allreduce->add_option("--json", options->json_path, "write the rows as JSON to this file");
  allreduce->callback([options, &action] { action = [options] { return bench::run_all_reduce_bench(*options); }; });
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "Benchmark kernels against baselines and the copy bandwidth");
  bench->require_subcommand(1);
  register_bench_tokenizer(*bench, action);
  register_bench_qkv(*bench, action);
  register_bench_decode(*bench, action);
  register_bench_sampling(*bench, action);
  register_bench_allreduce(*bench, action);

  auto* mlp = bench->add_subcommand("mlp", "SwiGLU MLP: naive vs unfused vs fused");
  struct MlpArgs {
    std::vector<std::string> shapes;
    std::vector<int> tokens;
    std::vector<std::string> variants;
    bench::MlpBenchOptions options;
    bool no_residual = false;
    std::string weights = "bf16";
  };
  auto args = std::make_shared<MlpArgs>();
  mlp->add_option("--shapes", args->shapes, "HxI shapes (default: the six Llama/Qwen shapes)")->delimiter(',');
  mlp->add_option("--m", args->tokens, "token counts M (default 1,2,4,...,256)")->delimiter(',');
  mlp->add_option("--variants", args->variants,
                  "naive,unfused,fused,fused_batched (and fused_wgmma on request: sm_90, not verified yet)")
      ->delimiter(',');
  mlp->add_option("--reps", args->options.repetitions, "timed calls per point (median)")->check(CLI::PositiveNumber);
  mlp->add_option("--warmup", args->options.warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  mlp->add_option("--fused-tunings", args->options.fused_tunings,
                  "extra fused rows with launch tuning bBcC, e.g. b2c8,b1c8,b2c1")
      ->delimiter(',');
  mlp->add_flag("--no-residual", args->no_residual, "time without the fused residual add");
  mlp->add_flag("--norm", args->options.norm, "fold an RMSNorm of x in (the decode engine's configuration)");
  mlp->add_option("--weights", args->weights,
                  "weight format: bf16, or fp8_e4m3 (random e4m3 bytes with per-row scales; the fused variant "
                  "up to 16 tokens)");
  mlp->add_option("--json", args->options.json_path, "write the rows as JSON to this file");
  mlp->add_option("--trace", args->options.trace_path,
                  "write per-block timelines of a graph of calls per row as CSV (needs -DDEEPFUSE_TRACE=ON)");
  mlp->callback([args, &action] {
    action = [args] {
      bench::MlpBenchOptions options = args->options;
      options.residual = !args->no_residual;
      options.weights = parse_weight_format(args->weights);
      if (args->shapes.empty()) {
        options.shapes = bench::default_mlp_bench_shapes();
      } else {
        for (const auto& s : args->shapes) options.shapes.push_back(parse_shape(s));
      }
      options.token_counts = args->tokens.empty() ? bench::default_mlp_bench_tokens() : args->tokens;
      if (!args->variants.empty()) {
        options.variants.clear();
        for (const auto& v : args->variants) options.variants.push_back(parse_mlp_variant(v));
      }
      return bench::run_mlp_bench(options);
    };
  });

  auto* attention = bench->add_subcommand("attention", "Split-KV paged decode attention vs the copy bandwidth");
  struct AttentionArgs {
    std::vector<std::string> cases;
    bench::AttentionBenchOptions options;
  };
  auto attention_args = std::make_shared<AttentionArgs>();
  attention->add_option("--cases", attention_args->cases, "BATCHxCONTEXT cases (default 1x8192,1x32768,8x32768,32x8192)")
      ->delimiter(',');
  attention->add_option("--q-heads", attention_args->options.q_heads, "query heads")->check(CLI::PositiveNumber);
  attention->add_option("--kv-heads", attention_args->options.kv_heads, "key/value heads")->check(CLI::PositiveNumber);
  attention->add_option("--head-dim", attention_args->options.head_dim, "64 or 128")->check(CLI::IsMember({64, 128}));
  attention->add_option("--reps", attention_args->options.repetitions, "timed calls per case (median)")
      ->check(CLI::PositiveNumber);
  attention->add_option("--warmup", attention_args->options.warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  attention->add_option("--splits", attention_args->options.splits,
                        "force this many splits per sequence (default: the plan's choice)")
      ->check(CLI::Range(1, 256));
  attention->add_option("--warps", attention_args->options.warps,
                        "force blocks of this many warps, 4 or 8 (default: the plan's choice)")
      ->check(CLI::IsMember({4, 8}));
  attention->add_option("--merge", attention_args->options.merge,
                        "where splits merge: workspace (L2), cluster (shared memory) or auto (as the engine: clusters for short sequences where they fit)")
      ->check(CLI::IsMember({"auto", "workspace", "cluster"}));
  attention->add_option("--json", attention_args->options.json_path, "write the rows as JSON to this file");
  attention->add_option("--trace", attention_args->options.trace_path,
                        "write per-block timelines of a graph of calls per case as CSV (needs -DDEEPFUSE_TRACE=ON)");
  attention->callback([attention_args, &action] {
    action = [attention_args] {
      bench::AttentionBenchOptions options = attention_args->options;
      if (attention_args->cases.empty()) {
        options.cases = bench::default_attention_bench_cases();
      } else {
        for (const auto& c : attention_args->cases) options.cases.push_back(bench::parse_attention_bench_case(c));
      }
      return bench::run_attention_bench(options);
    };
  });
}

}  // namespace deepfuse::cli
