// safetensors checkpoints: strict parsing of the format, memory-mapped reading, sharded indexes.
//
// Format: 8-byte little-endian header length N, N bytes of JSON header, then the data. The header
// maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data)
// plus an optional "__metadata__" of string -> string. Everything the format promises is checked
// before any byte of data is trusted, so a bad file is one clear error, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace deepfuse {

enum class SafetensorsDType { BOOL, U8, I8, F8_E4M3, F8_E5M2, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64 };

const char* dtype_name(SafetensorsDType dtype);
size_t dtype_size(SafetensorsDType dtype);

struct TensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // byte offsets into the data section
  uint64_t data_end = 0;

  uint64_t element_count() const;
  uint64_t byte_size() const { return data_end - data_begin; }
};

// The header of one safetensors file, validated against the file's total size.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;          // file offset of the data section (8 + header length)
};

// Size limit the reference implementation also uses, against headers that exhaust memory.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates the whole file image (header and sizes; data bytes are not inspected).
// `source` names the file in errors. Throws deepfuse::Error on any violation.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& source);

// A safetensors file mapped read-only into memory.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  std::span<const std::byte> data(const TensorInfo& tensor) const;

 private:
  std::filesystem::path path_;
  const std::byte* mapping_ = nullptr;
  size_t mapped_size_ = 0;
  SafetensorsHeader header_;
};

// Parses model.safetensors.index.json: weight_map (tensor name -> shard file name); other keys
// are ignored. Shard names must be plain file names in the same directory.
std::map<std::string, std::string> parse_safetensors_index(const std::string& json_text, const std::string& source);

// Every tensor of a checkpoint directory: model.safetensors, or the shards its index names.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& model_dir);

  struct Entry {
    const TensorInfo* info;
    const SafetensorsFile* file;
  };
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  const Entry* find(const std::string& name) const;
  std::span<const std::byte> data(const Entry& entry) const { return entry.file->data(*entry.info); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> tensors_;
};

}  // namespace deepfuse
