// safetensors parsing: a valid file reads back; every malformed case is one error naming the file
// and the offending tensor or field.
#include <gtest/gtest.h>

#include "deepfuse/safetensors.hpp"
#include "model/model_test_util.hpp"

namespace deepfuse {
namespace {

using testing::bytes_of;
using testing::expect_error;
using testing::safetensors_image;

// A call that parses the image of `header` + `data_bytes` as m.safetensors.
auto parsing(const std::string& header, size_t data_bytes, uint64_t header_length = UINT64_MAX) {
  return [=] { parse_safetensors(bytes_of(safetensors_image(header, data_bytes, header_length)), "m.safetensors"); };
}

const std::string kTwoTensors =
    R"({"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},)"
    R"("a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";

TEST(Safetensors, ValidHeaderParsesInDataOrder) {
  const std::string file = safetensors_image(kTwoTensors, 14);
  const SafetensorsHeader header = parse_safetensors(bytes_of(file), "x.safetensors");
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors[0].name, "a");
  EXPECT_EQ(header.tensors[0].dtype, SafetensorsDType::F32);
  EXPECT_EQ(header.tensors[0].shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(header.tensors[1].name, "b");
  EXPECT_EQ(header.tensors[1].data_begin, 8u);
  EXPECT_EQ(header.tensors[1].element_count(), 3u);
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(header.data_start, 8 + kTwoTensors.size());
}

TEST(Safetensors, ZeroSizedTensorsAndEmptyHeaderAreValid) {
  const std::string header = R"({"e":{"dtype":"F16","shape":[0,5],"data_offsets":[0,0]}})";
  EXPECT_EQ(parse_safetensors(bytes_of(safetensors_image(header, 0)), "x").tensors.size(), 1u);
  EXPECT_TRUE(parse_safetensors(bytes_of(safetensors_image("{}", 0)), "x").tensors.empty());
}

TEST(Safetensors, TruncatedFile) {
  expect_error([] { parse_safetensors(bytes_of(std::string("\x05\x00\x00", 3)), "m.safetensors"); },
               {"m.safetensors", "truncated"});
  // A valid image cut short inside the data: the last tensor runs past the end.
  const std::string file = safetensors_image(kTwoTensors, 14);
  expect_error([&] { parse_safetensors(bytes_of(file.substr(0, file.size() - 3)), "m.safetensors"); },
               {"m.safetensors", "past the end"});
}

TEST(Safetensors, HeaderLengthPastEndOrTooLarge) {
  expect_error(parsing("{}", 0, 1000), {"m.safetensors", "header length 1000", "past the end"});
  expect_error(parsing("{}", 0, 200'000'000), {"m.safetensors", "100 MB"});
  expect_error(parsing("{}", 0, UINT64_MAX - 1), {"m.safetensors", "100 MB"});
}

TEST(Safetensors, InvalidJsonOrUtf8) {
  expect_error(parsing(R"({"a": )", 0), {"m.safetensors", "JSON"});
  expect_error(parsing("{\"\xff\xfe\":1}", 0), {"m.safetensors", "UTF-8"});
  expect_error(parsing("[1, 2]", 0), {"m.safetensors", "object"});
}

TEST(Safetensors, UnknownDtype) {
  const std::string header = R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,2]}})";
  expect_error(parsing(header, 2), {"m.safetensors", "tensor 'w'", "unknown dtype 'F17'"});
}

TEST(Safetensors, ShapeOverflowAndSizeMismatch) {
  const std::string overflow =
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})";
  expect_error(parsing(overflow, 4), {"tensor 'w'", "overflows"});
  const std::string mismatch = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect_error(parsing(mismatch, 8), {"tensor 'w'", "needs 12"});
  const std::string negative = R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})";
  expect_error(parsing(negative, 4), {"tensor 'w'", "non-negative"});
}

TEST(Safetensors, OverlappingGappedAndTrailingOffsets) {
  const std::string overlap = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  expect_error(parsing(overlap, 6), {"m.safetensors", "tensor 'b'", "overlaps"});
  const std::string gap = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})";
  expect_error(parsing(gap, 8), {"m.safetensors", "gap", "tensor 'b'"});
  const std::string late_start = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  expect_error(parsing(late_start, 6), {"gap", "tensor 'a'"});
  const std::string one = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  expect_error(parsing(one, 7), {"m.safetensors", "3 trailing bytes"});
}

TEST(Safetensors, DuplicateNamesAndKeys) {
  const std::string duplicate = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_error(parsing(duplicate, 2), {"m.safetensors", "duplicate key 'a'"});
  const std::string inner = R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  expect_error(parsing(inner, 1), {"duplicate key 'dtype'"});
}

TEST(Safetensors, MalformedEntriesAndMetadata) {
  expect_error(parsing(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'", "string"});
  expect_error(parsing(R"({"__metadata__":[]})", 0), {"__metadata__"});
  expect_error(parsing(R"({"w":{"dtype":"U8","shape":[1]}})", 1), {"tensor 'w'", "data_offsets"});
  expect_error(parsing(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", 1), {"tensor 'w'", "before begin"});
  expect_error(parsing(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0}})", 1), {"tensor 'w'", "'x'"});
  expect_error(parsing(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1), {"tensor 'w'", "shape"});
  expect_error(parsing(R"({"w":3})", 0), {"tensor 'w'", "object"});
}

}  // namespace
}  // namespace deepfuse
