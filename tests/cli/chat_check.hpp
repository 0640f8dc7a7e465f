// The chat transcript check shared by the CPU and the CUDA backend's CLI tests: `deepfuse chat`
// driven through stdin (two turns, /reset, the first turn again, /exit) must print, reply for
// reply, what `generate --chat` prints for the same conversation, so the history reached the
// second turn's prompt and /reset cleared it.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.hpp"

namespace deepfuse::testing {

// A reply as chat shows it (generate's text for the same messages; chat's note when the reply
// ran into --max-tokens rather than a stop token; a blank line) and the text the conversation
// keeps of it. `flags`: the model, backend and --max-tokens both commands take.
struct ChatReply {
  std::string printed, kept;
};

inline ChatReply expected_chat_reply(const ScratchDir& dir, const std::string& flags, int max_tokens,
                                     const std::vector<nlohmann::json>& messages) {
  write_file(dir.path() / "messages.json", nlohmann::json(messages).dump());
  const std::string messages_file = (dir.path() / "messages.json").string();
  const RunResult generated = run_cli(dir, "generate" + flags + " --chat - < " + messages_file);
  EXPECT_EQ(generated.exit_code, 0) << generated.err;
  const std::string all_tokens = "generated tokens: " + std::to_string(max_tokens) + ",";
  const bool cut = stats_line(generated).find(all_tokens) != std::string::npos;
  const std::string text = generated_output(generated);
  return {text + (cut ? " [reply cut at " + std::to_string(max_tokens) + " tokens]" : "") + "\n\n", text};
}

inline nlohmann::json chat_message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// `flags` must include --max-tokens `max_tokens`.
inline void expect_chat_follows_generate(const ScratchDir& dir, const std::string& flags, int max_tokens) {
  const ChatReply reply1 = expected_chat_reply(dir, flags, max_tokens, {chat_message("user", "Hi")});
  const ChatReply reply2 = expected_chat_reply(
      dir, flags, max_tokens,
      {chat_message("user", "Hi"), chat_message("assistant", reply1.kept), chat_message("user", "How are you?")});
  write_file(dir.path() / "typed.txt", "Hi\nHow are you?\n/reset\nHi\n/exit\nnever read\n");
  const RunResult chatted = run_cli(dir, "chat" + flags + " < " + (dir.path() / "typed.txt").string());
  ASSERT_EQ(chatted.exit_code, 0) << chatted.err;
  EXPECT_EQ(chatted.out,
            "> " + reply1.printed + "> " + reply2.printed + "> (conversation cleared)\n> " + reply1.printed + "> ");
}

}  // namespace deepfuse::testing
