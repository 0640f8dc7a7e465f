// `deepfuse serve`: the OpenAI-compatible HTTP server (src/server) over the CUDA engine or the CPU
// reference decoder. It listens first (GET /health answers "loading"), loads the model, serves,
// and on SIGTERM or SIGINT stops admitting, lets running requests finish (up to
// --shutdown-timeout seconds, then cancels them), and exits 0.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/commands.hpp"
#include "cli/engine_options.hpp"
#include "deepfuse/chat_template.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"
#include "deepfuse/tokenizer.hpp"
#include "server/api/tool_calls.hpp"
#include "server/batching/engine_backend.hpp"
#include "server/batching/reference_backend.hpp"
#include "server/http/http_server.hpp"

namespace deepfuse::cli {

namespace {

namespace fs = std::filesystem;

struct ServeArgs {
  std::string model_dir;
  bool random_weights = false;
  std::string random_arch;
  std::string backend = "auto";
  std::string served_model_name;
  std::string tool_call_parser = "auto";
  EngineArgs engine;
  server::HttpOptions http;
  int max_step_tokens = 512;
  int kv_pages = 0;
  bool no_prefix_cache = false;
  int max_body_mb = 8;
  double shutdown_timeout = 30;
  std::string speculative = choice_name(kDefaultSpeculative);
};

// Every id that ends generation, as `generate` stops: the config's EOS (generation_config.json's
// when it names any) and the tokenizer's stop tokens.
std::vector<int32_t> stop_ids(const ModelConfig& config, const Tokenizer* tokenizer) {
  std::vector<int32_t> stops =
      config.generation.eos_token_ids.empty() ? config.eos_token_ids : config.generation.eos_token_ids;
  if (tokenizer)
    for (const TokenId id : tokenizer->stop_ids())
      if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  return stops;
}

// Everything the server needs of the model, kept alive for the server's whole life.
struct LoadedServe {
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::unique_ptr<server::ServingBackend> backend;
};

LoadedServe load(const ServeArgs& args) {
  LoadedServe loaded;
  DF_CHECK(args.model_dir.empty() != !args.random_weights,
           "give a model: --model DIR, or --random-weights --arch NAME (not both)");
  loaded.config = args.random_weights ? random_arch_config(args.random_arch) : load_model_config(args.model_dir);
  const ModelConfig& config = loaded.config;
  Backend backend = args.random_weights ? Backend::cuda : resolve_backend(args.backend);
  if (args.backend == "auto" && backend == Backend::cuda && !cuda_unsupported_reason(config, args.engine).empty()) {
    std::fprintf(stderr, "note: %s has no CUDA kernels; serving on the reference backend\n",
                 cuda_unsupported_reason(config, args.engine).c_str());
    backend = Backend::reference;
  }
  check_quantize_backend(args.engine, backend);
  const SpeculativeChoice speculative = speculative_choice(args.speculative);
  if (!args.random_weights && fs::exists(fs::path(args.model_dir) / "tokenizer.json")) {
    loaded.tokenizer = Tokenizer::from_directory(args.model_dir);
    if (!loaded.tokenizer->chat_template().empty()) loaded.chat_template.emplace(loaded.tokenizer->chat_template());
  }
  EngineOptions options = engine_options(args.engine);
  DF_CHECK(backend == Backend::cuda || options.tensor_parallel == 1,
           "--tp " + std::to_string(options.tensor_parallel) + " needs the cuda backend (the reference backend runs on one CPU)");
  const int max_context = options.max_context > 0 ? std::min(options.max_context, config.max_position_embeddings)
                                                  : config.max_position_embeddings;
  if (backend == Backend::reference) {
    const Checkpoint checkpoint(args.model_dir);
    auto decoder = std::make_unique<reference::Decoder>(
        config, load_reference_weights(checkpoint, config, weight_load_options(args.engine)));
    server::ReferenceBackendOptions ref;
    ref.scheduler = {options.max_batch, max_context, args.max_step_tokens};
    ref.kv_pages = args.kv_pages;
    ref.prefix_caching = !args.no_prefix_cache;
    ref.speculative = speculative;
    loaded.backend = std::make_unique<server::ReferenceBackend>(std::move(decoder), ref);
    return loaded;
  }
  options.max_context = max_context;
  options.prefill_tokens_per_step = args.max_step_tokens;
  options.prefix_caching = !args.no_prefix_cache;
  options.speculative = speculative;
  auto engine = std::make_unique<Engine>(args.random_weights
                                             ? Engine::with_random_weights(config, options, /*seed=*/0)
                                             : Engine::from_checkpoint(args.model_dir, options));
  loaded.backend = std::make_unique<server::EngineBackend>(std::move(engine));
  return loaded;
}

int run_serve(ServeArgs args) {
  // Signals are taken by sigwait below, never by a handler: block them before any thread starts,
  // so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-stream is a failed write, not the end of the server

  args.http.max_body_bytes = static_cast<size_t>(args.max_body_mb) << 20;
  server::Metrics metrics;
  server::HttpServer http(args.http, metrics);
  http.start();
  std::printf("deepfuse serve: listening on http://%s:%d\n", args.http.host.c_str(), http.bound_port());
  std::fflush(stdout);

  LoadedServe loaded = load(args);
  const std::string name = !args.served_model_name.empty() ? args.served_model_name
                           : args.random_weights          ? args.random_arch
                                                          : fs::path(args.model_dir).lexically_normal().filename().string();
  server::ServedModel model;
  model.name = name.empty() ? "model" : name;
  server::set_chat_side(model, loaded.tokenizer ? &*loaded.tokenizer : nullptr,
                        loaded.chat_template ? &*loaded.chat_template : nullptr, args.tool_call_parser);
  model.vocab_size = loaded.config.vocab_size;
  model.max_context = loaded.backend->max_context();
  model.stop_ids = stop_ids(loaded.config, model.tokenizer);
  std::optional<server::StructuredOutput> structured_output;
  if (model.tokenizer) {
    structured_output.emplace(*model.tokenizer, model.vocab_size, model.stop_ids, model.tool_marker_ids);
    model.structured_output = &*structured_output;
  }
  const std::string backend_name = loaded.backend->name();
  server::ServingLoop loop(std::move(loaded.backend), metrics);
  http.set_ready(loop, model);
  std::printf("deepfuse serve: ready: model '%s' on the %s backend, max context %d\n", model.name.c_str(),
              backend_name.c_str(), model.max_context);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::printf("deepfuse serve: %s: finishing running requests\n", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  std::fflush(stdout);
  http.begin_shutdown();
  using Clock = std::chrono::steady_clock;
  auto wait_idle = [&](double seconds) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (http.live_generations() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return http.live_generations() == 0;
  };
  if (!wait_idle(args.shutdown_timeout)) {
    std::printf("deepfuse serve: cancelling %d requests still running\n", http.live_generations());
    loop.cancel_all();
    wait_idle(10);
  }
  http.stop();
  std::printf("deepfuse serve: stopped\n");
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming)");
  auto args = std::make_shared<ServeArgs>();
  args->engine.max_batch = 16;
  args->engine.mixed_steps = true;  // prompts ride in the decode rows' pass (docs/server.md, "Mixed steps")
  command->add_option("--model", args->model_dir, "checkpoint directory (config.json + safetensors)");
  command->add_flag("--random-weights", args->random_weights, "no checkpoint: random weights on the GPU, with --arch");
  command->add_option("--arch", args->random_arch, "the architecture preset for --random-weights");
  command->add_option("--backend", args->backend, "reference | cuda | auto (default auto: cuda when a GPU is present)");
  command->add_option("--served-model-name", args->served_model_name,
                      "the model name clients send (default: the directory's name, or the --arch)");
  std::string parsers = "auto";
  for (const server::ToolCallFormatInfo& info : server::tool_call_formats()) parsers += std::string(" | ") + info.name;
  command->add_option("--tool-call-parser", args->tool_call_parser,
                      "how the model writes tool calls: " + parsers +
                          " (default auto: from the chat template; none refuses 'tools')")
      ->check([](const std::string& name) {
        if (name == "auto") return std::string();
        for (const server::ToolCallFormatInfo& info : server::tool_call_formats())
          if (name == info.name) return std::string();
        return "unknown tool call parser '" + name + "'";
      });
  command->add_option("--host", args->http.host, "address to listen on (default 127.0.0.1)");
  command->add_option("--port", args->http.port, "port (default 8000; 0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  command->add_option("--api-key", args->http.api_key, "require 'Authorization: Bearer KEY' on /v1 routes");
  command->add_option("--http-threads", args->http.threads, "connections served at once (default 128)")
      ->check(CLI::PositiveNumber);
  command->add_option("--max-body-mb", args->max_body_mb, "largest request body in MiB (default 8; larger: 413)")
      ->check(CLI::PositiveNumber);
  command->add_option("--max-step-tokens", args->max_step_tokens,
                      "prompt tokens prefilled per step over all requests (default 512); a longer prompt continues "
                      "over the next steps while the others decode")
      ->check(CLI::PositiveNumber);
  command->add_option("--kv-pages", args->kv_pages,
                      "KV pages of 16 tokens (reference backend; default max-batch x max-context)")
      ->check(CLI::PositiveNumber);
  command->add_flag("--no-prefix-cache", args->no_prefix_cache, "do not share KV pages of common prompt prefixes");
  command->add_option("--shutdown-timeout", args->shutdown_timeout,
                      "seconds running requests get to finish after SIGTERM (default 30)")
      ->check(CLI::NonNegativeNumber);
  add_engine_options(*command, args->engine);
  add_speculative_option(*command, args->speculative);
  command->callback([args, &action] { action = [args] { return run_serve(*args); }; });
}

}  // namespace deepfuse::cli
