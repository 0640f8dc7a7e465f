// `deepfuse tokenize --model DIR`: text (stdin or --text) to token ids as a JSON array, like
// llama.cpp's tokenize tool; --decode turns a JSON id array back into text; --chat renders
// messages through the model's chat template first.
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/chat_prompt.hpp"
#include "cli/commands.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tokenizer.hpp"

namespace deepfuse::cli {
namespace {

struct TokenizeArgs {
  std::string model_dir;
  std::string text;
  bool text_given = false;
  bool no_special = false;
  bool decode = false;
  bool chat = false;
  bool render_only = false;
  bool no_generation_prompt = false;
};

std::string read_input(const TokenizeArgs& args) {
  if (args.text_given) return args.text;
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::string ids_to_json(const std::vector<TokenId>& ids) { return nlohmann::json(ids).dump(); }

std::vector<TokenId> parse_id_array(const std::string& text) {
  nlohmann::json ids;
  try {
    ids = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw Error("--decode expects a JSON array of token ids, e.g. [128000, 9906]");
  }
  DF_CHECK(ids.is_array(), "--decode expects a JSON array of token ids, e.g. [128000, 9906]");
  std::vector<TokenId> result;
  for (const auto& id : ids) {
    DF_CHECK(id.is_number_integer(), "--decode: " + id.dump() + " is not a token id");
    result.push_back(id.get<TokenId>());
  }
  return result;
}

int run_tokenize(const TokenizeArgs& args) {
  const Tokenizer tokenizer = Tokenizer::from_directory(args.model_dir);
  const std::string input = read_input(args);
  if (args.decode) {
    std::cout << tokenizer.decode(parse_id_array(input), args.no_special);
    return 0;
  }
  if (!args.chat) {
    std::cout << ids_to_json(tokenizer.encode(input, !args.no_special)) << "\n";
    return 0;
  }
  const std::string rendered = render_chat(tokenizer, input, !args.no_generation_prompt, args.model_dir);
  if (args.render_only) {
    std::cout << rendered;
    return 0;
  }
  const auto ids = args.no_special ? tokenizer.encode(rendered, false) : tokenizer.encode_rendered_chat(rendered);
  std::cout << ids_to_json(ids) << "\n";
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, Action& action) {
  auto* tokenize = app.add_subcommand("tokenize", "Text to token ids (JSON array) with the model's tokenizer, or back");
  auto args = std::make_shared<TokenizeArgs>();
  tokenize->add_option("--model", args->model_dir, "model directory with tokenizer.json")->required();
  tokenize->add_option("--text", args->text, "the text (default: read stdin)");
  tokenize->add_flag("--no-special", args->no_special,
                     "no BOS/EOS from the post-processor; with --decode, drop special tokens");
  tokenize->add_flag("--decode", args->decode, "read a JSON id array and print its text");
  tokenize->add_flag("--chat", args->chat,
                     "input is chat messages (JSON array or 'role: text' lines), rendered with the chat template");
  tokenize->add_flag("--render-only", args->render_only, "with --chat: print the rendered prompt instead of ids");
  tokenize->add_flag("--no-generation-prompt", args->no_generation_prompt, "with --chat: no assistant header at the end");
  tokenize->callback([args, tokenize, &action] {
    args->text_given = tokenize->count("--text") > 0;
    action = [args] {
      DF_CHECK(!(args->decode && args->chat), "--decode and --chat cannot be combined");
      return run_tokenize(*args);
    };
  });
}

}  // namespace deepfuse::cli
