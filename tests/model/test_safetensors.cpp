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
  expect_error([] { parse_safetensors(bytes_of(safetensors_image("{}", 0, 1000)), "m.safetensors"); },
               {"m.safetensors", "header length 1000", "past the end"});
  expect_error([] { parse_safetensors(bytes_of(safetensors_image("{}", 0, 200'000'000)), "m.safetensors"); },
               {"m.safetensors", "100 MB"});
  expect_error([] { parse_safetensors(bytes_of(safetensors_image("{}", 0, UINT64_MAX - 1)), "m.safetensors"); },
               {"m.safetensors", "100 MB"});
}

TEST(Safetensors, InvalidJsonOrUtf8) {
  expect_error([] { parse_safetensors(bytes_of(safetensors_image(R"({"a": )", 0)), "m.safetensors"); },
               {"m.safetensors", "JSON"});
  expect_error([] { parse_safetensors(bytes_of(safetensors_image("{\"\xff\xfe\":1}", 0)), "m.safetensors"); },
               {"m.safetensors", "UTF-8"});
  expect_error([] { parse_safetensors(bytes_of(safetensors_image("[1, 2]", 0)), "m.safetensors"); },
               {"m.safetensors", "object"});
}

TEST(Safetensors, UnknownDtype) {
  const std::string header = R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,2]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(header, 2)), "m.safetensors"); },
               {"m.safetensors", "tensor 'w'", "unknown dtype 'F17'"});
}

TEST(Safetensors, ShapeOverflowAndSizeMismatch) {
  const std::string overflow =
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(overflow, 4)), "m.safetensors"); },
               {"tensor 'w'", "overflows"});
  const std::string mismatch = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(mismatch, 8)), "m.safetensors"); },
               {"tensor 'w'", "needs 12"});
  const std::string negative = R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(negative, 4)), "m.safetensors"); },
               {"tensor 'w'", "non-negative"});
}

TEST(Safetensors, OverlappingGappedAndTrailingOffsets) {
  const std::string overlap = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(overlap, 6)), "m.safetensors"); },
               {"m.safetensors", "tensor 'b'", "overlaps"});
  const std::string gap = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(gap, 8)), "m.safetensors"); },
               {"m.safetensors", "gap", "tensor 'b'"});
  const std::string late_start = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(late_start, 6)), "m.safetensors"); },
               {"gap", "tensor 'a'"});
  const std::string one = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(one, 7)), "m.safetensors"); },
               {"m.safetensors", "3 trailing bytes"});
}

TEST(Safetensors, DuplicateNamesAndKeys) {
  const std::string duplicate = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(duplicate, 2)), "m.safetensors"); },
               {"m.safetensors", "duplicate key 'a'"});
  const std::string inner = R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  expect_error([&] { parse_safetensors(bytes_of(safetensors_image(inner, 1)), "m.safetensors"); },
               {"duplicate key 'dtype'"});
}

TEST(Safetensors, MalformedEntriesAndMetadata) {
  auto parse = [](const std::string& header, size_t data) {
    return [=] { parse_safetensors(bytes_of(safetensors_image(header, data)), "m.safetensors"); };
  };
  expect_error(parse(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'", "string"});
  expect_error(parse(R"({"__metadata__":[]})", 0), {"__metadata__"});
  expect_error(parse(R"({"w":{"dtype":"U8","shape":[1]}})", 1), {"tensor 'w'", "data_offsets"});
  expect_error(parse(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", 1), {"tensor 'w'", "before begin"});
  expect_error(parse(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0}})", 1), {"tensor 'w'", "'x'"});
  expect_error(parse(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1), {"tensor 'w'", "shape"});
  expect_error(parse(R"({"w":3})", 0), {"tensor 'w'", "object"});
}

}  // namespace
}  // namespace deepfuse
