// Chat templates: renders a checkpoint's Jinja chat_template (tokenizer_config.json or
// chat_template.jinja) for a list of messages, the way transformers' apply_chat_template does
// (trim_blocks, lstrip_blocks, tojson, raise_exception, strftime_now, loop controls).
//
// The interpreter covers the Jinja subset real Llama 3.x, Qwen2.5 and Mistral templates use:
// for loops (loop.index/index0/first/last/length, `if` filters, else), if/elif/else, set
// (including namespace attributes and block form), break/continue, string/list/dict operations
// and methods, slices, and the filters and tests those templates call. A template using anything
// else fails with a deepfuse::Error naming the construct and line.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepfuse {

namespace jinja {
struct Stmt;
}

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool", ...
  std::string content;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;  // end with the assistant header, ready for generation
  std::string bos_token;
  std::string eos_token;
  // More template variables (e.g. {"tools": [...], "date_string": "..."}).
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Parses the template once; throws deepfuse::Error for syntax errors or unsupported tags.
  explicit ChatTemplate(const std::string& source);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // messages: a JSON array of message objects (role, content, and optional tool_calls etc.).
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;
  std::string render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> body_;
};

// Messages from text: a JSON array of {"role", "content"} objects, or lines of the simple form
// "role: text" (a line without a known "role:" prefix continues the previous message).
nlohmann::ordered_json parse_chat_messages(const std::string& text);

}  // namespace deepfuse
