// Structured output's grammars (src/server/grammar) on real tokenizers: the vocabulary's bytes
// (Tokenizer::token_bytes) against decode, random walks through each grammar's masks (every step
// a fresh random choice among the allowed ids) whose text always parses, validates and, for tool
// calls, is read back by the format's parser, and the schema keywords refused by name.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"
#include "deepfuse/token_bitmask.hpp"
#include "deepfuse/tokenizer.hpp"
#include "server/api/tool_calls.hpp"
#include "server/api_error.hpp"
#include "server/grammar/structured_output.hpp"
#include "test_util.hpp"

namespace deepfuse::server {
namespace {

using nlohmann::json;

const Tokenizer& tiny_tokenizer() {
  static const Tokenizer tokenizer = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("df_structured_" + std::to_string(::getpid()));
    write_tiny_tokenizer(dir, 300);
    Tokenizer t = Tokenizer::from_directory(dir);
    std::filesystem::remove_all(dir);
    return t;
  }();
  return tokenizer;
}

Tokenizer fixture_tokenizer(const std::string& name) {
  return Tokenizer::from_directory(std::filesystem::path(DEEPFUSE_TOKENIZER_FIXTURES) / name);
}

// Walks the grammar with random allowed ids until it takes a stop id; the text before it.
std::string random_walk(const OutputGrammar& grammar, const Tokenizer& tokenizer, int vocab, int32_t stop,
                        std::mt19937_64& rng) {
  const auto constraint = grammar.start();
  std::vector<uint32_t> mask(token_bitmask_words(vocab));
  std::vector<int32_t> ids;
  for (int step = 0; step < 4000; ++step) {
    constraint->fill_next_mask(mask);
    std::vector<int32_t> allowed;
    for (int id = 0; id < vocab; ++id)
      if (token_allowed(mask.data(), id)) allowed.push_back(id);
    EXPECT_FALSE(allowed.empty()) << "no id allowed after " << tokenizer.decode(ids);
    if (allowed.empty()) break;
    const int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    constraint->accept(id);
    if (id == stop) return tokenizer.decode(ids);
    EXPECT_FALSE(tokenizer.is_special(id)) << "special id " << id << " allowed inside the text";
    ids.push_back(id);
  }
  ADD_FAILURE() << "no stop after 4000 ids: " << tokenizer.decode(ids);
  return {};
}

const json kOrder = json::parse(R"({
  "type": "object",
  "properties": {
    "tier": {"type": "string", "enum": ["free", "pro"]},
    "items": {"type": "array", "maxItems": 2, "items": {"type": "object",
      "properties": {"sku": {"const": "A1"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
      "required": ["sku", "n"], "additionalProperties": false}},
    "gift": {"type": "boolean"},
    "note": {"type": "string", "maxLength": 3}
  },
  "required": ["tier", "items", "gift", "note"],
  "additionalProperties": false
})");

void expect_order(const json& v, const std::string& text) {
  ASSERT_TRUE(v.is_object()) << text;
  EXPECT_EQ(v.size(), 4u) << text;
  EXPECT_TRUE(v["tier"] == "free" || v["tier"] == "pro") << text;
  ASSERT_TRUE(v["items"].is_array() && v["items"].size() <= 2) << text;
  for (const json& item : v["items"]) {
    EXPECT_EQ(item.size(), 2u) << text;
    EXPECT_EQ(item["sku"], "A1") << text;
    EXPECT_TRUE(item["n"].is_number_integer() && item["n"] >= 1 && item["n"] <= 9) << text;
  }
  EXPECT_TRUE(v["gift"].is_boolean()) << text;
  ASSERT_TRUE(v["note"].is_string()) << text;
  const std::string note = v["note"].get<std::string>();  // maxLength counts characters
  EXPECT_LE(std::count_if(note.begin(), note.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }), 3)
      << text;
}

TEST(StructuredOutput, TokenBytesFollowDecode) {
  for (const char* name : {"llama3_bytelevel", "qwen2_bytelevel", "mistral_metaspace", "llama2_sentencepiece"}) {
    SCOPED_TRACE(name);
    const Tokenizer tokenizer = fixture_tokenizer(name);
    const std::vector<std::string> bytes = tokenizer.token_bytes();
    ASSERT_EQ(bytes.size(), tokenizer.vocab_size());
    // Random texts: the bytes of their tokens, concatenated, are the decoded text after the first
    // token (decoders treat the first token of a text apart).
    // Whole words, so every text is valid UTF-8 (decode replaces invalid bytes; token_bytes keeps them).
    auto rng = testing::make_rng(91);
    const char* words[] = {" world", ",", " {\"a\":", " [1, 2]}", " é", " ünïcödé", " 東京", " <tag>", " 123", "\n", "x"};
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<TokenId> ids = tokenizer.encode("Hello", false);
      const std::string first = tokenizer.decode(ids);
      std::string joined = first;
      for (int i = 0; i < 8; ++i)
        for (const TokenId id : tokenizer.encode(words[rng() % std::size(words)], false)) {
          ids.push_back(id);
          joined += bytes[id];
        }
      EXPECT_EQ(joined, tokenizer.decode(ids));
    }
    for (const TokenId id : tokenizer.stop_ids()) EXPECT_TRUE(bytes[id].empty()) << "stop id " << id;
  }
}

TEST(StructuredOutput, RandomWalksThroughASchemaAlwaysValidate) {
  const Tokenizer& tokenizer = tiny_tokenizer();
  const int vocab = 300;
  const int32_t stop = *tokenizer.eos_id();
  StructuredOutput output(tokenizer, vocab, {stop}, {});
  const auto grammar = output.json_schema(kOrder, "schema");
  auto rng = testing::make_rng(92);
  for (int walk = 0; walk < 20; ++walk) {
    const std::string text = random_walk(*grammar, tokenizer, vocab, stop, rng);
    const json value = json::parse(text, nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << text;
    EXPECT_EQ(text.find("\xEF\xBF\xBD"), std::string::npos) << "invalid UTF-8 (U+FFFD in the text): " << text;
    expect_order(value, text);
  }
}

TEST(StructuredOutput, JsonObjectAllowsOnlyStopAfterTheObject) {
  const Tokenizer& tokenizer = tiny_tokenizer();
  const int vocab = 300;
  const int32_t stop = *tokenizer.eos_id();
  StructuredOutput output(tokenizer, vocab, {stop}, {});
  const auto constraint = output.json_object()->start();
  std::vector<uint32_t> mask(token_bitmask_words(vocab));
  constraint->fill_next_mask(mask);
  const std::vector<TokenId> open = tokenizer.encode("{", false), space = tokenizer.encode(" ", false);
  EXPECT_TRUE(token_allowed(mask.data(), open.front()));
  EXPECT_FALSE(token_allowed(mask.data(), space.front()));  // compact: no leading whitespace
  EXPECT_FALSE(token_allowed(mask.data(), stop));
  for (const TokenId id : tokenizer.encode(R"({"a": [1, {"b": null}], "c": "x"})", false)) {
    constraint->fill_next_mask(mask);
    ASSERT_TRUE(token_allowed(mask.data(), id)) << "id " << id;
    constraint->accept(id);
  }
  constraint->fill_next_mask(mask);
  for (int id = 0; id < vocab; ++id) EXPECT_EQ(token_allowed(mask.data(), id), id == stop) << "id " << id;
  EXPECT_THROW(constraint->accept(open.front()), Error);
}

TEST(StructuredOutput, ForcedToolCallsParseInEveryFormat) {
  const Tokenizer& tokenizer = tiny_tokenizer();
  const int vocab = 300;
  const int32_t stop = *tokenizer.eos_id();
  StructuredOutput output(tokenizer, vocab, {stop}, {});
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
      "required": ["city", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "note", "parameters": {"type": "object", "properties": {
      "text": {"type": "string", "maxLength": 4}}, "required": ["text"], "additionalProperties": false}}}
  ])");
  auto rng = testing::make_rng(93);
  for (const ToolCallFormat format : {ToolCallFormat::hermes, ToolCallFormat::mistral, ToolCallFormat::llama3_json}) {
    SCOPED_TRACE(tool_call_format_info(format).name);
    for (const std::optional<std::string> only : {std::optional<std::string>(), std::optional<std::string>("ping")}) {
      const auto grammar = output.tool_call(format, tools, only);
      for (int walk = 0; walk < 10; ++walk) {
        const std::string text = random_walk(*grammar, tokenizer, vocab, stop, rng);
        ToolCallParser parser(format);
        ToolCallParser::Output out = parser.push(text);
        const ToolCallParser::Output rest = parser.finish();
        out.calls.insert(out.calls.end(), rest.calls.begin(), rest.calls.end());
        EXPECT_EQ(out.content + rest.content, "") << text;
        ASSERT_EQ(out.calls.size(), 1u) << text;
        const json arguments = json::parse(out.calls[0].arguments);
        const std::string& name = out.calls[0].name;
        if (only) EXPECT_EQ(name, *only) << text;
        if (name == "ping") {
          EXPECT_EQ(arguments, json::object()) << text;  // no parameters: no arguments
        } else if (name == "note") {
          EXPECT_TRUE(arguments.size() == 1 && arguments["text"].is_string()) << text;
        } else {
          EXPECT_EQ(name, "get_weather") << text;
          EXPECT_EQ(arguments.size(), 2u) << text;
          EXPECT_TRUE(arguments["city"] == "Paris" || arguments["city"] == "Oslo") << text;
          EXPECT_TRUE(arguments["days"] >= 1 && arguments["days"] <= 3) << text;
        }
      }
    }
  }
}

TEST(StructuredOutput, UnenforcedSchemaKeywordsAreRefusedByName) {
  StructuredOutput output(tiny_tokenizer(), 300, {*tiny_tokenizer().eos_id()}, {});
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "array", "uniqueItems": true})", "s.uniqueItems"},
      {R"({"type": "object", "properties": {"a": {"not": {}}}})", "s.properties.a.not"},
      {R"({"anyOf": [{"type": "string"}, {"if": {}}]})", "s.anyOf.[1].if"},
      {R"({"type": "object", "dependentRequired": {}})", "s.dependentRequired"},
      {R"({"type": "array", "items": [{"contains": {}}]})", "s.items.[0].contains"},
      {R"({"type": "string", "pattern": "a+", "maxLength": 2})", "s.maxLength"},
      {R"({"type": "number", "multipleOf": 0.5})", "s.multipleOf"},
      {R"({"type": "object", "oneOf": []})", "s.oneOf"},
      {R"({"type": "object", "x-custom": 1})", "s.x-custom"},
      {R"({"$ref": "#/$defs/missing"})", "s"},
  };
  for (const auto& [schema, param] : cases) {
    try {
      output.json_schema(json::parse(schema), "s");
      ADD_FAILURE() << schema << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << schema;
      EXPECT_EQ(e.param.value_or(""), param) << schema << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace deepfuse::server
