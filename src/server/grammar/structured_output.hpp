// Structured output: the grammars that constrain an answer (`response_format` json_object and
// json_schema, tool_choice `required` and a named function), compiled by xgrammar's C++ core over
// the served model's vocabulary. Each sequence gets its own matcher (a TokenConstraint): before a
// token it fills the bitmask of the ids that keep the text inside the grammar, after it accepts
// the id sampled. Once the grammar is complete only the model's stop ids stay allowed, so an
// answer that ends on its own is always complete and valid (one cut off by max_tokens is not).
//
// JSON is written compactly (", " and ": " separators, no other whitespace), so a model cannot
// spend its budget on whitespace. A json_schema is checked first for keywords the grammar cannot
// enforce (ApiError naming the keyword); xgrammar's own refusals are 400s naming the schema.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/token_constraint.hpp"
#include "deepfuse/tokenizer.hpp"
#include "server/api/tool_calls.hpp"

namespace deepfuse::server {

// One compiled grammar; shared by every request that asks for it.
class OutputGrammar {
 public:
  virtual ~OutputGrammar() = default;
  // A fresh matcher at the start of the answer.
  virtual std::shared_ptr<TokenConstraint> start() const = 0;
};

class StructuredOutput {
 public:
  // `vocab_size`: the model's (the masks' width; ids the tokenizer lacks are never allowed).
  // `stop_ids` end an answer once the grammar is complete. `kept_special_ids`: special tokens a
  // grammar may write as text (the tool call markers); other special tokens are never allowed.
  StructuredOutput(const Tokenizer& tokenizer, int vocab_size, std::vector<int32_t> stop_ids,
                   std::vector<int32_t> kept_special_ids);
  ~StructuredOutput();

  // Any JSON object.
  std::shared_ptr<const OutputGrammar> json_object();
  // A JSON value that validates against `schema`; `param` names the schema in errors. Additional
  // properties are refused unless the schema allows them.
  std::shared_ptr<const OutputGrammar> json_schema(const nlohmann::json& schema, const std::string& param);
  // Exactly one call in `format` to one of `tools` (OpenAI tool definitions, checked), or to the
  // tool named `only`; its arguments follow the function's `parameters` schema.
  std::shared_ptr<const OutputGrammar> tool_call(ToolCallFormat format, const nlohmann::json& tools,
                                                 const std::optional<std::string>& only);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepfuse::server
