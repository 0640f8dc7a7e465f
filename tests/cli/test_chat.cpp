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

using testing::expect_bad_input;
using testing::RunResult;
using testing::run_cli;
using testing::ScratchDir;
using testing::write_file;

constexpr int kMaxTokens = 8;

class Chat : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = scratch_.path() / "model";
    const RunResult made = run_cli(scratch_, "make-model --out " + model_.string() + " --layers 1 --seed 3");
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  std::string flags() const {
    return " --backend reference --model " + model_.string() + " --max-tokens " + std::to_string(kMaxTokens);
  }

  // `deepfuse chat` with `typed` on stdin.
  RunResult chat(const std::string& typed, const std::string& extra = "") {
    write_file(scratch_.path() / "typed.txt", typed);
    return run_cli(scratch_, "chat" + flags() + extra + " < " + (scratch_.path() / "typed.txt").string());
  }

  ScratchDir scratch_;
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
  expect_bad_input(run_cli(scratch_, "chat --backend reference < /dev/null"), {"chat", "--model DIR"});
  expect_bad_input(run_cli(scratch_, "chat --model " + dir + " --backend bogus < /dev/null"), {"--backend 'bogus'"});
  std::string config = read_text_file(model_ / "tokenizer_config.json");
  auto parsed = nlohmann::json::parse(config);
  parsed.erase("chat_template");
  write_file(model_ / "tokenizer_config.json", parsed.dump());
  expect_bad_input(run_cli(scratch_, "chat" + flags() + " < /dev/null"), {"chat", dir, "no chat_template"});
  std::filesystem::remove(model_ / "tokenizer.json");
  expect_bad_input(run_cli(scratch_, "chat" + flags() + " < /dev/null"),
                   {"chat", (model_ / "tokenizer.json").string(), "not found"});
}

}  // namespace
}  // namespace deepfuse
