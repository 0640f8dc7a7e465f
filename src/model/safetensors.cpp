// Strict safetensors header parsing. Checks, in order: the length prefix fits the file and the
// size limit; the header is one UTF-8 JSON object without duplicate keys; every entry has a known
// dtype, a shape whose byte size does not overflow and equals its offset range; the ranges tile
// the data section exactly (from 0, no gaps, no overlaps, nothing after the last tensor).
#include <algorithm>
#include <array>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse {

namespace {

struct DTypeEntry {
  SafetensorsDType dtype;
  const char* name;
  size_t size;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {SafetensorsDType::BOOL, "BOOL", 1}, {SafetensorsDType::U8, "U8", 1},   {SafetensorsDType::I8, "I8", 1},
    {SafetensorsDType::F8_E4M3, "F8_E4M3", 1}, {SafetensorsDType::F8_E5M2, "F8_E5M2", 1},
    {SafetensorsDType::I16, "I16", 2},   {SafetensorsDType::U16, "U16", 2}, {SafetensorsDType::F16, "F16", 2},
    {SafetensorsDType::BF16, "BF16", 2}, {SafetensorsDType::I32, "I32", 4}, {SafetensorsDType::U32, "U32", 4},
    {SafetensorsDType::F32, "F32", 4},   {SafetensorsDType::I64, "I64", 8}, {SafetensorsDType::U64, "U64", 8},
    {SafetensorsDType::F64, "F64", 8},
}};

const DTypeEntry& dtype_entry(SafetensorsDType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry;
  throw Error("unknown dtype enum value");
}

using nlohmann::json;

// nlohmann::json keeps the last of duplicate keys silently; the parser callback sees every key,
// so a stack of per-object key sets catches duplicates at any depth.
json parse_header_json(std::string_view text, const std::string& source) {
  std::vector<std::set<std::string>> keys_per_object;
  auto reject_duplicates = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys_per_object.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys_per_object.pop_back();
    } else if (event == json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      DF_CHECK(keys_per_object.back().insert(key).second, source + ": duplicate key '" + key + "' in the header");
    }
    return true;
  };
  try {
    return json::parse(text, reject_duplicates);
  } catch (const json::exception& e) {
    throw Error(source + ": header is not valid UTF-8 JSON (" + e.what() + ")");
  }
}

uint64_t read_u64(const json& value, const std::string& what) {
  DF_CHECK(value.is_number_unsigned(), what + " must be a non-negative integer (got " + value.dump() + ")");
  return value.get<uint64_t>();
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, const std::string& source) {
  const std::string where = source + ": tensor '" + name + "'";
  DF_CHECK(entry.is_object(), where + " must be an object");
  for (const auto& [key, unused] : entry.items())
    DF_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where + ": unexpected field '" + key + "'");
  DF_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), where + ": field 'dtype' must be a string");
  DF_CHECK(entry.contains("shape") && entry["shape"].is_array(), where + ": field 'shape' must be a list");
  DF_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2,
           where + ": field 'data_offsets' must be a list [begin, end]");

  TensorInfo info;
  info.name = name;
  const std::string dtype = entry["dtype"].get<std::string>();
  const auto known = std::find_if(kDTypes.begin(), kDTypes.end(), [&](const auto& e) { return dtype == e.name; });
  DF_CHECK(known != kDTypes.end(), where + ": unknown dtype '" + dtype + "'");
  info.dtype = known->dtype;

  uint64_t bytes = known->size;
  for (const json& dim : entry["shape"]) {
    const uint64_t extent = read_u64(dim, where + ": shape entry");
    DF_CHECK(extent <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(bytes, extent, &bytes),
             where + ": shape " + entry["shape"].dump() + " overflows 64-bit byte counts");
    info.shape.push_back(static_cast<int64_t>(extent));
  }
  info.data_begin = read_u64(entry["data_offsets"][0], where + ": data_offsets begin");
  info.data_end = read_u64(entry["data_offsets"][1], where + ": data_offsets end");
  DF_CHECK(info.data_begin <= info.data_end, where + ": data_offsets end is before begin");
  DF_CHECK(info.data_end - info.data_begin == bytes,
           where + ": data_offsets span " + std::to_string(info.data_end - info.data_begin) + " bytes but dtype " +
               dtype + " with shape " + entry["shape"].dump() + " needs " + std::to_string(bytes));
  return info;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& source) {
  DF_CHECK(value.is_object(), source + ": '__metadata__' must be an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    DF_CHECK(item.is_string(), source + ": '__metadata__' entry '" + key + "' must be a string");
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// The data ranges, sorted, must tile [0, data_size) exactly.
void check_offsets_tile_the_data(std::vector<TensorInfo>& tensors, uint64_t data_size, const std::string& source) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  uint64_t expected_begin = 0;
  for (const TensorInfo& t : tensors) {
    DF_CHECK(t.data_begin >= expected_begin, source + ": tensor '" + t.name + "' overlaps the tensor before it");
    DF_CHECK(t.data_begin == expected_begin, source + ": gap in the data before tensor '" + t.name + "' (offset " +
                                                 std::to_string(expected_begin) + " to " +
                                                 std::to_string(t.data_begin) + " unused)");
    expected_begin = t.data_end;
  }
  DF_CHECK(expected_begin <= data_size, source + ": tensor data runs past the end of the file (needs " +
                                            std::to_string(expected_begin) + " bytes, file has " +
                                            std::to_string(data_size) + ")");
  DF_CHECK(expected_begin == data_size, source + ": " + std::to_string(data_size - expected_begin) +
                                            " trailing bytes after the last tensor");
}

}  // namespace

const char* dtype_name(SafetensorsDType dtype) { return dtype_entry(dtype).name; }
size_t dtype_size(SafetensorsDType dtype) { return dtype_entry(dtype).size; }

uint64_t TensorInfo::element_count() const {
  uint64_t count = 1;
  for (int64_t extent : shape) count *= static_cast<uint64_t>(extent);  // validated not to overflow
  return count;
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& source) {
  DF_CHECK(file.size() >= 8, source + ": truncated file (" + std::to_string(file.size()) +
                                 " bytes; a safetensors file starts with an 8-byte header length)");
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = header_length << 8 | std::to_integer<uint64_t>(file[i]);
  DF_CHECK(header_length <= kMaxSafetensorsHeaderBytes,
           source + ": header length " + std::to_string(header_length) + " exceeds the 100 MB limit");
  DF_CHECK(header_length <= file.size() - 8, source + ": header length " + std::to_string(header_length) +
                                                 " runs past the end of the file (" + std::to_string(file.size()) +
                                                 " bytes)");
  const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, header_length);
  DF_CHECK(!text.empty() && text.front() == '{', source + ": header must be a JSON object starting with '{'");
  const json header = parse_header_json(text, source);
  DF_CHECK(header.is_object(), source + ": header must be a JSON object");

  SafetensorsHeader result;
  result.data_start = 8 + header_length;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      result.metadata = parse_metadata(entry, source);
    } else {
      result.tensors.push_back(parse_tensor_entry(name, entry, source));
    }
  }
  check_offsets_tile_the_data(result.tensors, file.size() - result.data_start, source);
  return result;
}

}  // namespace deepfuse
