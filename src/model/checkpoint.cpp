// Memory-mapped safetensors files and checkpoint directories (single file or sharded index).
#include <algorithm>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse {

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string source = path.string();
  const int fd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  DF_CHECK(fd >= 0, source + ": cannot open file");
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd);
    throw Error(source + ": not a regular file");
  }
  mapped_size_ = static_cast<size_t>(status.st_size);
  if (mapped_size_ > 0) {
    void* mapping = ::mmap(nullptr, mapped_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    DF_CHECK(mapping != MAP_FAILED, source + ": mmap failed");
    mapping_ = static_cast<const std::byte*>(mapping);
  } else {
    ::close(fd);
  }
  try {
    header_ = parse_safetensors({mapping_, mapped_size_}, source);
  } catch (...) {
    if (mapping_) ::munmap(const_cast<std::byte*>(mapping_), mapped_size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(const_cast<std::byte*>(mapping_), mapped_size_);
}

std::span<const std::byte> SafetensorsFile::data(const TensorInfo& tensor) const {
  return {mapping_ + header_.data_start + tensor.data_begin, tensor.byte_size()};
}

std::map<std::string, std::string> parse_safetensors_index(const std::string& json_text, const std::string& source) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": invalid JSON (" + e.what() + ")");
  }
  DF_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
           source + ": field 'weight_map' must be an object");
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    DF_CHECK(shard.is_string(), source + ": weight_map entry '" + tensor + "' must be a file name");
    const std::string file = shard.get<std::string>();
    // Shards live next to the index: a path would let a checkpoint read files elsewhere.
    DF_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
             source + ": weight_map entry '" + tensor + "' names '" + file + "', not a file in the same directory");
    weight_map[tensor] = file;
  }
  DF_CHECK(!weight_map.empty(), source + ": field 'weight_map' is empty");
  return weight_map;
}

Checkpoint::Checkpoint(const std::filesystem::path& model_dir) {
  const auto index_path = model_dir / "model.safetensors.index.json";
  const auto single_path = model_dir / "model.safetensors";
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shard_names;
  if (std::filesystem::exists(index_path)) {
    weight_map = parse_safetensors_index(read_text_file(index_path), index_path.string());
    for (const auto& [tensor, shard] : weight_map)
      if (std::find(shard_names.begin(), shard_names.end(), shard) == shard_names.end()) shard_names.push_back(shard);
  } else {
    DF_CHECK(std::filesystem::exists(single_path),
             model_dir.string() + ": no model.safetensors or model.safetensors.index.json");
    shard_names.push_back("model.safetensors");
  }
  for (const std::string& shard : shard_names) {
    files_.push_back(std::make_unique<SafetensorsFile>(model_dir / shard));
    const SafetensorsFile& file = *files_.back();
    for (const TensorInfo& info : file.header().tensors) {
      const std::string where = file.path().string() + ": tensor '" + info.name + "'";
      DF_CHECK(weight_map.empty() || (weight_map.count(info.name) && weight_map.at(info.name) == shard),
               where + " is not listed for this shard in " + index_path.string());
      DF_CHECK(tensors_.emplace(info.name, Entry{&info, &file}).second, where + " also appears in another shard");
    }
  }
  for (const auto& [tensor, shard] : weight_map)
    DF_CHECK(tensors_.count(tensor), index_path.string() + ": tensor '" + tensor + "' is listed for " + shard +
                                         " but that file does not contain it");
}

const Checkpoint::Entry* Checkpoint::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace deepfuse
