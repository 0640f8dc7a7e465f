#include "tokenizer/post_processor.hpp"

#include <string>

#include "deepfuse/error.hpp"

namespace deepfuse::tokenizer {
namespace {

[[noreturn]] void fail(const std::string& message) { throw Error("tokenizer.json: post_processor: " + message); }

void append_template(const nlohmann::json& spec, SpecialTokenFrame& frame) {
  const auto& specials = spec.at("special_tokens");
  bool seen_sequence = false;
  for (const auto& piece : spec.at("single")) {
    if (piece.contains("Sequence")) {
      if (piece.at("Sequence").value("id", "A") != "A") fail("the single template names a sequence other than $A");
      seen_sequence = true;
      continue;
    }
    if (!piece.contains("SpecialToken")) fail("template piece " + piece.dump() + " is neither Sequence nor SpecialToken");
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    if (!specials.contains(name)) fail("template names special token '" + name + "' missing from special_tokens");
    auto& target = seen_sequence ? frame.suffix : frame.prefix;
    for (const auto& id : specials.at(name).at("ids")) target.push_back(id.get<TokenId>());
  }
}

}  // namespace

SpecialTokenFrame parse_post_processor(const nlohmann::json& spec) {
  SpecialTokenFrame frame;
  if (spec.is_null()) return frame;
  const std::string type = spec.value("type", "");
  if (type == "Sequence") {
    for (const auto& step : spec.at("processors")) {
      const SpecialTokenFrame inner = parse_post_processor(step);
      frame.prefix.insert(frame.prefix.end(), inner.prefix.begin(), inner.prefix.end());
      frame.suffix.insert(frame.suffix.begin(), inner.suffix.begin(), inner.suffix.end());
    }
  } else if (type == "TemplateProcessing") {
    append_template(spec, frame);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    frame.prefix.push_back(spec.at("cls").at(1).get<TokenId>());
    frame.suffix.push_back(spec.at("sep").at(1).get<TokenId>());
  } else if (type != "ByteLevel") {
    fail("unsupported type '" + type + "'");
  }
  return frame;
}

}  // namespace deepfuse::tokenizer
