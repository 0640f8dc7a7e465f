// `deepfuse bench qkv`: fused vs unfused front half of the attention block (bench/qkv_bench.hpp).
#include "bench/qkv_bench.hpp"
#include "cli/commands.hpp"

namespace deepfuse::cli {

void register_bench_qkv(CLI::App& bench, Action& action) {
  auto* command = bench.add_subcommand("qkv", "Input RMSNorm + QKV + RoPE + KV append: fused vs unfused");
  auto options = std::make_shared<bench::QkvBenchOptions>();
  command->add_option("--m", options->token_counts, "token counts (default 1,8,16,32)")->delimiter(',');
  command->add_option("--reps", options->repetitions, "timed calls per point (median)")->check(CLI::PositiveNumber);
  command->add_option("--json", options->json_path, "write the rows as JSON to this file");
  command->callback([options, &action] {
    action = [options] {
      bench::QkvBenchOptions run = *options;
      run.shapes = bench::default_qkv_bench_shapes();
      return bench::run_qkv_bench(run);
    };
  });
}

}  // namespace deepfuse::cli
