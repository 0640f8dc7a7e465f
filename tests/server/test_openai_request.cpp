// OpenAI request parsing: defaults, field checks, and the error each bad request gets.
#include <gtest/gtest.h>

#include "server/api/openai_request.hpp"
#include "server/api_error.hpp"

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

ApiError error_of(Endpoint endpoint, const std::string& body) {
  try {
    parse_openai_request(endpoint, body, model_without_tokenizer());
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

}  // namespace
}  // namespace deepfuse::server
