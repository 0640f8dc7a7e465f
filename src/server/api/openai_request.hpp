// OpenAI's /v1/completions and /v1/chat/completions request bodies, parsed and checked field by
// field into what the serving loop runs. Every problem is an ApiError naming the field: malformed
// JSON or invalid UTF-8, wrong types, missing prompt or messages, an unknown model (404), values
// out of range, token ids outside the vocabulary, prompts or budgets beyond the context.
#pragma once

#include <string>
#include <vector>

#include "deepfuse/chat_template.hpp"
#include "deepfuse/tokenizer.hpp"
#include "server/api/tool_calls.hpp"
#include "server/api/tool_request.hpp"
#include "server/batching/serving_backend.hpp"
#include "server/grammar/structured_output.hpp"

namespace deepfuse::server {

enum class Endpoint { completions, chat_completions };

// What parsing needs to know about the model being served.
struct ServedModel {
  std::string name;                         // the `model` clients send
  const Tokenizer* tokenizer = nullptr;     // null: prompts are token ids, output text is ids
  const ChatTemplate* chat_template = nullptr;
  int vocab_size = 0;
  int max_context = 0;
  std::vector<int32_t> stop_ids;            // EOS and the tokenizer's end markers
  ToolCallFormat tool_format = ToolCallFormat::none;  // how the model writes tool calls (none: tools refused)
  std::vector<int32_t> tool_marker_ids;     // special tokens that open a call, kept in the text
  StructuredOutput* structured_output = nullptr;  // null: response_format and forced tool calls refused
};

// Fills the chat side of `model` from the checkpoint's tokenizer and chat template (either may be
// null): the tool call format (`tool_call_parser` "auto": the one the template renders) and the
// special tokens that open a call.
void set_chat_side(ServedModel& model, const Tokenizer* tokenizer, const ChatTemplate* chat_template,
                   const std::string& tool_call_parser = "auto");

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::completions;
  GenerationSpec spec;                      // choice i samples with seed spec.sampling.seed + i
  int n = 1;
  std::vector<std::string> stop_strings;
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  bool logprobs = false;
  ToolRequest tools;                        // chat: the tools rendered, and whether calls are parsed
  // Structured output (response_format, tool_choice required / named): each choice starts its own
  // matcher of this grammar (spec.constraint is choice 0's). Null: free text.
  std::shared_ptr<const OutputGrammar> grammar;
};

OpenAiRequest parse_openai_request(Endpoint endpoint, const std::string& body, const ServedModel& model);

}  // namespace deepfuse::server
