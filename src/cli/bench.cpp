// `deepfuse bench <suite>`: speed measurements as tables and JSON.
#include <string>
#include <vector>

#include "bench/attention_bench.hpp"
#include "bench/mlp_bench.hpp"
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

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "Benchmark kernels against baselines and the copy bandwidth");
  bench->require_subcommand(1);
  register_bench_tokenizer(*bench, action);
  register_bench_qkv(*bench, action);

  auto* mlp = bench->add_subcommand("mlp", "SwiGLU MLP: naive vs unfused vs fused");
  struct MlpArgs {
    std::vector<std::string> shapes;
    std::vector<int> tokens;
    std::vector<std::string> variants;
    bench::MlpBenchOptions options;
    bool no_residual = false;
  };
  auto args = std::make_shared<MlpArgs>();
  mlp->add_option("--shapes", args->shapes, "HxI shapes (default: the six Llama/Qwen shapes)")->delimiter(',');
  mlp->add_option("--m", args->tokens, "token counts M (default 1,2,4,...,256)")->delimiter(',');
  mlp->add_option("--variants", args->variants, "naive,unfused,fused")->delimiter(',');
  mlp->add_option("--reps", args->options.repetitions, "timed calls per point (median)")->check(CLI::PositiveNumber);
  mlp->add_option("--warmup", args->options.warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  mlp->add_option("--fused-tunings", args->options.fused_tunings,
                  "extra fused rows with launch tuning bBcC[-noreduce], e.g. b2c8,b1c8,b2c1-noreduce")
      ->delimiter(',');
  mlp->add_flag("--no-residual", args->no_residual, "time without the fused residual add");
  mlp->add_option("--json", args->options.json_path, "write the rows as JSON to this file");
  mlp->callback([args, &action] {
    action = [args] {
      bench::MlpBenchOptions options = args->options;
      options.residual = !args->no_residual;
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
  attention->add_option("--json", attention_args->options.json_path, "write the rows as JSON to this file");
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
