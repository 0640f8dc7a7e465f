// Streamed text with stop strings: a stop string split over tokens is honoured and never sent;
// text that only looks like a stop string's start is released once it is not.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "server/api/text_output.hpp"

namespace deepfuse::server {
namespace {

// Without a tokenizer a token's text is its id, space-separated: "1 2 3 ..."
TEST(TextOutput, StopsAcrossTokenBoundariesWithoutLeakingTheStopString) {
  TextOutput out(nullptr, {"3 4"});
  std::string sent;
  sent += out.push(1);
  sent += out.push(2);
  sent += out.push(3);  // "1 2 3": "3" may begin the stop string
  EXPECT_EQ(sent, "1 2 ");
  sent += out.push(4);
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(sent, "1 2 ");
  EXPECT_EQ(out.push(5), "");
  EXPECT_EQ(out.text(), "1 2 ");
}

TEST(TextOutput, ReleasesHeldTextThatTurnsOutNotToStop) {
  TextOutput out(nullptr, {"3 4"});
  std::string sent = out.push(3);
  EXPECT_EQ(sent, "");
  sent += out.push(5);
  EXPECT_EQ(sent, "3 5");
  EXPECT_FALSE(out.stopped());
  sent += out.push(3);
  sent += out.finish();  // the end: nothing is held back any more
  EXPECT_EQ(sent, "3 5 3");
}

TEST(TextOutput, WithoutStopStringsEverythingGoesOutAtOnce) {
  TextOutput out(nullptr, {});
  EXPECT_EQ(out.push(12), "12");
  EXPECT_EQ(out.push(13), " 13");
  EXPECT_EQ(out.finish(), "");
}

// With a tokenizer, special tokens are left out of the text except those kept (a tool call
// format's marker), which stand where they were generated.
TEST(TextOutput, KeepsOnlyTheKeptSpecialTokens) {
  const auto dir = std::filesystem::temp_directory_path() / ("df_text_output_" + std::to_string(::getpid()));
  write_tiny_tokenizer(dir, 300);
  const Tokenizer tokenizer = Tokenizer::from_directory(dir);
  std::filesystem::remove_all(dir);
  const int32_t eot = *tokenizer.token_to_id("<|eot_id|>"), header = *tokenizer.token_to_id("<|start_header_id|>");
  const std::vector<int32_t> a = tokenizer.encode("Hello", false), b = tokenizer.encode(" world", false);
  for (const bool keep : {false, true}) {
    TextOutput out(&tokenizer, {}, keep ? std::vector<int32_t>{header} : std::vector<int32_t>{});
    std::string sent;
    for (const int32_t id : a) sent += out.push(id);
    sent += out.push(header);
    for (const int32_t id : b) sent += out.push(id);
    sent += out.push(eot);
    sent += out.finish();
    EXPECT_EQ(sent, keep ? "Hello<|start_header_id|> world" : "Hello world");
    EXPECT_EQ(out.text(), sent);
  }
}

}  // namespace
}  // namespace deepfuse::server
