// One OpenAI request in flight: its n sequences in the serving loop, their events, their text.
// The HTTP handler either waits for the whole response (complete()) or pulls stream chunks
// (next_chunks()) until done. Destroying it (the client went away, the stream ended) cancels
// whatever still runs, so a dropped connection frees its KV pages within a step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/api/openai_request.hpp"
#include "server/api/openai_response.hpp"
#include "server/api/text_output.hpp"
#include "server/batching/serving_loop.hpp"

namespace deepfuse::server {

class Generation {
 public:
  // Submits the request's sequences. `live` counts Generations alive (for a graceful shutdown).
  Generation(ServingLoop& loop, OpenAiRequest request, const ServedModel& model, std::atomic<int>& live);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Waits for every choice to end; the whole response object.
  json complete();
  // Waits up to `wait` for events; the stream chunks they make (in order). Returns true once the
  // stream is over (every choice finished; the usage chunk, if asked, is among the chunks).
  bool next_chunks(std::chrono::milliseconds wait, std::vector<json>& chunks);
  // Drops every sequence still running (the client disconnected).
  void cancel();

 private:
  struct Choice {
    SequenceKey key = 0;
    TextOutput text;
    LogprobsBuilder logprobs;
    int tokens = 0;
    int cached_tokens = 0;
    std::optional<std::string> finish;   // "stop", "length", "tool_calls", "abort"
    std::string error;
    bool role_sent = false;
    std::optional<ToolCallParser> tools;  // when the answer is parsed into tool calls
    int calls_sent = 0;
  };
  // Applies one event; appends its stream chunks when streaming.
  void apply(Choice& choice, int index, const SequenceEvent& event, std::vector<json>* chunks);
  void handle(Choice& choice, int index, const SequenceEvent& event, std::vector<json>* chunks);
  void finish_choice(Choice& choice, int index, const std::string& reason, std::vector<json>* chunks);
  // A piece of a choice's text as stream chunks: its content, then any tool calls it completed.
  void push_text(Choice& choice, int index, const std::string& piece, std::vector<json>& chunks);
  void push_calls(Choice& choice, int index, std::vector<ToolCall> calls, std::vector<json>& chunks);
  bool all_finished() const;
  Usage usage() const;
  json logprobs_json(Choice& choice, bool take);

  ServingLoop& loop_;
  OpenAiRequest request_;
  ResponseHeader header_;
  std::atomic<int>& live_;
  std::vector<Choice> choices_;

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<SequenceEvent> events_;   // from the loop's thread
  bool stream_over_ = false;
};

}  // namespace deepfuse::server
