// The `deepfuse` command. Exit codes: 0 success, 1 runtime failure, 2 bad input or usage.
#include <cstdio>
#include <exception>

#include "cli/commands.hpp"
#include "deepfuse/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"deepfuse: fused-kernel LLM inference for low-batch, long-context decode"};
  app.require_subcommand(0, 1);
  deepfuse::cli::Action action;
  deepfuse::cli::register_bench(app, action);
  deepfuse::cli::register_generate(app, action);
  deepfuse::cli::register_chat(app, action);
  deepfuse::cli::register_score(app, action);
  deepfuse::cli::register_inspect(app, action);
  deepfuse::cli::register_make_model(app, action);
  deepfuse::cli::register_tokenize(app, action);
  deepfuse::cli::register_tune(app, action);
  deepfuse::cli::register_serve(app, action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!action) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  try {
    return action();
  } catch (const deepfuse::Error& e) {
    std::fprintf(stderr, "deepfuse: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepfuse: internal error: %s\n", e.what());
    return 1;
  }
}
