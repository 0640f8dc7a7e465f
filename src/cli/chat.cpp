// `deepfuse chat`: an interactive conversation with a checkpoint in the terminal. Each turn renders
// the whole conversation through the checkpoint's chat template and streams the reply as it is
// sampled, on the reference backend or the CUDA engine. /reset forgets the conversation, /help
// lists the commands, /exit (or Ctrl-D) ends; Ctrl-C interrupts a reply (chat_input.hpp).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/chat_input.hpp"
#include "cli/commands.hpp"
#include "cli/generation.hpp"
#include "cli/model_session.hpp"
#include "deepfuse/chat_template.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::cli {

namespace {

struct ChatArgs {
  ModelArgs model;
  SamplingArgs sampling;
  int max_tokens = 512;
  std::string system;
  std::string speculative = choice_name(kDefaultSpeculative);
};

constexpr const char* kHelp =
    "  /reset  forget the conversation (the --system prompt stays)\n"
    "  /help   this list\n"
    "  /exit   end the chat (also Ctrl-D, or Ctrl-C twice at the prompt)\n"
    "  Ctrl-C  while a reply streams: stop it there (the part shown stays in the conversation)\n";

// The conversation and how it becomes prompt ids.
class Conversation {
 public:
  Conversation(const Tokenizer& tokenizer, std::string system)
      : tokenizer_(tokenizer), template_(tokenizer.chat_template()), system_(std::move(system)) {
    reset();
  }

  void reset() {
    messages_ = nlohmann::ordered_json::array();
    if (!system_.empty()) add("system", system_);
  }

  void add(const std::string& role, const std::string& content) {
    messages_.push_back({{"role", role}, {"content", content}});
  }

  // Drops the newest message (a user message whose prompt cannot fit).
  void drop_newest() { messages_.erase(messages_.end() - 1); }

  // The prompt ids ending with the assistant's header. Drops the oldest messages after the system
  // prompt while the prompt leaves fewer than `room` tokens of `context` for the reply; returns no
  // ids when even the newest message alone does not fit.
  std::vector<int32_t> prompt(int context, int room) {
    const size_t first = system_.empty() ? 0 : 1;
    int dropped = 0;
    for (;;) {
      const std::vector<int32_t> ids = render();
      if (static_cast<int>(ids.size()) + room <= context) {
        if (dropped > 0)
          std::fprintf(stderr, "(the conversation outgrew the %d-token context: left out its %d oldest message%s)\n",
                       context, dropped, dropped == 1 ? "" : "s");
        return ids;
      }
      if (messages_.size() <= first + 1) return {};
      messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(first));
      ++dropped;
    }
  }

 private:
  std::vector<int32_t> render() const {
    ChatRenderOptions options;
    options.add_generation_prompt = true;
    options.bos_token = tokenizer_.bos_token();
    options.eos_token = tokenizer_.eos_token();
    const std::vector<TokenId> ids = tokenizer_.encode_rendered_chat(template_.render(messages_, options));
    return {ids.begin(), ids.end()};
  }

  const Tokenizer& tokenizer_;
  ChatTemplate template_;
  std::string system_;
  nlohmann::ordered_json messages_;
};

// The checkpoint, with the tokenizer and chat template a conversation needs, checked before the
// weights load.
LoadedModel open_chat_model(const ModelArgs& args) {
  DF_CHECK(!args.model_dir.empty(), "chat: give a checkpoint directory with --model DIR");
  LoadedModel model = resolve_model(args);
  const std::filesystem::path dir(args.model_dir);
  DF_CHECK(std::filesystem::exists(dir / "tokenizer.json"),
           "chat: " + (dir / "tokenizer.json").string() + " not found; a chat needs the model's tokenizer");
  model.tokenizer = Tokenizer::from_directory(dir);
  DF_CHECK(!model.tokenizer->chat_template().empty(),
           "chat: " + args.model_dir + " has no chat_template (tokenizer_config.json or chat_template.jinja)");
  print_backend_fallback(model);
  return model;
}

// One reply streamed to stdout; returns its text (what was shown, when interrupted).
std::string reply(LoadedModel& model, const std::vector<int32_t>& prompt, const SamplingParams& sampling, int budget,
                  const std::vector<int32_t>& stops, ChatInput& input, Speculation& speculation) {
  TokenPrinter printer(model.tokenizer);
  input.arm();
  bool ended_by_stop = false;
  const GenerationResult result = generate_tokens(
      model, prompt, sampling, budget, stops,
      [&](int32_t id) {
        if (input.interrupted()) return false;
        printer.print(id);
        ended_by_stop = std::find(stops.begin(), stops.end(), id) != stops.end();
        return true;
      },
      &speculation);
  printer.finish();
  if (result.stopped) std::printf(" [interrupted]");
  else if (!ended_by_stop) std::printf(" [reply cut at %d tokens]", result.generated);
  std::printf("\n\n");
  std::fflush(stdout);
  return printer.text();
}

int run_chat(const ChatArgs& args) {
  LoadedModel model = open_chat_model(args.model);
  SamplingParams sampling = backend_sampling(args.sampling, model);
  const std::vector<int32_t> stops = stop_ids(args.sampling, model);
  Speculation speculation;  // suffix: drafts from earlier replies too
  speculation.choice = speculative_choice(args.speculative);
  Conversation conversation(*model.tokenizer, args.system);
  ModelArgs model_args = args.model;
  model_args.engine.speculative = speculation.choice;  // the CUDA engine keeps its own suffix cache
  load_weights(model_args, model);
  // A reply gets at least a quarter of the context, however long the conversation has grown.
  const int room = std::min(args.max_tokens, model.max_context / 4);

  ChatInput input;
  std::fprintf(stderr, "deepfuse chat: %s on the %s backend. /help lists the commands, /exit or Ctrl-D ends.\n",
               args.model.model_dir.c_str(), model.backend == Backend::cuda ? "cuda" : "reference");
  for (uint64_t turn = 0;; ++turn) {
    const std::optional<std::string> line = input.read_line("> ");
    if (!line || *line == "/exit" || *line == "/quit") break;
    if (line->find_first_not_of(" \t\r") == std::string::npos) continue;
    if (*line == "/help") {
      std::fputs(kHelp, stdout);
      continue;
    }
    if (*line == "/reset") {
      conversation.reset();
      std::printf("(conversation cleared)\n");
      continue;
    }
    if ((*line)[0] == '/') {
      std::printf("unknown command %s; /help lists the commands\n", line->c_str());
      continue;
    }
    conversation.add("user", *line);
    const std::vector<int32_t> prompt = conversation.prompt(model.max_context, room);
    if (prompt.empty()) {
      conversation.drop_newest();
      std::printf("(that message does not fit in the %d-token context with room for a reply; it was left out)\n",
                  model.max_context);
      continue;
    }
    sampling.seed = args.sampling.seed + turn;  // each turn draws anew when sampling
    const int budget = std::min<int>(args.max_tokens, model.max_context - static_cast<int>(prompt.size()));
    conversation.add("assistant", reply(model, prompt, sampling, budget, stops, input, speculation));
  }
  return 0;
}

}  // namespace

void register_chat(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand("chat", "Chat with a checkpoint in the terminal (its chat template, streamed "
                                             "replies, history; /reset, /help, /exit; Ctrl-C stops a reply)");
  auto args = std::make_shared<ChatArgs>();
  add_checkpoint_options(*command, args->model);
  command->add_option("--system", args->system, "system prompt, the conversation's first message");
  command->add_option("--max-tokens", args->max_tokens, "most tokens per reply (default 512)")
      ->check(CLI::PositiveNumber);
  add_sampling_options(*command, args->sampling);
  add_speculative_option(*command, args->speculative);
  command->callback([args, &action] { action = [args] { return run_chat(*args); }; });
}

}  // namespace deepfuse::cli
