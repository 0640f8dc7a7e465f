// Tool call parsing: each format's calls found in whole and in streamed text (split at every
// byte), content around them kept, malformed calls returned as content, and the format detected
// from real chat templates.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api/tool_calls.hpp"
#include "tokenizer/fixtures.hpp"

namespace deepfuse::server {
namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

// The text pushed in pieces of `piece` bytes (0: all at once).
Parsed parse(ToolCallFormat format, const std::string& text, size_t piece) {
  ToolCallParser parser(format);
  Parsed out;
  auto take = [&](ToolCallParser::Output o) {
    out.content += o.content;
    for (ToolCall& c : o.calls) out.calls.push_back(std::move(c));
  };
  if (piece == 0) piece = text.size() + 1;
  for (size_t at = 0; at < text.size(); at += piece) take(parser.push(text.substr(at, piece)));
  take(parser.finish());
  EXPECT_EQ(parser.calls(), static_cast<int>(out.calls.size()));
  return out;
}

struct Case {
  ToolCallFormat format;
  std::string text;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

void expect_parse(const Case& k) {
  for (size_t piece : {0, 1, 2, 3, 7}) {
    SCOPED_TRACE(k.text + " in pieces of " + std::to_string(piece));
    const Parsed p = parse(k.format, k.text, piece);
    EXPECT_EQ(p.content, k.content);
    ASSERT_EQ(p.calls.size(), k.calls.size());
    for (size_t i = 0; i < k.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, k.calls[i].first);
      EXPECT_EQ(nlohmann::json::parse(p.calls[i].arguments), nlohmann::json::parse(k.calls[i].second));
      EXPECT_EQ(p.calls[i].id.size(), k.format == ToolCallFormat::mistral ? 9u : 29u) << p.calls[i].id;
    }
  }
}

TEST(ToolCalls, Hermes) {
  const auto f = ToolCallFormat::hermes;
  expect_parse({f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
                {{"get_weather", R"({"city": "Paris"})"}}});
  expect_parse({f,
                "Let me check. <tool_call>{\"name\": \"a\", \"arguments\": {\"x\": \"}</tool_call>\"}}</tool_call>\n"
                "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>",
                "Let me check. ", {{"a", R"({"x": "}</tool_call>"})"}, {"b", "{}"}}});
  // Not closed, but complete: still a call (a model may stop right after the JSON).
  expect_parse({f, "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": [1, 2]}}", "", {{"a", R"({"k": [1, 2]})"}}});
  // Arguments as a JSON string are decoded.
  expect_parse({f, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>", "", {{"a", R"({"k": 1})"}}});
  // Malformed: content, marker and all.
  expect_parse({f, "x <tool_call>{\"name\": 3}</tool_call> y", "x <tool_call>{\"name\": 3}</tool_call> y", {}});
  expect_parse({f, "no calls, a < and <tool", "no calls, a < and <tool", {}});
}

TEST(ToolCalls, Mistral) {
  const auto f = ToolCallFormat::mistral;
  expect_parse({f, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                   "{\"name\": \"b\", \"arguments\": {\"s\": \"]\"}}]",
                "", {{"get_weather", R"({"city": "Paris"})"}, {"b", R"({"s": "]"})"}}});
  expect_parse({f, "Plain [answer] here", "Plain [answer] here", {}});
  expect_parse({f, "[TOOL_CALLS] [{\"name\": \"a\", \"argu", "[TOOL_CALLS] [{\"name\": \"a\", \"argu", {}});
}

TEST(ToolCalls, Llama3Json) {
  const auto f = ToolCallFormat::llama3_json;
  expect_parse({f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "",
                {{"get_weather", R"({"city": "Paris"})"}}});
  expect_parse({f, " <|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"n\": 1}}",
                "", {{"a", "{}"}, {"b", R"({"n": 1})"}}});
  expect_parse({f, "The answer is {not a call}", "The answer is {not a call}", {}});
  expect_parse({f, "{\"city\": \"Paris\"}", "{\"city\": \"Paris\"}", {}});
  expect_parse({f, "  ", "  ", {}});
}

TEST(ToolCalls, FormatFromTheRealTemplates) {
  const auto template_of = [](const char* fixture) {
    return testing::read_json_file(testing::tokenizer_fixture_dir(fixture) / "tokenizer_config.json")["chat_template"]
        .get<std::string>();
  };
  EXPECT_EQ(detect_tool_call_format(template_of("llama3_bytelevel")), ToolCallFormat::llama3_json);
  EXPECT_EQ(detect_tool_call_format(template_of("qwen2_bytelevel")), ToolCallFormat::hermes);
  EXPECT_EQ(detect_tool_call_format(template_of("mistral_metaspace")), ToolCallFormat::mistral);
  EXPECT_EQ(detect_tool_call_format(template_of("llama2_sentencepiece")), ToolCallFormat::none);
}

}  // namespace
}  // namespace deepfuse::server
