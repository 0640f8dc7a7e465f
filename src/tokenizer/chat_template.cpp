#include "deepfuse/chat_template.hpp"

#include "deepfuse/error.hpp"
#include "tokenizer/jinja/evaluator.hpp"
#include "tokenizer/jinja/lexer.hpp"
#include "tokenizer/jinja/parser.hpp"

namespace deepfuse {

ChatTemplate::ChatTemplate(const std::string& source)
    : body_(std::make_shared<const jinja::Body>(jinja::parse_template(jinja::lex_template(source)))) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const {
  DF_CHECK(messages.is_array(), "chat messages must be a JSON array of {\"role\", \"content\"} objects");
  jinja::ValueDict context;
  context.set("messages", jinja::Value::from_json(messages));
  context.set("add_generation_prompt", jinja::Value(options.add_generation_prompt));
  context.set("bos_token", jinja::Value(options.bos_token));
  context.set("eos_token", jinja::Value(options.eos_token));
  DF_CHECK(options.extra_context.is_object(), "extra chat template context must be a JSON object");
  for (const auto& [name, value] : options.extra_context.items()) context.set(name, jinja::Value::from_json(value));
  return jinja::Evaluator(context).render(*body_);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages) array.push_back({{"role", message.role}, {"content", message.content}});
  return render(array, options);
}

nlohmann::ordered_json parse_chat_messages(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::ordered_json messages;
    try {
      messages = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(std::string("chat messages: invalid JSON: ") + e.what());
    }
    for (const auto& message : messages)
      DF_CHECK(message.is_object() && message.contains("role"), "chat messages: each message needs a \"role\"");
    return messages;
  }
  static const char* const roles[] = {"system", "user", "assistant", "tool"};
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    bool opened = false;
    for (const char* role : roles) {
      const std::string prefix = std::string(role) + ":";
      if (line.rfind(prefix, 0) == 0) {
        std::string content = line.substr(prefix.size());
        if (!content.empty() && content[0] == ' ') content.erase(0, 1);
        messages.push_back({{"role", role}, {"content", content}});
        opened = true;
        break;
      }
    }
    if (!opened && !messages.empty()) {
      messages.back()["content"] = messages.back()["content"].get<std::string>() + "\n" + line;
    } else if (!opened && line.find_first_not_of(" \t\r") != std::string::npos) {
      throw Error("chat messages: line '" + line + "' does not start with a role (system:, user:, assistant:, tool:)");
    }
    start = end + 1;
  }
  // Trailing newlines of the input are not part of the last message.
  if (!messages.empty()) {
    std::string content = messages.back()["content"].get<std::string>();
    while (!content.empty() && (content.back() == '\n' || content.back() == '\r')) content.pop_back();
    messages.back()["content"] = content;
  }
  DF_CHECK(!messages.empty(), "chat messages: no message given (use 'user: text' lines or a JSON array)");
  return messages;
}

}  // namespace deepfuse
