// Tool calling: the formats models write their calls in, and the parser that turns a choice's
// streamed text into content and `tool_calls`.
//
// The format is the checkpoint's, found from its chat template (the text the template renders a
// call as): Llama 3.1's JSON (`{"name": ..., "parameters": {...}}` as the whole answer, possibly
// after `<|python_tag|>`), Hermes / Qwen2.5 tags (`<tool_call>{"name": ..., "arguments": {...}}
// </tool_call>`, any number, after optional content) and Mistral's `[TOOL_CALLS] [{"name": ...,
// "arguments": {...}}, ...]`. The parser sees text as it streams: content before a call's marker
// goes out at once (holding back a tail that could start the marker), each call goes out whole
// once its text is complete (its arguments in one piece, not token by token), and text that
// turns out not to be a well-formed call is content after all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepfuse/tokenizer.hpp"

namespace deepfuse::server {

enum class ToolCallFormat { none, llama3_json, hermes, mistral };

struct ToolCallFormatInfo {
  ToolCallFormat format;
  const char* name;         // as --tool-call-parser takes it
  const char* marker;       // the text that opens a call ("" for llama3_json: a leading '{')
  const char* detect;       // a chat template containing this renders calls in this format
  // One call as the grammar of tool_choice `required` / a named function writes it (the parser
  // reads it back): call_open, the function's name, `", "` + arguments_key + `": "`, the
  // arguments object, call_close.
  const char* call_open;
  const char* arguments_key;
  const char* call_close;
};
// The formats, in the order detection tries them.
const std::vector<ToolCallFormatInfo>& tool_call_formats();
const ToolCallFormatInfo& tool_call_format_info(ToolCallFormat format);
// The format a chat template renders tool calls in; none when it renders no tools.
ToolCallFormat detect_tool_call_format(const std::string& chat_template_source);
// The format of a name in the table (throws deepfuse::Error for another).
ToolCallFormat tool_call_format_named(const std::string& name);
// The special tokens of `tokenizer` that open a call in `format`: the text output keeps them
// (special tokens are otherwise left out of it).
std::vector<int32_t> tool_call_marker_ids(ToolCallFormat format, const Tokenizer& tokenizer);

struct ToolCall {
  std::string id;           // "call_..." (Mistral's templates need 9 alphanumerics: that form there)
  std::string name;
  std::string arguments;    // a JSON object, serialized
};

// A fresh call id in the form the format's templates accept.
std::string new_tool_call_id(ToolCallFormat format);

// One choice's text, pushed piece by piece as it is generated.
class ToolCallParser {
 public:
  struct Output {
    std::string content;            // text to send as content now
    std::vector<ToolCall> calls;    // calls completed by this piece
  };
  explicit ToolCallParser(ToolCallFormat format) : format_(format) {}
  Output push(const std::string& text);
  // The end of the text, after its last piece `last`: a call still open is parsed if it is
  // complete, else it is content.
  Output finish(const std::string& last = "");
  int calls() const { return calls_; }

 private:
  // Moves what of pending_ can be decided into `out`; `at_end` decides everything.
  void advance(Output& out, bool at_end);
  // Where the Hermes call in pending_ ends (`end`) and the text after its closing tag starts
  // (`resume`); npos while undecided.
  void hermes_call_end(bool at_end, size_t& end, size_t& resume) const;
  // Calls in `text` (the text after the marker up to where the calls end); false if malformed.
  bool parse_calls(const std::string& text, std::vector<ToolCall>& calls) const;

  ToolCallFormat format_;
  std::string pending_;    // undecided text
  bool in_call_ = false;   // pending_ is a call's text, after its marker
  std::string opened_with_;  // the marker that opened the call (content again if the call is malformed)
  bool plain_ = false;     // llama3_json: the answer did not start with a call
  int calls_ = 0;
};

}  // namespace deepfuse::server
