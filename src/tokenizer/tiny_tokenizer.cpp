// write_tiny_tokenizer: a small, valid Llama-3-style byte-level BPE tokenizer for test models.
// The merges are learned here by plain greedy BPE on a built-in English sample, so the file is
// deterministic and the tokenizer compresses ordinary text a little like a real one.
#include <algorithm>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"
#include "deepfuse/tokenizer.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse {
namespace {

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kSample =
    "The quick brown fox jumps over the lazy dog. Hello world! This is a tiny model for testing the "
    "inference engine. It reads the prompt, runs the transformer layers and writes the next token. "
    "The user asks a question and the assistant answers it. What is the capital of France? The capital "
    "of France is Paris. Tell me a story about a dragon who loved to read books in the library. "
    "Once upon a time there was a small village near the mountains where the people were happy. "
    "Numbers like 1, 2, 3, 10, 42 and 2024 appear in text, and so do names, places and dates. "
    "We're testing, they're running, it's working, I'm here, you'll see, we've done it, don't stop.";

const std::vector<std::string> kSpecialTokens = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                                 "<|end_header_id|>", "<|eot_id|>"};

constexpr const char* kChatTemplate =
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

// Byte-level words of the sample, each a sequence of symbols, with their counts.
std::map<std::vector<std::string>, int> sample_words() {
  std::map<std::vector<std::string>, int> words;
  const tokenizer::Regex pattern(kLlama3Pattern);
  const std::string sample = kSample;
  pattern.for_each_match(sample, [&](size_t start, size_t end) {
    std::vector<std::string> symbols;
    for (size_t i = start; i < end; ++i) {
      std::string symbol;
      tokenizer::append_utf8(symbol, tokenizer::byte_to_code_point()[static_cast<unsigned char>(sample[i])]);
      symbols.push_back(symbol);
    }
    ++words[symbols];
  });
  return words;
}

// Greedy BPE: repeatedly merge the most frequent adjacent pair (ties: the smallest pair).
std::vector<std::pair<std::string, std::string>> learn_merges(size_t count) {
  auto words = sample_words();
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < count) {
    std::map<std::pair<std::string, std::string>, int> pair_counts;
    for (const auto& [symbols, n] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pair_counts[{symbols[i], symbols[i + 1]}] += n;
    const auto best = std::max_element(pair_counts.begin(), pair_counts.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    if (best == pair_counts.end() || best->second < 2) break;
    const auto pair = best->first;
    merges.push_back(pair);
    std::map<std::vector<std::string>, int> merged_words;
    for (const auto& [symbols, n] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == pair.first && symbols[i + 1] == pair.second) {
          merged.push_back(pair.first + pair.second);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      merged_words[merged] += n;
    }
    words = std::move(merged_words);
  }
  return merges;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  DF_CHECK(out.good(), "cannot write " + path.string());
  out << text;
}

}  // namespace

TinyTokenizerIds tiny_tokenizer_ids(int vocab_size) {
  DF_CHECK(vocab_size >= kTinyTokenizerMinVocab,
           "write_tiny_tokenizer: vocab_size must be at least " + std::to_string(kTinyTokenizerMinVocab));
  return {vocab_size - 5, vocab_size - 4, vocab_size - 1};  // the order of kSpecialTokens
}

void write_tiny_tokenizer(const std::filesystem::path& dir, int vocab_size) {
  const int specials = static_cast<int>(kSpecialTokens.size());
  const TinyTokenizerIds ids = tiny_tokenizer_ids(vocab_size);
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) {
    std::string token;
    tokenizer::append_utf8(token, tokenizer::byte_to_code_point()[b]);
    vocab[token] = b;
  }
  const int model_tokens = vocab_size - specials;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [left, right] : learn_merges(static_cast<size_t>(model_tokens - 256))) {
    vocab[left + right] = static_cast<int>(vocab.size());
    merges.push_back({left, right});
  }
  // When the sample runs out of merges, the remaining ids are reserved added tokens.
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  const auto add_special = [&](const std::string& content, int id) {
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  };
  for (int id = static_cast<int>(vocab.size()); id < model_tokens; ++id) add_special("<|reserved_" + std::to_string(id) + "|>", id);
  for (int i = 0; i < specials; ++i) add_special(kSpecialTokens[i], model_tokens + i);
  const int bos_id = ids.begin_of_text;

  const nlohmann::ordered_json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", kSpecialTokens[0]}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", nlohmann::ordered_json::array()},
        {"special_tokens", {{kSpecialTokens[0], {{"id", kSpecialTokens[0]}, {"ids", {bos_id}}, {"tokens", {kSpecialTokens[0]}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", true},
        {"vocab", vocab}, {"merges", merges}}}};
  const nlohmann::ordered_json config = {{"bos_token", kSpecialTokens[0]}, {"eos_token", "<|eot_id|>"},
                                         {"chat_template", kChatTemplate}, {"tokenizer_class", "PreTrainedTokenizerFast"}};
  std::filesystem::create_directories(dir);
  write_text(dir / "tokenizer.json", tokenizer.dump(1));
  write_text(dir / "tokenizer_config.json", config.dump(1));
}

}  // namespace deepfuse
