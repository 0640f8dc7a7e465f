// The tokenizer's rules on small hand-written tokenizer.json files: merge ranks and both merge
// serializations, ignore_merges, long words, streaming decode, clear errors for bad files, and
// the tiny tokenizer written for test models.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "deepfuse/chat_template.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tokenizer.hpp"

namespace deepfuse {
namespace {

// A tokenizer.json with a byte-free vocab over {a, b, c}, no pre-tokenizer, the given merges.
std::string letters_tokenizer(const std::string& merges, bool ignore_merges = false) {
  return R"({"model": {"type": "BPE", "ignore_merges": )" + std::string(ignore_merges ? "true" : "false") +
         R"(, "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "aa": 6, "aaaa": 7}, "merges": )" + merges + "}}";
}

// The message of the deepfuse::Error that `action` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Bpe, BothMergeSerializationsGiveTheSameIds) {
  const auto strings = Tokenizer::from_json(letters_tokenizer(R"(["a b", "ab c"])"));
  const auto pairs = Tokenizer::from_json(letters_tokenizer(R"([["a", "b"], ["ab", "c"]])"));
  EXPECT_EQ(strings.encode("abcab"), (std::vector<TokenId>{5, 3}));
  EXPECT_EQ(pairs.encode("abcab"), strings.encode("abcab"));
}

TEST(Bpe, RankIsThePositionInTheMergeList) {
  EXPECT_EQ(Tokenizer::from_json(letters_tokenizer(R"(["a b", "b c"])")).encode("abc"), (std::vector<TokenId>{3, 2}));
  EXPECT_EQ(Tokenizer::from_json(letters_tokenizer(R"(["b c", "a b"])")).encode("abc"), (std::vector<TokenId>{0, 4}));
}

TEST(Bpe, IgnoreMergesTakesWholeWordsFromTheVocab) {
  // No merge builds "abc", but with ignore_merges a word found in the vocab is taken as is.
  EXPECT_EQ(Tokenizer::from_json(letters_tokenizer("[]", false)).encode("abc"), (std::vector<TokenId>{0, 1, 2}));
  EXPECT_EQ(Tokenizer::from_json(letters_tokenizer("[]", true)).encode("abc"), (std::vector<TokenId>{5}));
}

TEST(Bpe, LongWordsMergeLeftToRightByRank) {
  const auto tokenizer = Tokenizer::from_json(letters_tokenizer(R"(["a a", "aa aa"])"));
  EXPECT_EQ(tokenizer.encode(std::string(10, 'a')), (std::vector<TokenId>{7, 7, 6}));
  // 100001 characters in one word: fine with the heap-based merge loop (a quadratic one crawls).
  const auto ids = tokenizer.encode(std::string(100001, 'a'));
  ASSERT_EQ(ids.size(), 25001u);
  EXPECT_EQ(ids.front(), 7);
  EXPECT_EQ(ids.back(), 0);
}

TEST(TokenizerErrors, BadFilesGiveOneLineErrorsNamingTheProblem) {
  EXPECT_NE(error_of([] { Tokenizer::from_json(R"({"version": "1.0"})"); }).find("no \"model\""), std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_json(letters_tokenizer(R"(["a z"])")); }).find("'z', which is not in the vocab"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_json(letters_tokenizer(R"(["abc"])")); }).find("not two tokens"), std::string::npos);
  const std::string bad_regex = R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(\\p{L}+"}, "behavior": "Isolated"},
                                    "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})";
  const std::string regex_error = error_of([&] { Tokenizer::from_json(bad_regex); });
  EXPECT_NE(regex_error.find("invalid regex '(\\p{L}+'"), std::string::npos) << regex_error;
  EXPECT_NE(error_of([] { Tokenizer::from_json("{not json"); }).find("tokenizer.json: invalid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_json(R"({"model": {"type": "Unigram", "vocab": []}})"); }).find("Unigram"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_directory("/nonexistent/model"); }).find("no tokenizer.json in /nonexistent/model"),
            std::string::npos);
  for (const std::string& message : {error_of([] { Tokenizer::from_json(letters_tokenizer(R"(["a z"])")); }), regex_error})
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(TokenizerErrors, InvalidUtf8InputIsRejected) {
  const auto tokenizer = Tokenizer::from_json(letters_tokenizer("[]"));
  EXPECT_NE(error_of([&] { tokenizer.encode("ab\xC3"); }).find("not valid UTF-8 (bad byte at offset 2)"), std::string::npos);
}

class TinyTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("deepfuse_tiny_tokenizer_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(TinyTokenizer, HasExactlyTheRequestedVocabAndRoundTrips) {
  for (const int vocab_size : {261, 300, 2048}) {
    write_tiny_tokenizer(dir_, vocab_size);
    const auto tokenizer = Tokenizer::from_directory(dir_);
    EXPECT_EQ(tokenizer.vocab_size(), static_cast<size_t>(vocab_size));
    EXPECT_EQ(tokenizer.bos_id(), vocab_size - 5);
    EXPECT_EQ(tokenizer.eos_id(), vocab_size - 1);
    EXPECT_EQ(tokenizer.stop_ids(), std::vector<TokenId>{vocab_size - 1});
    const std::string text = "The capital of France is Paris. naïve 日本語 😀\n\ttabs";
    const auto ids = tokenizer.encode(text);
    ASSERT_EQ(ids.front(), vocab_size - 5);
    EXPECT_EQ(tokenizer.decode(ids, /*skip_special_tokens=*/true), text);
    for (const TokenId id : ids) EXPECT_LT(id, vocab_size);
  }
  write_tiny_tokenizer(dir_, 2048);
  EXPECT_LT(Tokenizer::from_directory(dir_).encode("The capital of France").size(), 10u) << "merges should apply";
}

TEST_F(TinyTokenizer, ChatTemplateRendersAndEncodesWithOneBos) {
  write_tiny_tokenizer(dir_, 512);
  const auto tokenizer = Tokenizer::from_directory(dir_);
  ChatRenderOptions options;
  options.bos_token = tokenizer.bos_token();
  const std::string rendered = ChatTemplate(tokenizer.chat_template()).render(std::vector<ChatMessage>{{"user", " Hi! "}}, options);
  EXPECT_EQ(rendered, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const auto ids = tokenizer.encode_rendered_chat(rendered);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], *tokenizer.bos_id());
  EXPECT_NE(ids[1], *tokenizer.bos_id());
  // A rendering without the BOS gets one.
  EXPECT_EQ(tokenizer.encode_rendered_chat("Hi")[0], *tokenizer.bos_id());
}

TEST_F(TinyTokenizer, RejectsTooSmallVocab) {
  EXPECT_NE(error_of([&] { write_tiny_tokenizer(dir_, 100); }).find("at least 261"), std::string::npos);
}

TEST_F(TinyTokenizer, StreamingNeverSplitsACharacter) {
  write_tiny_tokenizer(dir_, 261);  // bytes only: every multi-byte character spans several ids
  const auto tokenizer = Tokenizer::from_directory(dir_);
  const auto ids = tokenizer.encode("😀é", false);
  ASSERT_EQ(ids.size(), 6u);
  StreamDecoder stream(tokenizer);
  std::vector<std::string> pieces;
  for (const TokenId id : ids) pieces.push_back(stream.push(id));
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "", "😀", "", "é"}));
  EXPECT_EQ(stream.flush(), "");
  // A stream cut inside a character hands the rest over as U+FFFD on flush, like decode does.
  StreamDecoder cut(tokenizer);
  EXPECT_EQ(cut.push(ids[0]), "");
  EXPECT_EQ(cut.flush(), tokenizer.decode({ids[0]}));
}

TEST(ChatMessages, SimpleRoleFormAndJson) {
  const auto messages = parse_chat_messages("system: Be brief.\nuser: Hi!\nsecond line\n");
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[1]["role"], "user");
  EXPECT_EQ(messages[1]["content"], "Hi!\nsecond line");
  EXPECT_EQ(parse_chat_messages(R"([{"role": "user", "content": "x"}])")[0]["content"], "x");
  EXPECT_NE(error_of([] { parse_chat_messages("no role here"); }).find("does not start with a role"), std::string::npos);
}

TEST(ChatTemplateErrors, UnsupportedConstructsAreNamed) {
  EXPECT_NE(error_of([] { ChatTemplate("{% macro greet(name) %}hi{% endmacro %}"); }).find("unsupported construct '{% macro %}'"),
            std::string::npos);
  const ChatRenderOptions options;
  const std::vector<ChatMessage> messages{{"user", "x"}};
  EXPECT_NE(error_of([&] { ChatTemplate("{{ messages | wordwrap }}").render(messages, options); }).find("unsupported filter 'wordwrap'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ChatTemplate("{{ messages is prime }}").render(messages, options); }).find("unsupported test 'prime'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ChatTemplate("{{ 'x'.capitalize() }}").render(messages, options); })
                .find("method 'capitalize' is not a supported function"),
            std::string::npos);
  // A missing attribute is undefined, as in Jinja (Mistral's template asks for content.content).
  EXPECT_EQ(ChatTemplate("{{ messages[0].content.content is defined }}|{{ 'x'.y is defined }}|{{ messages[0].content.z }}")
                .render(messages, options),
            "False|False|");
  EXPECT_NE(error_of([] { ChatTemplate("line1\n{{ 'open "); }).find("unterminated string literal (line 2)"), std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate("{% if x %}never closed"); }).find("{% if %} without {% endif %}"), std::string::npos);
  EXPECT_NE(error_of([&] { ChatTemplate("{{ raise_exception('bad roles') }}").render(messages, options); }).find("bad roles"),
            std::string::npos);
}

TEST(ChatTemplate, LoopControlsScopingAndWhitespace) {
  const ChatRenderOptions options;
  const std::vector<ChatMessage> messages{{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  const std::string source =
      "{% set outer = 'kept' %}{% for m in messages %}{% set outer = 'inner' %}{% if loop.index0 == 2 %}{% break %}{% endif %}"
      "{{ m.content }}{% endfor %}|{{ outer }}\n"
      "  {% if true %}\n"
      "    x\n"
      "  {% endif %}\n"
      "{{- ' y ' -}}\n"
      " z";
  EXPECT_EQ(ChatTemplate(source).render(messages, options), "ab|kept\n    x\n y z");  // as jinja2 renders it
}

}  // namespace
}  // namespace deepfuse
