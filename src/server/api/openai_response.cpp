#include "server/api/openai_response.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>

namespace deepfuse::server {

ResponseHeader make_response_header(Endpoint endpoint, const std::string& model) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t process_salt = std::random_device{}();
  char id[48];
  std::snprintf(id, sizeof id, "%s-%012llx%06llx", endpoint == Endpoint::chat_completions ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(process_salt & 0xffffffffffffull),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {endpoint, id, std::chrono::duration_cast<std::chrono::seconds>(now).count(), model};
}

std::string to_wire(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string LogprobsBuilder::token_text(int32_t id) const {
  return tokenizer_ ? tokenizer_->decode({id}) : std::to_string(id);
}

void LogprobsBuilder::add(const SequenceEvent& event, size_t text_offset) {
  if (endpoint_ == Endpoint::completions) {
    json top = json::object();
    for (const TokenLogprob& t : event.top) top[token_text(t.id)] = t.logprob;
    tokens_.push_back(token_text(event.id));
    token_logprobs_.push_back(event.logprob);
    top_.push_back(top);
    offsets_.push_back(text_offset);
    return;
  }
  auto entry = [&](int32_t id, float logprob) {
    const std::string text = token_text(id);
    return json{{"token", text}, {"logprob", logprob}, {"bytes", std::vector<unsigned char>(text.begin(), text.end())}};
  };
  json item = entry(event.id, event.logprob);
  item["top_logprobs"] = json::array();
  for (const TokenLogprob& t : event.top) item["top_logprobs"].push_back(entry(t.id, t.logprob));
  content_.push_back(item);
}

json LogprobsBuilder::build(bool take) {
  json out = endpoint_ == Endpoint::completions
                 ? json{{"tokens", tokens_}, {"token_logprobs", token_logprobs_}, {"top_logprobs", top_},
                        {"text_offset", offsets_}}
                 : json{{"content", content_}};
  if (take) {
    tokens_ = token_logprobs_ = top_ = offsets_ = content_ = json::array();
  }
  return out;
}

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

json tool_calls_json(const std::vector<ToolCall>& calls, int first, bool delta) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {{"id", calls[i].id},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (delta) call["index"] = first + static_cast<int>(i);
    out.push_back(std::move(call));
  }
  return out;
}

json choice_json(Endpoint endpoint, int index, const std::string& text, const json& logprobs,
                 const std::string& finish_reason, const json& tool_calls) {
  if (endpoint == Endpoint::completions)
    return {{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
  json message = {{"role", "assistant"}, {"content", text}};
  if (!tool_calls.is_null()) {
    if (text.empty()) message["content"] = nullptr;
    message["tool_calls"] = tool_calls;
  }
  return {{"index", index}, {"message", std::move(message)}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
}

json response_json(const ResponseHeader& header, json choices, const Usage& usage) {
  const bool chat = header.endpoint == Endpoint::chat_completions;
  return {{"id", header.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", header.created},
          {"model", header.model},
          {"choices", std::move(choices)},
          {"usage", usage_json(usage)}};
}

json chunk_json(const ResponseHeader& header, int index, const std::optional<std::string>& text, bool role,
                const json& logprobs, const std::optional<std::string>& finish_reason, bool usage_field,
                const json& tool_calls) {
  const bool chat = header.endpoint == Endpoint::chat_completions;
  json choice = {{"index", index}};
  if (chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (text) delta["content"] = *text;
    if (!tool_calls.is_null()) delta["tool_calls"] = tool_calls;
    choice["delta"] = delta;
  } else {
    choice["text"] = text.value_or("");
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason ? json(*finish_reason) : json(nullptr);
  json chunk = {{"id", header.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", header.created},
                {"model", header.model},
                {"choices", json::array({choice})}};
  if (usage_field) chunk["usage"] = nullptr;
  return chunk;
}

json usage_chunk_json(const ResponseHeader& header, const Usage& usage) {
  const bool chat = header.endpoint == Endpoint::chat_completions;
  return {{"id", header.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", header.created},
          {"model", header.model},
          {"choices", json::array()},
          {"usage", usage_json(usage)}};
}

}  // namespace deepfuse::server
