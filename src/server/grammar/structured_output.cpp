#include "server/grammar/structured_output.hpp"

#include <mutex>
#include <span>
#include <string>
#include <utility>

#include <xgrammar/xgrammar.h>

#include "deepfuse/error.hpp"
#include "deepfuse/token_bitmask.hpp"
#include "server/api/request_fields.hpp"
#include "server/grammar/json_schema_check.hpp"

namespace deepfuse::server {

namespace {

using nlohmann::json;

// The first line of an exception's text (xgrammar's can carry a trace).
std::string first_line(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// Per id, the raw bytes of the token (empty: never allowed); shared by every matcher.
using Vocabulary = std::vector<std::string>;

// The second byte a UTF-8 sequence led by `lead` may take where it differs from 80-BF (no
// overlong forms, no surrogates, nothing above U+10FFFF); {0, 0} where it does not.
std::pair<unsigned char, unsigned char> second_byte_range(unsigned char lead) {
  switch (lead) {
    case 0xE0: return {0xA0, 0xBF};
    case 0xED: return {0x80, 0x9F};
    case 0xF0: return {0x90, 0xBF};
    case 0xF4: return {0x80, 0x8F};
    default: return {0, 0};
  }
}

class MatcherConstraint final : public TokenConstraint {
 public:
  MatcherConstraint(const xgrammar::CompiledGrammar& grammar, std::shared_ptr<const Vocabulary> vocabulary)
      : matcher_(grammar), vocabulary_(std::move(vocabulary)) {}

  void fill_next_mask(std::span<uint32_t> mask) override {
    // xgrammar's bitmask is the same layout (deepfuse/token_bitmask.hpp), as int32 words.
    int64_t shape[1] = {static_cast<int64_t>(mask.size())};
    DLTensor tensor{mask.data(), DLDevice{kDLCPU, 0}, 1, xgrammar::GetBitmaskDLType(), shape, nullptr, 0};
    matcher_.FillNextTokenBitmask(&tensor);
    // xgrammar's byte classes take any continuation byte after a lead byte, so after a token that
    // ended on E0, ED, F0 or F4 it would allow an overlong form, a surrogate or a code point past
    // U+10FFFF (invalid UTF-8, which the text output turns into U+FFFD): those ids are cleared.
    const auto [lo, hi] = second_byte_range(pending_lead_);
    if (hi == 0) return;
    const Vocabulary& vocabulary = *vocabulary_;
    for (size_t id = 0; id < vocabulary.size(); ++id) {
      if (vocabulary[id].empty()) continue;
      const auto first = static_cast<unsigned char>(vocabulary[id][0]);
      if (first < lo || first > hi) mask[id / 32] &= ~(1u << (id % 32));
    }
  }

  void accept(int32_t id) override {
    DF_CHECK(matcher_.AcceptToken(id), "internal: the grammar refused token " + std::to_string(id) +
                                           ", which its own mask allowed");
    const std::string* bytes = static_cast<size_t>(id) < vocabulary_->size() ? &(*vocabulary_)[id] : nullptr;
    pending_lead_ = bytes && !bytes->empty() ? static_cast<unsigned char>(bytes->back()) : 0;
  }

 private:
  xgrammar::GrammarMatcher matcher_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  unsigned char pending_lead_ = 0;  // the text's last byte
};

class CompiledOutputGrammar final : public OutputGrammar {
 public:
  CompiledOutputGrammar(xgrammar::CompiledGrammar grammar, std::shared_ptr<const Vocabulary> vocabulary)
      : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {}
  std::shared_ptr<TokenConstraint> start() const override {
    return std::make_shared<MatcherConstraint>(grammar_, vocabulary_);
  }

 private:
  xgrammar::CompiledGrammar grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
};

// A JSON string literal as an EBNF terminal.
std::string ebnf_literal(const std::string& text) { return "root ::= " + json(text).dump(); }

// JSON written as the parsers read it: ", " and ": " between items, no other whitespace.
xgrammar::Grammar schema_grammar(const std::string& schema, bool strict) {
  return xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/false, std::nullopt, std::nullopt, strict);
}

}  // namespace

struct StructuredOutput::Impl {
  const Tokenizer& tokenizer;
  int vocab_size;
  std::vector<int32_t> stop_ids, kept_special_ids;
  std::once_flag ready;
  std::optional<xgrammar::GrammarCompiler> compiler;  // built on first use (a pass over the vocabulary)
  std::shared_ptr<const Vocabulary> vocabulary;       // what the compiler was given
  std::mutex mutex;                                    // compilations one at a time

  xgrammar::GrammarCompiler& get() {
    std::call_once(ready, [&] {
      std::vector<std::string> vocab = tokenizer.token_bytes();
      vocab.resize(std::min<size_t>(vocab.size(), static_cast<size_t>(vocab_size)));
      // Control characters other than a newline never appear in the grammars' text, but xgrammar's
      // JSON strings would take them raw, which JSON forbids (json.loads refuses the text): such
      // tokens are left out like special ones. Compact JSON needs no whitespace; the tool call
      // formats need only newlines, outside strings.
      for (std::string& bytes : vocab)
        for (const char c : bytes)
          if (static_cast<unsigned char>(c) < 0x20 && c != '\n') {
            bytes.clear();
            break;
          }
      for (const int32_t id : kept_special_ids)
        if (id >= 0 && static_cast<size_t>(id) < vocab.size()) vocab[id] = tokenizer.id_to_token(id).value_or("");
      const xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocab_size, stop_ids);
      compiler.emplace(info, /*max_threads=*/1);
      vocabulary = std::make_shared<const Vocabulary>(std::move(vocab));
    });
    return *compiler;
  }

  std::shared_ptr<const OutputGrammar> compile(const xgrammar::Grammar& grammar) {
    xgrammar::GrammarCompiler& c = get();
    std::lock_guard lock(mutex);
    return std::make_shared<CompiledOutputGrammar>(c.CompileGrammar(grammar), vocabulary);
  }
};

StructuredOutput::StructuredOutput(const Tokenizer& tokenizer, int vocab_size, std::vector<int32_t> stop_ids,
                                   std::vector<int32_t> kept_special_ids)
    : impl_(new Impl{tokenizer, vocab_size, std::move(stop_ids), std::move(kept_special_ids), {}, {}, {}}) {}

StructuredOutput::~StructuredOutput() = default;

std::shared_ptr<const OutputGrammar> StructuredOutput::json_object() {
  return impl_->compile(schema_grammar(R"({"type": "object"})", /*strict=*/false));
}

std::shared_ptr<const OutputGrammar> StructuredOutput::json_schema(const json& schema, const std::string& param) {
  check_json_schema(schema, param);
  try {
    return impl_->compile(schema_grammar(schema.dump(), /*strict=*/true));
  } catch (const std::exception& e) {  // a schema xgrammar cannot turn into a grammar
    throw_invalid_value(param, "the schema cannot be used: " + first_line(e));
  }
}

std::shared_ptr<const OutputGrammar> StructuredOutput::tool_call(ToolCallFormat format, const json& tools,
                                                                 const std::optional<std::string>& only) {
  const ToolCallFormatInfo& info = tool_call_format_info(format);
  DF_CHECK(info.call_open != nullptr, "internal: no tool call format to constrain");
  std::vector<xgrammar::Grammar> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& function = tools[i].at("function");
    const std::string name = function.at("name").get<std::string>();
    if (only && name != *only) continue;
    // No parameters: the function takes no arguments, `{}`.
    const json parameters =
        function.value("parameters", json{{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}});
    const std::string param = param_member(param_member(param_element("tools", i), "function"), "parameters");
    check_json_schema(parameters, param);
    const std::string open = std::string(info.call_open) + name + "\", \"" + info.arguments_key + "\": ";
    try {
      calls.push_back(xgrammar::Grammar::Concat({xgrammar::Grammar::FromEBNF(ebnf_literal(open)),
                                                 schema_grammar(parameters.dump(), /*strict=*/true),
                                                 xgrammar::Grammar::FromEBNF(ebnf_literal(info.call_close))}));
    } catch (const std::exception& e) {
      throw_invalid_value(param, "the schema cannot be used: " + first_line(e));
    }
  }
  DF_CHECK(!calls.empty(), "internal: no tool to constrain the call to");
  return impl_->compile(calls.size() == 1 ? calls.front() : xgrammar::Grammar::Union(calls));
}

}  // namespace deepfuse::server
