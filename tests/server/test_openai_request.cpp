// OpenAI request parsing: defaults, field checks, and the error each bad request gets.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

#include <unistd.h>

#include "deepfuse/chat_template.hpp"
#include "deepfuse/tokenizer.hpp"
#include "server/api/chat_messages.hpp"
#include "server/api/openai_request.hpp"
#include "server/api_error.hpp"
#include "tokenizer/fixtures.hpp"

namespace deepfuse::server {
namespace {

ServedModel model_without_tokenizer() {
  ServedModel m;
  m.name = "tiny";
  m.vocab_size = 100;
  m.max_context = 64;
  m.stop_ids = {99};
  return m;
}

ApiError error_of(Endpoint endpoint, const std::string& body, const ServedModel& model = model_without_tokenizer()) {
  try {
    parse_openai_request(endpoint, body, model);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "");
}

TEST(OpenAiRequest, ParsesACompletionWithTokenIds) {
  const OpenAiRequest r = parse_openai_request(
      Endpoint::completions,
      R"({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "stop": ["x"], "seed": 4,
          "stream": true, "stream_options": {"include_usage": true}, "logprobs": 2})",
      model_without_tokenizer());
  EXPECT_EQ(r.spec.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.spec.max_new_tokens, 5);
  EXPECT_EQ(r.spec.sampling.temperature, 0.0f);
  EXPECT_EQ(r.spec.sampling.seed, 4u);
  EXPECT_EQ(r.spec.stop_ids, (std::vector<int32_t>{99}));
  EXPECT_EQ(r.stop_strings, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.spec.top_logprobs, 2);
}

TEST(OpenAiRequest, DefaultsAsOpenAi) {
  const OpenAiRequest r =
      parse_openai_request(Endpoint::completions, R"({"prompt": [[5, 6]], "ignore_eos": true})", model_without_tokenizer());
  EXPECT_EQ(r.spec.max_new_tokens, 16);
  EXPECT_EQ(r.spec.sampling.temperature, 1.0f);
  EXPECT_TRUE(r.spec.stop_ids.empty());
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.spec.top_logprobs, -1);
}

TEST(OpenAiRequest, EachBadRequestNamesItsField) {
  struct Case {
    Endpoint endpoint;
    const char* body;
    int status;
    const char* param;
  };
  const Endpoint c = Endpoint::completions, chat = Endpoint::chat_completions;
  const Case cases[] = {
      {c, R"({"prompt": [1,)", 400, nullptr},
      {c, R"([1, 2])", 400, nullptr},
      {c, R"({"prompt": [1], "temperature": "hot"})", 400, "temperature"},
      {c, R"({"prompt": [1], "max_tokens": 1.5})", 400, "max_tokens"},
      {c, R"({"max_tokens": 3})", 400, "prompt"},
      {chat, R"({"model": "tiny"})", 400, "messages"},
      {chat, R"({"messages": "hi"})", 400, "messages"},
      {c, R"({"model": "gpt-4", "prompt": [1]})", 404, "model"},
      {c, R"({"prompt": [1], "max_tokens": 0})", 400, "max_tokens"},
      {c, R"({"prompt": [1], "max_tokens": 64})", 400, "max_tokens"},
      {c, R"({"prompt": [1, 100]})", 400, "prompt"},
      {c, R"({"prompt": [-1]})", 400, "prompt"},
      {c, R"({"prompt": "text needs a tokenizer"})", 400, "prompt"},
      {c, R"({"prompt": [1], "n": 0})", 400, "n"},
      {c, R"({"prompt": [1], "top_p": 0})", 400, "top_p"},
      {c, R"({"prompt": [1], "stop": 3})", 400, "stop"},
      {c, R"({"prompt": [1], "echo": true})", 400, "echo"},
  };
  for (const Case& k : cases) {
    const ApiError e = error_of(k.endpoint, k.body);
    EXPECT_EQ(e.status, k.status) << k.body;
    EXPECT_EQ(e.param.value_or("<none>"), k.param ? k.param : "<none>") << k.body;
    const nlohmann::json body = e.body();
    EXPECT_TRUE(body["error"].contains("message") && body["error"].contains("type") && body["error"].contains("param") &&
                body["error"].contains("code"));
  }
  // A prompt that fills the context leaves nothing to generate.
  std::string long_prompt = R"({"prompt": [)";
  for (int i = 0; i < 64; ++i) long_prompt += (i ? ",1" : "1");
  EXPECT_EQ(error_of(c, long_prompt + "]}").code.value_or(""), "context_length_exceeded");
  EXPECT_NE(std::string(error_of(c, "{\"prompt\": \"\xff\xfe\"}").what()).find("UTF-8"), std::string::npos);
}

// The tiny test tokenizer and its chat template, written once per process.
struct TinyChatModel {
  TinyChatModel() {
    const auto dir = std::filesystem::temp_directory_path() / ("df_openai_request_" + std::to_string(::getpid()));
    write_tiny_tokenizer(dir, 300);
    tokenizer.emplace(Tokenizer::from_directory(dir));
    chat_template.emplace(tokenizer->chat_template());
    std::filesystem::remove_all(dir);
    model = model_without_tokenizer();
    model.vocab_size = 300;
    model.max_context = 512;
    set_chat_side(model, &*tokenizer, &*chat_template);
  }
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  ServedModel model;
};

const ServedModel& tiny_chat_model() {
  static const TinyChatModel m;
  return m.model;
}

struct Refusal {
  Endpoint endpoint;
  const char* body;
  const char* param;
  const char* code;
};

// Every refusal is a 400 with OpenAI's body, naming the field and the kind of fault.
void expect_refusals(const std::vector<Refusal>& cases) {
  for (const Refusal& k : cases) {
    const ApiError e = error_of(k.endpoint, k.body, tiny_chat_model());
    EXPECT_EQ(e.status, 400) << k.body << ": " << e.what();
    EXPECT_EQ(e.param.value_or("<none>"), k.param) << k.body << ": " << e.what();
    EXPECT_EQ(e.code.value_or("<none>"), k.code) << k.body << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

constexpr Endpoint kCompletions = Endpoint::completions, kChat = Endpoint::chat_completions;

TEST(OpenAiRequest, MessagesFollowOpenAisRules) {
  expect_refusals({
      {kChat, R"({"messages": [{"role": "wizard", "content": "hi"}]})", "messages.[0].role", "invalid_value"},
      {kChat, R"({"messages": [{"content": "hi"}]})", "messages.[0].role", "missing_required_parameter"},
      {kChat, R"({"messages": [{"role": 7, "content": "hi"}]})", "messages.[0].role", "invalid_type"},
      {kChat, R"({"messages": ["hi"]})", "messages.[0]", "invalid_type"},
      {kChat, R"({"messages": []})", "messages", "empty_array"},
      {kChat, R"({"messages": [{"role": "user"}]})", "messages.[0].content", "missing_required_parameter"},
      {kChat, R"({"messages": [{"role": "user", "content": 5}]})", "messages.[0].content", "invalid_type"},
      {kChat, R"({"messages": [{"role": "user", "content": []}]})", "messages.[0].content", "empty_array"},
      {kChat, R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages.[0].content.[0].text",
       "missing_required_parameter"},
      {kChat, R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}]})",
       "messages.[0].content.[1].type", "invalid_value"},
      {kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       "messages.[0].content.[0].type", "unsupported_value"},
      {kChat, R"({"messages": [{"role": "system", "content": [{"type": "refusal", "refusal": "no"}]}]})",
       "messages.[0].content.[0].type", "invalid_value"},
      {kChat, R"({"messages": [{"role": "user", "content": "hi", "colour": "red"}]})", "messages.[0].colour",
       "unknown_parameter"},
      {kChat, R"({"messages": [{"role": "user", "content": "hi", "name": 3}]})", "messages.[0].name", "invalid_type"},
      {kChat, R"({"messages": [{"role": "assistant"}]})", "messages.[0].content", "missing_required_parameter"},
      {kChat, R"({"messages": [{"role": "tool", "content": "21"}]})", "messages.[0].tool_call_id",
       "missing_required_parameter"},
      {kChat, R"({"messages": [{"role": "function", "name": "f", "content": "x"}]})", "messages.[0].role",
       "unsupported_value"},
      {kChat, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}]})",
       "messages.[0].tool_calls.[0].function", "missing_required_parameter"},
      {kChat, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "custom",
          "function": {"name": "f", "arguments": "{}"}}]}]})", "messages.[0].tool_calls.[0].type", "invalid_value"},
      {kChat, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
          "function": {"name": "f", "arguments": "not json"}}]}]})", "messages.[0].tool_calls.[0].function.arguments",
       "invalid_value"},
      {kChat, R"({"messages": [{"role": "assistant", "content": "x", "audio": {"id": "a"}}]})", "messages.[0].audio",
       "unsupported_parameter"},
  });
}

TEST(OpenAiRequest, NumbersTypesAndRangesAsOpenAi) {
  expect_refusals({
      {kCompletions, R"({"prompt": "x", "temperature": 2.5})", "temperature", "decimal_above_max_value"},
      {kCompletions, R"({"prompt": "x", "temperature": -0.1})", "temperature", "decimal_below_min_value"},
      {kCompletions, R"({"prompt": "x", "top_p": 1.5})", "top_p", "decimal_above_max_value"},
      {kCompletions, R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty", "decimal_above_max_value"},
      {kCompletions, R"({"prompt": "x", "frequency_penalty": -2.5})", "frequency_penalty", "decimal_below_min_value"},
      {kCompletions, R"({"prompt": "x", "n": 17})", "n", "integer_above_max_value"},
      {kCompletions, R"({"prompt": "x", "n": 1.0})", "n", "invalid_type"},
      {kCompletions, R"({"prompt": "x", "seed": "4"})", "seed", "invalid_type"},
      {kCompletions, R"({"prompt": "x", "max_tokens": -1})", "max_tokens", "integer_below_min_value"},
      {kCompletions, R"({"prompt": "x", "logprobs": 21})", "logprobs", "integer_above_max_value"},
      {kCompletions, R"({"prompt": "x", "stream": "yes"})", "stream", "invalid_type"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})",
       "max_completion_tokens", "integer_below_min_value"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs", "invalid_type"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21, "logprobs": true})",
       "top_logprobs", "integer_above_max_value"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs",
       "invalid_value"},
      {kCompletions, R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "stop", "array_above_max_length"},
      {kCompletions, R"({"prompt": "x", "stop": ["a", 3]})", "stop.[1]", "invalid_type"},
      {kCompletions, R"({"prompt": "x", "stop": ""})", "stop", "invalid_value"},
      {kCompletions, R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options",
       "invalid_value"},
      {kCompletions, R"({"prompt": "x", "stream": true, "stream_options": {"usage": true}})", "stream_options.usage",
       "unknown_parameter"},
      {kCompletions, R"({"prompt": [1, "a"]})", "prompt.[1]", "invalid_type"},
  });
}

TEST(OpenAiRequest, UnimplementedFieldsAreRefusedByName) {
  const char* chat = R"({"messages": [{"role": "user", "content": "x"}], )";
  auto with = [&](const char* rest) { return std::string(chat) + rest + "}"; };
  const std::string bodies[] = {
      with(R"("response_format": {"type": "json_object"})"),
      with(R"("response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}})"),
      with(R"("logit_bias": {"5": 10})"),
      with(R"("audio": {"voice": "alloy", "format": "mp3"})"),
      with(R"("modalities": ["text", "audio"])"),
      with(R"("functions": [{"name": "f"}])"),
      with(R"("prediction": {"type": "content", "content": "x"})"),
      with(R"("reasoning_effort": "low")"),
  };
  const char* params[] = {"response_format", "response_format", "logit_bias", "audio",
                          "modalities", "functions", "prediction", "reasoning_effort"};
  for (size_t i = 0; i < std::size(bodies); ++i) {
    const ApiError e = error_of(kChat, bodies[i], tiny_chat_model());
    EXPECT_EQ(e.status, 400) << bodies[i];
    EXPECT_EQ(e.param.value_or(""), params[i]) << bodies[i];
    EXPECT_EQ(e.code.value_or(""), "unsupported_parameter") << bodies[i] << ": " << e.what();
  }
  expect_refusals({
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "colour": 1})", "colour", "unknown_parameter"},
      {kCompletions, R"({"prompt": "x", "messages": []})", "messages", "unknown_parameter"},
      {kCompletions, R"({"prompt": "x", "suffix": "end"})", "suffix", "unsupported_parameter"},
      {kCompletions, R"({"prompt": "x", "best_of": 3})", "best_of", "unsupported_parameter"},
      {kCompletions, R"({"prompt": ["a", "b"]})", "prompt", "unsupported_parameter"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}})", "logit_bias.abc",
       "invalid_value"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}})", "logit_bias.5",
       "decimal_above_max_value"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})",
       "response_format.type", "invalid_value"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "service_tier": "gold"})", "service_tier",
       "invalid_value"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "metadata": {"k": 1}})", "metadata.k",
       "invalid_type"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "store": "yes"})", "store", "invalid_type"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "user": 5})", "user", "invalid_type"},
  });
}

TEST(OpenAiRequest, DefaultsAndMetadataAreAccepted) {
  const OpenAiRequest r = parse_openai_request(
      kChat,
      R"({"model": "tiny", "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
          {"role": "user", "content": "Hi", "name": "ann"}], "user": "u1", "metadata": {"team": "a"}, "store": false,
          "service_tier": "auto", "logit_bias": {}, "modalities": ["text"], "response_format": {"type": "text"},
          "parallel_tool_calls": true, "seed": -3, "stream": true, "stream_options": {"include_usage": true},
          "max_tokens": 4, "max_completion_tokens": 5})",
      tiny_chat_model());
  EXPECT_EQ(r.spec.max_new_tokens, 5);
  EXPECT_TRUE(r.include_usage);
  // The developer message is rendered as the system message.
  const std::string text = tiny_chat_model().tokenizer->decode(r.spec.prompt);
  EXPECT_NE(text.find("<|start_header_id|>system<|end_header_id|>\n\nBe brief."), std::string::npos) << text;
}

TEST(OpenAiRequest, ToolCallArgumentsReachTheTemplateAsObjects) {
  const auto messages = checked_chat_messages(nlohmann::json::parse(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C"}]}]})"));
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[1]["content"], "");
  EXPECT_EQ(messages[1]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(messages[2]["tool_call_id"], "call_1");
  EXPECT_EQ(messages[2]["content"], "21 C");
}

TEST(OpenAiRequest, ToolFieldsFollowOpenAisRules) {
  ServedModel hermes = tiny_chat_model();
  hermes.tool_format = ToolCallFormat::hermes;
  const std::string tool = R"({"type": "function", "function": {"name": "get_weather", "parameters": {}}})";
  auto chat = [&](const std::string& rest) {
    return R"({"messages": [{"role": "user", "content": "x"}], )" + rest + "}";
  };
  struct Case {
    std::string body;
    const char* param;
    const char* code;
  };
  const Case cases[] = {
      {chat(R"("tool_choice": "auto")"), "tool_choice", "invalid_value"},
      {chat(R"("tools": [])"), "tools", "empty_array"},
      {chat(R"("tools": {"a": 1})"), "tools", "invalid_type"},
      {chat(R"("tools": [{"type": "function", "function": {"name": "bad name!"}}])"), "tools.[0].function.name",
       "invalid_value"},
      {chat(R"("tools": [{"type": "function"}])"), "tools.[0].function", "missing_required_parameter"},
      {chat(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}])"),
       "tools.[0].function.parameters", "invalid_type"},
      {chat(R"("tools": [{"type": "function", "function": {"name": "f", "colour": 1}}])"), "tools.[0].function.colour",
       "unknown_parameter"},
      {chat(R"("tools": [{"type": "custom", "custom": {"name": "f"}}])"), "tools.[0].type", "unsupported_parameter"},
      {chat(R"("tools": [)" + tool + R"(], "tool_choice": "sometimes")"), "tool_choice", "invalid_value"},
      {chat(R"("tools": [)" + tool + R"(], "tool_choice": {"type": "function", "function": {"name": "other"}})"),
       "tool_choice.function.name", "invalid_value"},
      // Both need a grammar (StructuredOutput), which a model without one refuses by name.
      {chat(R"("tools": [)" + tool + R"(], "tool_choice": "required")"), "tool_choice", "unsupported_parameter"},
      {chat(R"("tools": [)" + tool + R"(], "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
       "tool_choice", "unsupported_parameter"},
      {chat(R"("tools": [)" + tool + R"(], "parallel_tool_calls": 1)"), "parallel_tool_calls", "invalid_type"},
  };
  for (const Case& k : cases) {
    const ApiError e = error_of(kChat, k.body, hermes);
    EXPECT_EQ(e.status, 400) << k.body;
    EXPECT_EQ(e.param.value_or("<none>"), k.param) << k.body << ": " << e.what();
    EXPECT_EQ(e.code.value_or("<none>"), k.code) << k.body << ": " << e.what();
  }
  // A model whose chat template renders no tools refuses them by name.
  const ApiError e = error_of(kChat, chat(R"("tools": [)" + tool + "]"), tiny_chat_model());
  EXPECT_EQ(e.param.value_or(""), "tools");
  EXPECT_EQ(e.code.value_or(""), "unsupported_parameter");
  // tool_choice "none" renders no tools and parses nothing, on any model.
  EXPECT_FALSE(parse_openai_request(kChat, chat(R"("tools": [)" + tool + R"(], "tool_choice": "none")"),
                                    tiny_chat_model()).tools.parse);
}

// Requests with tools as clients send them render exactly the prompt jinja2 renders from the
// real Llama 3.1, Qwen2.5 and Mistral templates (scripts/fixtures/make_tool_chat_fixtures.py).
TEST(OpenAiRequest, ToolRequestsRenderAsTransformersDoes) {
  const auto fixtures =
      deepfuse::testing::read_json_file(deepfuse::testing::tokenizer_fixture_dir("..") / "tool_chats.json");
  ASSERT_GE(fixtures["cases"].size(), 6u);
  for (const auto& c : fixtures["cases"]) {
    SCOPED_TRACE(c["tokenizer"].get<std::string>() + ": " + c["request"].dump());
    const Tokenizer tokenizer = Tokenizer::from_directory(deepfuse::testing::tokenizer_fixture_dir(c["tokenizer"]));
    const ChatTemplate chat_template(tokenizer.chat_template());
    ServedModel model = model_without_tokenizer();
    set_chat_side(model, &tokenizer, &chat_template);
    model.vocab_size = static_cast<int>(tokenizer.vocab_size());
    model.max_context = 1 << 16;
    const OpenAiRequest r = parse_openai_request(kChat, c["request"].dump(), model);
    EXPECT_EQ(r.spec.prompt, tokenizer.encode_rendered_chat(c["expected"].get<std::string>()));
    EXPECT_EQ(r.tools.parse, c["request"].value("tool_choice", "auto") != "none");
  }
}

}  // namespace
}  // namespace deepfuse::server
