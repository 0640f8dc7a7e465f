// A stand-in for `deepfuse serve` in the tool call tests: the real HTTP server, request parsing,
// serving loop and response code, over a backend whose "model" answers every chat with a script
// the prompt carries: the text between the last "SCRIPT:" and the ":END" after it, tokenized,
// then the end-of-sequence token. A random tiny model never writes a well-formed tool
// call; this one writes exactly the call the test asks for, so the parsers, the streamed deltas
// and the `openai` client's assembly of them are tested end to end.
//
//   scripted_server --model DIR [--port 0]   (DIR: tokenizer.json + tokenizer_config.json)
#include <pthread.h>
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <string>

#include "deepfuse/chat_template.hpp"
#include "deepfuse/tokenizer.hpp"
#include "server/batching/serving_backend.hpp"
#include "server/http/http_server.hpp"

namespace deepfuse::server {
namespace {

class ScriptedBackend : public ServingBackend {
 public:
  explicit ScriptedBackend(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  std::string name() const override { return "scripted"; }
  int max_context() const override { return 1 << 16; }
  int vocab_size() const override { return static_cast<int>(tokenizer_.vocab_size()); }
  void check(const GenerationSpec&) const override {}

  void add(SequenceKey key, GenerationSpec spec) override {
    const std::string prompt = tokenizer_.decode(spec.prompt);
    const size_t at = prompt.rfind("SCRIPT:");
    std::string script = at == std::string::npos ? "no script" : prompt.substr(at + 7);
    script = script.substr(0, script.find(":END"));
    Running& r = running_[key];
    for (const TokenId id : tokenizer_.encode(script, /*add_special_tokens=*/false)) r.ids.push_back(id);
    r.stop = spec.stop_ids.empty() ? -1 : spec.stop_ids.front();
    r.budget = spec.max_new_tokens;
  }
  void cancel(SequenceKey key) override { running_.erase(key); }
  bool has_work() const override { return !running_.empty(); }

  std::vector<SequenceEvent> step() override {
    std::vector<SequenceEvent> events;
    for (auto it = running_.begin(); it != running_.end();) {
      Running& r = it->second;
      SequenceEvent event;
      event.key = it->first;
      if (r.generated == 0) event.cached_tokens = 0;
      event.id = r.ids.empty() ? r.stop : r.ids.front();
      if (!r.ids.empty()) r.ids.pop_front();
      ++r.generated;
      if (event.id == r.stop) event.end = SequenceEnd::stop_token;
      else if (r.generated >= r.budget) event.end = SequenceEnd::max_tokens;
      events.push_back(event);
      it = event.end == SequenceEnd::none ? std::next(it) : running_.erase(it);
    }
    return events;
  }
  BackendGauges gauges() const override {
    BackendGauges g;
    g.running = static_cast<int>(running_.size());
    return g;
  }

 private:
  struct Running {
    std::deque<TokenId> ids;
    TokenId stop = -1;
    int budget = 0, generated = 0;
  };
  const Tokenizer& tokenizer_;
  std::map<SequenceKey, Running> running_;
};

int run(int argc, char** argv) {
  std::string model_dir;
  HttpOptions options;
  options.port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_dir = argv[i + 1];
    else if (flag == "--port") options.port = std::stoi(argv[i + 1]);
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "usage: scripted_server --model DIR [--port N]\n");
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const Tokenizer tokenizer = Tokenizer::from_directory(model_dir);
  const ChatTemplate chat_template(tokenizer.chat_template());
  Metrics metrics;
  HttpServer http(options, metrics);
  http.start();
  ServedModel model;
  model.name = "scripted";
  set_chat_side(model, &tokenizer, &chat_template);
  model.vocab_size = static_cast<int>(tokenizer.vocab_size());
  model.max_context = 1 << 16;
  model.stop_ids = tokenizer.stop_ids();
  ServingLoop loop(std::make_unique<ScriptedBackend>(tokenizer), metrics);
  http.set_ready(loop, model);
  std::printf("scripted_server: listening on http://127.0.0.1:%d (tool calls: %s)\n", http.bound_port(),
              tool_call_format_info(model.tool_format).name);
  std::fflush(stdout);
  int taken = 0;
  sigwait(&signals, &taken);
  http.stop();
  return 0;
}

}  // namespace
}  // namespace deepfuse::server

int main(int argc, char** argv) { return deepfuse::server::run(argc, argv); }
