// OpenAI's response shapes for /v1/completions and /v1/chat/completions: whole responses, stream
// chunks, usage and logprobs, field for field as OpenAI returns them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/tokenizer.hpp"
#include "server/api/openai_request.hpp"
#include "server/api/tool_calls.hpp"

namespace deepfuse::server {

using nlohmann::json;

// The fields every response and chunk of one request repeats.
struct ResponseHeader {
  Endpoint endpoint = Endpoint::completions;
  std::string id;          // cmpl-... or chatcmpl-...
  int64_t created = 0;     // Unix seconds
  std::string model;
};

ResponseHeader make_response_header(Endpoint endpoint, const std::string& model);

// Serialized for the wire: invalid UTF-8 (a token that is part of a character, in logprobs) is
// replaced rather than thrown on.
std::string to_wire(const json& value);

// The logprobs of one choice, built token by token in the endpoint's format.
class LogprobsBuilder {
 public:
  LogprobsBuilder(Endpoint endpoint, const Tokenizer* tokenizer) : endpoint_(endpoint), tokenizer_(tokenizer) {}
  // One generated token, with the text offset of its text in the choice's output.
  void add(const SequenceEvent& event, size_t text_offset);
  // The `logprobs` object (all tokens added so far), then cleared when `take` (for stream chunks).
  json build(bool take);

 private:
  std::string token_text(int32_t id) const;
  Endpoint endpoint_;
  const Tokenizer* tokenizer_;
  json tokens_ = json::array(), token_logprobs_ = json::array(), top_ = json::array(), offsets_ = json::array();
  json content_ = json::array();
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};
json usage_json(const Usage& usage);

// Tool calls as a message lists them (`delta` false), or as a stream delta does: each with its
// `index` in the choice's calls, counted from `first`.
json tool_calls_json(const std::vector<ToolCall>& calls, int first, bool delta);

// One choice of a whole (non-streamed) response. Chat: with `tool_calls` (not null), an empty
// text is content null, as OpenAI sends it.
json choice_json(Endpoint endpoint, int index, const std::string& text, const json& logprobs,
                 const std::string& finish_reason, const json& tool_calls = nullptr);
json response_json(const ResponseHeader& header, json choices, const Usage& usage);

// A stream chunk for one choice: `text` (chat: the delta's content; `role` adds the assistant
// role), its logprobs (null when not asked) and the finish reason (null while running); chat's
// delta carries `tool_calls` when not null.
json chunk_json(const ResponseHeader& header, int index, const std::optional<std::string>& text, bool role,
                const json& logprobs, const std::optional<std::string>& finish_reason, bool usage_field,
                const json& tool_calls = nullptr);
// The last chunk when stream_options.include_usage: no choices, the usage.
json usage_chunk_json(const ResponseHeader& header, const Usage& usage);

}  // namespace deepfuse::server
