// `deepfuse chat` on the reference backend, driven through stdin as a script would type it: the
// turns follow `generate --chat` on the same conversation (chat_check.hpp), the system prompt
// survives /reset, the commands print what they say, and bad inputs are one-line errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/chat_check.hpp"
#include "cli/cli_test_util.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::RunResult;

constexpr int kMaxTokens = 8;

class Chat : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = scratch_.path() / "model";
    const RunResult made = testing::run_cli(scratch_, "make-model --out " + model_.string() + " --layers 1 --seed 3");
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  std::string flags() const {
    return " --backend reference --model " + model_.string() + " --max-tokens " + std::to_string(kMaxTokens);
  }

  // `deepfuse chat` with `typed` on stdin.
  RunResult chat(const std::string& typed, const std::string& extra = "") {
    testing::write_file(scratch_.path() / "typed.txt", typed);
    return testing::run_cli(scratch_, "chat" + flags() + extra + " < " + (scratch_.path() / "typed.txt").string());
  }

  testing::ScratchDir scratch_;
  std::filesystem::path model_;
};

TEST_F(Chat, TwoTurnsResetAndATurnAgainMatchGenerateOnTheSameConversation) {
  testing::expect_chat_follows_generate(scratch_, flags(), kMaxTokens);
  const RunResult chatted = chat("/exit\n");
  EXPECT_NE(chatted.err.find("deepfuse chat: " + model_.string() + " on the reference backend"), std::string::npos)
      << chatted.err;
}

TEST_F(Chat, SystemPromptComesFirstAndSurvivesReset) {
  const std::string reply = testing::expected_chat_reply(scratch_, flags(), kMaxTokens,
                                                         {testing::chat_message("system", "Be brief."),
                                                          testing::chat_message("user", "Hi")})
                                .printed;
  const RunResult chatted = chat("Hi\n/reset\nHi\n", " --system 'Be brief.'");
  ASSERT_EQ(chatted.exit_code, 0) << chatted.err;
  // The input ends without /exit: the end of stdin ends the chat, with a newline after the prompt.
  EXPECT_EQ(chatted.out, "> " + reply + "> (conversation cleared)\n> " + reply + "> \n");
}

TEST_F(Chat, HelpUnknownCommandsAndBlankLinesGenerateNothing) {
  const RunResult chatted = chat("/help\n\n   \n/bogus\n/quit\n");
  ASSERT_EQ(chatted.exit_code, 0) << chatted.err;
  EXPECT_EQ(chatted.out.rfind("> ", 0), 0u);
  for (const std::string command : {"/reset", "/help", "/exit", "Ctrl-C", "unknown command /bogus; /help lists"})
    EXPECT_NE(chatted.out.find(command), std::string::npos) << command << " not in " << chatted.out;
  EXPECT_EQ(chatted.out.find("[reply"), std::string::npos) << chatted.out;
}

TEST_F(Chat, BadInputsAreOneLineErrors) {
  const std::string dir = model_.string();
  const auto chat_fails = [&](const std::string& args, std::initializer_list<std::string> parts) {
    testing::expect_bad_input(testing::run_cli(scratch_, "chat " + args + " < /dev/null"), parts);
  };
  chat_fails("--backend reference", {"chat", "--model DIR"});
  chat_fails("--model " + dir + " --backend bogus", {"--backend 'bogus'"});
  auto config = nlohmann::json::parse(read_text_file(model_ / "tokenizer_config.json"));
  config.erase("chat_template");
  testing::write_file(model_ / "tokenizer_config.json", config.dump());
  chat_fails(flags(), {"chat", dir, "no chat_template"});
  std::filesystem::remove(model_ / "tokenizer.json");
  chat_fails(flags(), {"chat", (model_ / "tokenizer.json").string(), "not found"});
}

}  // namespace
}  // namespace deepfuse
