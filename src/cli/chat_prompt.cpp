#include "cli/chat_prompt.hpp"

#include "deepfuse/chat_template.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::cli {

std::string render_chat(const Tokenizer& tokenizer, const std::string& messages, bool add_generation_prompt,
                        const std::string& model_dir) {
  DF_CHECK(!tokenizer.chat_template().empty(), "--chat: " + model_dir + " has no chat_template");
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.bos_token = tokenizer.bos_token();
  options.eos_token = tokenizer.eos_token();
  return ChatTemplate(tokenizer.chat_template()).render(parse_chat_messages(messages), options);
}

}  // namespace deepfuse::cli
