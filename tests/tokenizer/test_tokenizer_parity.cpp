// deepfuse's tokenizer against ids and decodes recorded from Hugging Face tokenizers.
#include <gtest/gtest.h>

#include "deepfuse/tokenizer.hpp"
#include "tokenizer/fixtures.hpp"
#include "tokenizer/unicode.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::read_json_file;
using testing::tokenizer_fixture_dir;

class TokenizerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerParity, IdsMatchHuggingFaceWithAndWithoutSpecialTokens) {
  const Tokenizer tokenizer = Tokenizer::from_directory(tokenizer_fixture_dir(GetParam()));
  const auto expected = read_json_file(tokenizer_fixture_dir(GetParam()) / "expected.json");
  ASSERT_GT(expected["cases"].size(), 25u);
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tokenizer.encode(text, true), c["ids"].get<std::vector<TokenId>>()) << "text: " << text;
    EXPECT_EQ(tokenizer.encode(text, false), c["ids_no_special"].get<std::vector<TokenId>>()) << "text: " << text;
  }
}

TEST_P(TokenizerParity, DecodeMatchesHuggingFace) {
  const Tokenizer tokenizer = Tokenizer::from_directory(tokenizer_fixture_dir(GetParam()));
  const auto expected = read_json_file(tokenizer_fixture_dir(GetParam()) / "expected.json");
  for (const auto& c : expected["cases"]) {
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(tokenizer.decode(ids, false), c["decoded"].get<std::string>()) << "text: " << c["text"];
    EXPECT_EQ(tokenizer.decode(ids, true), c["decoded_skip_special"].get<std::string>()) << "text: " << c["text"];
  }
}

// Text the vocab covers fully comes back unchanged (HF's decode agrees; checked above).
TEST_P(TokenizerParity, PlainTextRoundTrips) {
  const Tokenizer tokenizer = Tokenizer::from_directory(tokenizer_fixture_dir(GetParam()));
  for (const std::string text : {"Hello world", "The quick brown fox, 2024!", "tabs\tand\nnewlines\n\n"}) {
    const std::string decoded = tokenizer.decode(tokenizer.encode(text, false));
    EXPECT_EQ(decoded, text);
  }
}

TEST_P(TokenizerParity, StreamedPiecesConcatenateToTheFullDecode) {
  const Tokenizer tokenizer = Tokenizer::from_directory(tokenizer_fixture_dir(GetParam()));
  const auto expected = read_json_file(tokenizer_fixture_dir(GetParam()) / "expected.json");
  for (const bool skip_special : {false, true}) {
    for (const auto& c : expected["cases"]) {
      const auto ids = c["ids"].get<std::vector<TokenId>>();
      StreamDecoder stream(tokenizer, skip_special);
      std::string streamed;
      for (const TokenId id : ids) {
        const std::string piece = stream.push(id);
        // No piece ends in the middle of a UTF-8 character: each one is valid on its own.
        EXPECT_EQ(tokenizer::find_invalid_utf8(piece), std::string::npos) << "text: " << c["text"];
        streamed += piece;
      }
      streamed += stream.flush();
      EXPECT_EQ(streamed, tokenizer.decode(ids, skip_special)) << "text: " << c["text"];
    }
  }
}

// Random ids decode to invalid UTF-8 all the time; for byte-level tokenizers the streamed pieces
// still concatenate to exactly the full (lossy) decode.
TEST(StreamDecoder, RandomByteLevelIdsConcatenateToTheFullDecode) {
  const Tokenizer tokenizer = Tokenizer::from_directory(tokenizer_fixture_dir("llama3_bytelevel"));
  auto rng = testing::make_rng(4);
  std::uniform_int_distribution<TokenId> pick(0, static_cast<TokenId>(tokenizer.vocab_size()) - 1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<TokenId> ids(1 + trial % 40);
    for (TokenId& id : ids) id = pick(rng);
    StreamDecoder stream(tokenizer);
    std::string streamed;
    for (const TokenId id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    ASSERT_EQ(streamed, tokenizer.decode(ids)) << "trial " << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerParity, ::testing::ValuesIn(testing::tokenizer_fixture_names()));

}  // namespace
}  // namespace deepfuse
