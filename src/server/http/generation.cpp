#include "server/http/generation.hpp"

#include <algorithm>

#include "server/api_error.hpp"

namespace deepfuse::server {

Generation::Generation(ServingLoop& loop, OpenAiRequest request, const ServedModel& model, std::atomic<int>& live)
    : loop_(loop), request_(std::move(request)), header_(make_response_header(request_.endpoint, model.name)),
      live_(live) {
  ++live_;
  for (int i = 0; i < request_.n; ++i) {
    choices_.push_back({loop_.new_key(),
                        TextOutput(model.tokenizer, request_.stop_strings,
                                   request_.tools.parse ? model.tool_marker_ids : std::vector<int32_t>()),
                        LogprobsBuilder(request_.endpoint, model.tokenizer), 0, 0, std::nullopt, {}, false,
                        std::nullopt, 0});
    if (request_.tools.parse) choices_.back().tools.emplace(model.tool_format);
  }
  for (int i = 0; i < request_.n; ++i) {
    GenerationSpec spec = request_.spec;
    spec.sampling.seed += static_cast<uint64_t>(i);  // n samples of one request differ
    if (i > 0 && request_.grammar) spec.constraint = request_.grammar->start();  // each choice its own matcher
    loop_.submit(choices_[i].key, std::move(spec), [this](const SequenceEvent& event) {
      // Notified under the lock: once the destructor sees the last event, no sink touches this.
      std::lock_guard lock(mutex_);
      events_.push_back(event);
      arrived_.notify_all();
    });
  }
}

Generation::~Generation() {
  cancel();
  // The loop may still hold sinks pointing here: wait until it has ended every sequence (each
  // gets exactly one event that ends it).
  std::unique_lock lock(mutex_);
  auto running = [&] {
    return std::any_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.key != 0; });
  };
  while (running()) {
    arrived_.wait(lock, [&] { return !events_.empty(); });
    while (!events_.empty()) {
      const SequenceEvent event = events_.front();
      events_.pop_front();
      for (Choice& c : choices_)
        if (c.key == event.key && event.end != SequenceEnd::none) c.key = 0;
    }
  }
  --live_;
}

void Generation::cancel() {
  std::lock_guard lock(mutex_);
  for (const Choice& c : choices_)
    if (c.key != 0) loop_.cancel(c.key);
}

json Generation::logprobs_json(Choice& choice, bool take) {
  return request_.logprobs ? choice.logprobs.build(take) : json(nullptr);
}

void Generation::push_calls(Choice& choice, int index, std::vector<ToolCall> calls, std::vector<json>& chunks) {
  if (!request_.tools.parallel) calls.resize(std::min<size_t>(calls.size(), choice.calls_sent > 0 ? 0 : 1));
  if (calls.empty()) return;
  chunks.push_back(chunk_json(header_, index, std::nullopt, false, nullptr, std::nullopt, request_.include_usage,
                              tool_calls_json(calls, choice.calls_sent, /*delta=*/true)));
  choice.calls_sent += static_cast<int>(calls.size());
}

void Generation::push_text(Choice& choice, int index, const std::string& piece, std::vector<json>& chunks) {
  if (!choice.tools) {
    chunks.push_back(chunk_json(header_, index, piece, false, logprobs_json(choice, true), std::nullopt,
                                request_.include_usage));
    return;
  }
  ToolCallParser::Output out = choice.tools->push(piece);
  chunks.push_back(chunk_json(header_, index, out.content, false, logprobs_json(choice, true), std::nullopt,
                              request_.include_usage));
  push_calls(choice, index, std::move(out.calls), chunks);
}

void Generation::finish_choice(Choice& choice, int index, const std::string& reason, std::vector<json>* chunks) {
  if (choice.finish) return;
  choice.finish = reason;
  if (!chunks) return;
  std::string rest = reason == "stop" && choice.text.stopped() ? "" : choice.text.finish();
  if (choice.tools) {
    // What the parser still held: content, or the calls it completes.
    ToolCallParser::Output out = choice.tools->finish(rest);
    rest = out.content;
    push_calls(choice, index, std::move(out.calls), *chunks);
    if (choice.calls_sent > 0 && reason == "stop") choice.finish = "tool_calls";
  }
  const bool chat = request_.endpoint == Endpoint::chat_completions;
  chunks->push_back(chunk_json(header_, index, chat && rest.empty() ? std::nullopt : std::optional(rest), false,
                               logprobs_json(choice, true), *choice.finish, request_.include_usage));
}

void Generation::apply(Choice& choice, int index, const SequenceEvent& event, std::vector<json>* chunks) {
  handle(choice, index, event, chunks);
  if (event.end != SequenceEnd::none) choice.key = 0;  // the loop reports nothing more for it
}

void Generation::handle(Choice& choice, int index, const SequenceEvent& event, std::vector<json>* chunks) {
  if (choice.finish) return;  // ended by a stop string; this is the end of its cancelled sequence
  if (event.end == SequenceEnd::failed) {
    choice.error = event.error.empty() ? "generation failed" : event.error;
    finish_choice(choice, index, "error", nullptr);
    if (chunks)
      chunks->push_back(
          ApiError(500, "generation failed: " + choice.error, std::nullopt, std::nullopt, "server_error").body());
    return;
  }
  if (event.id >= 0) {
    if (event.cached_tokens >= 0) choice.cached_tokens = event.cached_tokens;
    ++choice.tokens;
    const size_t offset = choice.text.text().size();
    const std::string piece = choice.text.push(event.id);
    if (request_.logprobs) choice.logprobs.add(event, offset);
    // One chunk per token, even when its text is held back (part of a character, maybe the start
    // of a stop string or of a tool call): clients and benchmarks count tokens by chunks. After a
    // stop string, the text before it is the last piece.
    if (chunks && (!choice.text.stopped() || !piece.empty())) push_text(choice, index, piece, *chunks);
    if (choice.text.stopped()) {
      // The sequence is not needed any more.
      if (event.end == SequenceEnd::none) loop_.cancel(choice.key, SequenceEnd::stop_token);
      finish_choice(choice, index, "stop", chunks);
      return;
    }
  }
  switch (event.end) {
    case SequenceEnd::none: return;
    case SequenceEnd::stop_token: return finish_choice(choice, index, "stop", chunks);
    case SequenceEnd::max_tokens:
    case SequenceEnd::context_length: return finish_choice(choice, index, "length", chunks);
    default: return finish_choice(choice, index, "abort", chunks);  // cancelled: the server is shutting down
  }
}

bool Generation::all_finished() const {
  return std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.finish.has_value(); });
}

Usage Generation::usage() const {
  Usage u;
  u.prompt_tokens = static_cast<int>(request_.spec.prompt.size());
  for (const Choice& c : choices_) {
    u.completion_tokens += c.tokens;
    u.cached_tokens = std::max(u.cached_tokens, c.cached_tokens);
  }
  return u;
}

json Generation::complete() {
  std::unique_lock lock(mutex_);
  while (!all_finished()) {
    arrived_.wait(lock, [&] { return !events_.empty(); });
    while (!events_.empty()) {
      const SequenceEvent event = events_.front();
      events_.pop_front();
      for (size_t i = 0; i < choices_.size(); ++i)
        if (choices_[i].key == event.key) apply(choices_[i], static_cast<int>(i), event, nullptr);
    }
  }
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (!c.error.empty())
      throw ApiError(500, "generation failed: " + c.error, std::nullopt, std::nullopt, "server_error");
    if (*c.finish != "stop" || !c.text.stopped()) c.text.finish();
    std::string content = c.text.text(), finish = *c.finish;
    json calls = nullptr;
    if (c.tools) {
      ToolCallParser::Output out = c.tools->finish(content);
      content = out.content;
      if (!request_.tools.parallel && out.calls.size() > 1) out.calls.resize(1);
      if (!out.calls.empty()) {
        calls = tool_calls_json(out.calls, 0, /*delta=*/false);
        if (finish == "stop") finish = "tool_calls";
      }
    }
    choices.push_back(
        choice_json(request_.endpoint, static_cast<int>(i), content, logprobs_json(c, false), finish, calls));
  }
  return response_json(header_, std::move(choices), usage());
}

bool Generation::next_chunks(std::chrono::milliseconds wait, std::vector<json>& chunks) {
  std::unique_lock lock(mutex_);
  if (stream_over_) return true;
  if (request_.endpoint == Endpoint::chat_completions)
    for (size_t i = 0; i < choices_.size(); ++i)
      if (!choices_[i].role_sent) {
        choices_[i].role_sent = true;
        chunks.push_back(chunk_json(header_, static_cast<int>(i), std::string(), true,
                                    nullptr, std::nullopt,
                                    request_.include_usage));
      }
  if (events_.empty()) arrived_.wait_for(lock, wait, [&] { return !events_.empty(); });
  while (!events_.empty()) {
    const SequenceEvent event = events_.front();
    events_.pop_front();
    for (size_t i = 0; i < choices_.size(); ++i)
      if (choices_[i].key == event.key) apply(choices_[i], static_cast<int>(i), event, &chunks);
  }
  if (!all_finished()) return false;
  if (request_.include_usage) chunks.push_back(usage_chunk_json(header_, usage()));
  stream_over_ = true;
  return true;
}

}  // namespace deepfuse::server
