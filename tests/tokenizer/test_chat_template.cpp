// Chat template rendering against jinja2's output for the fixture templates (rendered with the
// same environment transformers uses), plus the interpreter's error messages.
#include <gtest/gtest.h>

#include "deepfuse/chat_template.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tokenizer.hpp"
#include "tokenizer/fixtures.hpp"

namespace deepfuse {
namespace {

using testing::read_json_file;
using testing::tokenizer_fixture_dir;

class ChatTemplateParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateParity, RendersLikeJinja2) {
  const auto dir = tokenizer_fixture_dir(GetParam());
  const auto config = read_json_file(dir / "tokenizer_config.json");
  const auto expected = read_json_file(dir / "expected.json");
  ASSERT_FALSE(expected["chats"].empty());
  for (const auto& chat : expected["chats"]) {
    const std::string source = config[chat.value("template", "chat_template")];
    const ChatTemplate chat_template(source);
    ChatRenderOptions options;
    options.add_generation_prompt = chat["add_generation_prompt"];
    options.bos_token = config["bos_token"].is_string() ? config["bos_token"].get<std::string>() : "";
    options.eos_token = config["eos_token"].is_string() ? config["eos_token"].get<std::string>() : "";
    options.extra_context = chat["extra"];
    SCOPED_TRACE("messages: " + chat["messages"].dump());
    if (chat.contains("error")) {
      try {
        chat_template.render(chat["messages"], options);
        ADD_FAILURE() << "expected the template to raise: " << chat["error"];
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(chat["error"].get<std::string>()), std::string::npos) << e.what();
      }
    } else {
      EXPECT_EQ(chat_template.render(chat["messages"], options), chat["expected"].get<std::string>());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ChatTemplateParity, ::testing::ValuesIn(testing::tokenizer_fixture_names()));

}  // namespace
}  // namespace deepfuse
