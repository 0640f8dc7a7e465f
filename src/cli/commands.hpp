// Every `deepfuse` subcommand registers itself on the CLI11 app through one function here.
// main.cpp calls them in order; a new command is a new file plus one line in each list.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace deepfuse::cli {

// The action a subcommand runs once parsing succeeded; returns the process exit code.
using Action = std::function<int()>;

// Each register_* adds its subcommand to `app` and stores its action into `action` when chosen.
void register_bench(CLI::App& app, Action& action);
void register_generate(CLI::App& app, Action& action);
void register_chat(CLI::App& app, Action& action);
void register_score(CLI::App& app, Action& action);
void register_inspect(CLI::App& app, Action& action);
void register_make_model(CLI::App& app, Action& action);
void register_tokenize(CLI::App& app, Action& action);
void register_tune(CLI::App& app, Action& action);
void register_serve(CLI::App& app, Action& action);
// `deepfuse bench tokenizer`, added under the bench subcommand by register_bench.
void register_bench_tokenizer(CLI::App& bench, Action& action);
// `deepfuse bench qkv`, likewise.
void register_bench_qkv(CLI::App& bench, Action& action);

}  // namespace deepfuse::cli
