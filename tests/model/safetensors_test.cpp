#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "model_test_util.h"

namespace qs {
namespace {

using test::SafetensorsBuilder;

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Result<SafetensorsFile> parse(const std::string& bytes) {
  return SafetensorsFile::parse(as_bytes(bytes), "model.safetensors");
}

// Parses bytes expected to be rejected and returns the message.
std::string error_of(const std::string& bytes) {
  auto r = parse(bytes);
  EXPECT_FALSE(r.ok()) << "accepted an invalid file";
  return r.ok() ? "" : r.error().message;
}

std::string with_header(const std::string& header, size_t data_bytes) {
  return SafetensorsBuilder::assemble(header, std::string(data_bytes, '\x11'));
}

TEST(Safetensors, ParsesEveryComputeDtype) {
  const std::vector<float> values = {1.0f, -2.5f, 0.125f, 3.0f, -0.0f, 65504.0f};
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::string bytes = SafetensorsBuilder()
                            .add("a", dt, {2, 3}, values)
                            .add("b", dt, {3}, {7.0f, 8.0f, 9.0f})
                            .metadata("format", "pt")
                            .build();
    auto f = parse(bytes);
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_EQ(f->tensors().size(), 2u);
    EXPECT_EQ(f->metadata().at("format"), "pt");
    auto a = f->tensor("a");
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->dtype, dt);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a->numel(), 6);
    EXPECT_EQ(a->nbytes, 6 * dtype_size(dt));
    std::vector<float> got(6);
    to_f32(a->dtype, a->data, got.data(), got.size());
    for (size_t i = 0; i < values.size(); ++i) {
      float expect = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(values[i])) : values[i];
      EXPECT_EQ(got[i], expect) << i;
    }
    auto b = f->tensor("b");
    ASSERT_TRUE(b.ok());
    to_f32(b->dtype, b->data, got.data(), 3);
    EXPECT_EQ(got[2], 9.0f);
    EXPECT_EQ(f->find("c"), nullptr);
    auto c = f->tensor("c");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().message, "model.safetensors: no tensor 'c'");
  }
}

TEST(Safetensors, OpensFromDiskAndSurvivesMoves) {
  test::TempDir dir;
  test::write_file(dir.path() / "x.safetensors",
                   SafetensorsBuilder().add("w", DType::F32, {2}, {1.5f, -1.5f}).build());
  auto f = SafetensorsFile::open(dir.path() / "x.safetensors");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->source(), "x.safetensors");
  SafetensorsFile moved = std::move(f).value();
  auto w = moved.tensor("w");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(static_cast<const float*>(w->data)[1], -1.5f);

  auto missing = SafetensorsFile::open(dir.path() / "nope.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("nope.safetensors: no such file"), std::string::npos);
}

TEST(Safetensors, ScalarsAndEmptyTensors) {
  std::string bytes = SafetensorsBuilder()
                          .add("scalar", DType::F32, {}, {4.0f})
                          .add("empty", DType::F16, {0, 5}, {})
                          .add("empty2", DType::F32, {3, 0}, {})
                          .build();
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto s = f->tensor("scalar");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(*static_cast<const float*>(s->data), 4.0f);
  auto e = f->tensor("empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
  EXPECT_EQ(e->nbytes, 0u);
}

TEST(Safetensors, UnsupportedDtypesParseButCannotBeUsed) {
  std::string bytes = SafetensorsBuilder()
                          .add_raw("q", "I8", {4}, std::string(4, '\x01'))
                          .add_raw("d", "F64", {1}, std::string(8, '\0'))
                          .add_raw("f8", "F8_E4M3", {2}, std::string(2, '\0'))
                          .add_raw("f4", "F4", {4}, std::string(2, '\0'))
                          .add("w", DType::BF16, {2}, {1.0f, 2.0f})
                          .build();
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const TensorInfo* q = f->find("q");
  ASSERT_NE(q, nullptr);
  EXPECT_FALSE(q->dtype.has_value());
  EXPECT_EQ(q->dtype_name, "I8");
  EXPECT_EQ(f->raw_bytes(*q).size(), 4u);
  auto qv = f->tensor("q");
  ASSERT_FALSE(qv.ok());
  EXPECT_EQ(qv.error().message,
            "model.safetensors: tensor 'q' has dtype I8; supported: F32, F16, BF16");
  EXPECT_TRUE(f->tensor("w").ok());
}

TEST(Safetensors, MisalignedTensorsAreCopiedToAlignedMemory) {
  // A 3-byte U8 tensor first pushes the F32 tensor to offset 3.
  SafetensorsBuilder b;
  b.add_raw("pad", "U8", {3}, "abc").add("w", DType::F32, {3}, {1.0f, 2.0f, 3.0f});
  std::string bytes = b.build();
  // Keep the buffer 8-aligned so that the data section offset decides the alignment.
  std::vector<uint64_t> storage((bytes.size() + 7) / 8);
  std::memcpy(storage.data(), bytes.data(), bytes.size());
  auto f = SafetensorsFile::parse({reinterpret_cast<const uint8_t*>(storage.data()), bytes.size()},
                                  "m.safetensors");
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto w = f->tensor("w");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % 4, 0u);
  const float* p = static_cast<const float*>(w->data);
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[2], 3.0f);
  auto again = f->tensor("w");
  EXPECT_EQ(again->data, w->data);  // copied once
}

TEST(Safetensors, RejectsShortFilesAndBadHeaderLengths) {
  EXPECT_EQ(error_of(""), "model.safetensors: file is 0 bytes, too short for a safetensors header");
  EXPECT_EQ(error_of("abc"),
            "model.safetensors: file is 3 bytes, too short for a safetensors header");
  std::string huge(8, '\xff');
  huge += "{}";
  EXPECT_EQ(error_of(huge),
            "model.safetensors: header length 18446744073709551615 exceeds the 2 bytes after it");
  std::string zero(8, '\0');
  EXPECT_EQ(error_of(zero),
            "model.safetensors: header does not start with '{' (not a safetensors file?)");
}

TEST(Safetensors, RejectsInvalidJson) {
  EXPECT_NE(
      error_of(with_header("{\"a\": ", 0)).find("model.safetensors: header is not valid JSON"),
      std::string::npos);
  EXPECT_EQ(
      error_of(with_header("{\"a\": 1} x", 0)).find("model.safetensors: header is not valid JSON"),
      0u);
  EXPECT_EQ(error_of(with_header("[1, 2]", 0)),
            "model.safetensors: header does not start with '{' (not a safetensors file?)");
  EXPECT_EQ(error_of(with_header("{\"a\": 1, \"a\": 2}", 0)),
            "model.safetensors: header has duplicate key 'a'");
  std::string deep = "{\"x\": " + std::string(200, '[') + std::string(200, ']') + "}";
  EXPECT_EQ(error_of(with_header(deep, 0)),
            "model.safetensors: header nests deeper than 16 levels");
}

TEST(Safetensors, RejectsMalformedEntries) {
  const std::string w = "model.safetensors: tensor 'w': ";
  EXPECT_EQ(error_of(with_header(R"({"w": 5})", 0)),
            w + "expected an object {dtype, shape, data_offsets}, got number");
  EXPECT_EQ(error_of(with_header(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4)),
            w + "missing string field 'dtype'");
  EXPECT_EQ(
      error_of(with_header(R"({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}})", 4)),
      w + "unknown dtype 'Q4'");
  EXPECT_EQ(error_of(with_header(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4)),
            w + "missing array field 'shape'");
  EXPECT_EQ(
      error_of(with_header(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)),
      w + "shape must hold non-negative integers, got -1");
  EXPECT_EQ(error_of(with_header(
                R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4)),
            w + "shape must hold non-negative integers, got 1.5");
  EXPECT_EQ(error_of(with_header(R"({"w": {"dtype": "F32", "shape": [1]}})", 4)),
            w + "'data_offsets' must be [begin, end] with non-negative integers");
  EXPECT_EQ(
      error_of(with_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4)),
      w + "'data_offsets' must be [begin, end] with non-negative integers");
  EXPECT_EQ(
      error_of(with_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4)),
      w + "'data_offsets' must be [begin, end] with non-negative integers");
  EXPECT_EQ(
      error_of(with_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4)),
      w + "data_offsets [4, 0] end before they begin");
  EXPECT_EQ(
      error_of(with_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})", 4)),
      w + "data_offsets [0, 8] exceed the data section (4 bytes)");
  EXPECT_EQ(
      error_of(with_header(R"({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", 4)),
      w + "F4 [3] is not a whole number of bytes");
  EXPECT_EQ(error_of(with_header(R"({"__metadata__": {"a": 1}})", 0)),
            "model.safetensors: '__metadata__' value 'a' must be a string, got number");
  EXPECT_EQ(error_of(with_header(R"({"__metadata__": [1]})", 0)),
            "model.safetensors: '__metadata__' must be an object");
}

TEST(Safetensors, RejectsSizeMismatchWithTheSpecMessage) {
  EXPECT_EQ(
      error_of(with_header(
          R"({"lm_head.weight": {"dtype": "BF16", "shape": [8, 8], "data_offsets": [0, 100]}})",
          128)),
      "model.safetensors: tensor 'lm_head.weight': data_offsets [0, 100] hold 100 bytes, "
      "BF16 [8, 8] needs 128");
}

TEST(Safetensors, RejectsShapeOverflow) {
  // 2^32 * 2^32 elements overflow 64 bits.
  EXPECT_EQ(
      error_of(with_header(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
          0)),
      "model.safetensors: tensor 'w': shape [4294967296, 4294967296] is too large");
  // 2^62 elements fit in 64 bits, 2^62 * 32 bits does not.
  EXPECT_EQ(
      error_of(with_header(
          R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0)),
      "model.safetensors: tensor 'w': shape [4611686018427387904] is too large");
  EXPECT_EQ(
      error_of(with_header(
          R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 0]}})", 0)),
      "model.safetensors: tensor 'w': shape [18446744073709551615] is too large");
  // A zero dimension makes the product 0 whatever the others are (but each must be sane).
  EXPECT_TRUE(
      parse(with_header(
                R"({"w": {"dtype": "F32", "shape": [0, 4294967296], "data_offsets": [0, 0]}})", 0))
          .ok());
}

TEST(Safetensors, RejectsOverlaps) {
  EXPECT_EQ(error_of(with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                 12)),
            "model.safetensors: tensors 'a' [0, 8] and 'b' [4, 12] overlap");
  EXPECT_EQ(error_of(with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                                    "b": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}})",
                                 8)),
            "model.safetensors: tensors 'a' [4, 8] and 'b' [4, 8] overlap");
  // Touching ranges, empty tensors anywhere and holes are fine.
  EXPECT_TRUE(parse(with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                                   "c": {"dtype": "F32", "shape": [0], "data_offsets": [2, 2]},
                                   "d": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})",
                                16))
                  .ok());
}

TEST(Safetensors, NamesInMessagesAreOneLine) {
  std::string header =
      "{\"bad\\nname\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 2]}}";
  std::string msg = error_of(with_header(header, 4));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_NE(msg.find("'bad\\x0aname'"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// Sharded sets

TEST(SafetensorsSet, OpensIndexAndFindsEachTensorInItsShard) {
  test::TempDir dir;
  test::write_file(dir.path() / "s1.safetensors",
                   SafetensorsBuilder().add("a", DType::F32, {1}, {1.0f}).build());
  test::write_file(dir.path() / "s2.safetensors", SafetensorsBuilder()
                                                      .add("b", DType::F32, {1}, {2.0f})
                                                      .add("c", DType::F32, {1}, {3.0f})
                                                      .build());
  test::write_file(dir.path() / "model.safetensors.index.json",
                   R"({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors",
                                                      "c": "s2.safetensors"}})");
  auto set = SafetensorsSet::open_dir(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message;
  EXPECT_EQ(set->source(), "model.safetensors.index.json");
  EXPECT_EQ(set->files().size(), 2u);  // each shard opened once
  for (auto [name, value] : {std::pair{"a", 1.0f}, {"b", 2.0f}, {"c", 3.0f}}) {
    auto t = set->tensor(name);
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(*static_cast<const float*>(t->data), value);
  }
  EXPECT_EQ(set->file_for("a")->source(), "s1.safetensors");
  EXPECT_EQ(set->file_for("c")->source(), "s2.safetensors");
  auto missing = set->tensor("zz");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "model.safetensors.index.json: missing tensor 'zz'");
}

TEST(SafetensorsSet, IndexErrors) {
  test::TempDir dir;
  const auto index = dir.path() / "model.safetensors.index.json";
  test::write_file(dir.path() / "s1.safetensors",
                   SafetensorsBuilder().add("a", DType::F32, {1}, {1.0f}).build());
  auto message = [&](const std::string& index_text) {
    test::write_file(index, index_text);
    auto set = SafetensorsSet::open_index(index);
    EXPECT_FALSE(set.ok());
    return set.ok() ? std::string() : set.error().message;
  };
  EXPECT_EQ(
      message(R"({"weight_map": {"a": "s1.safetensors", "b": "s9.safetensors"}})"),
      "model.safetensors.index.json: shard 's9.safetensors' (holding tensor 'b') not found: " +
          (dir.path() / "s9.safetensors").string());
  EXPECT_EQ(message(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})"),
            "s1.safetensors: no tensor 'b', though model.safetensors.index.json maps it to this "
            "shard");
  EXPECT_EQ(message(R"({"weight_map": {"a": "../s1.safetensors"}})"),
            "model.safetensors.index.json: weight_map['a'] = '../s1.safetensors' is not a plain "
            "file name");
  EXPECT_EQ(message(R"({"weight_map": {"a": 3}})"),
            "model.safetensors.index.json: weight_map['a'] must be a shard file name, got number");
  EXPECT_EQ(message(R"({"metadata": {}})"),
            "model.safetensors.index.json: missing object 'weight_map' {tensor name: shard file}");
  EXPECT_EQ(message(R"({"weight_map": {}})"),
            "model.safetensors.index.json: 'weight_map' is empty");
  EXPECT_EQ(message("{\"weight_map\": "), message("{\"weight_map\": "));
  EXPECT_EQ(message("{\"weight_map\": ").find("model.safetensors.index.json is not valid JSON"),
            0u);

  // A broken shard reports itself.
  test::write_file(dir.path() / "s2.safetensors", "garbage!garbage!");
  EXPECT_EQ(message(R"({"weight_map": {"a": "s2.safetensors"}})").find("s2.safetensors: header"),
            0u);
}

TEST(SafetensorsSet, OpenDirErrors) {
  test::TempDir dir;
  auto none = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message,
            dir.path().string() +
                ": no model.safetensors or model.safetensors.index.json in this directory");
  auto not_dir = SafetensorsSet::open_dir(dir.path() / "missing");
  ASSERT_FALSE(not_dir.ok());
  EXPECT_EQ(not_dir.error().message, (dir.path() / "missing").string() + ": not a directory");
  // model.safetensors wins over an index, as in transformers.
  test::write_file(dir.path() / "model.safetensors",
                   SafetensorsBuilder().add("a", DType::F32, {1}, {1.0f}).build());
  test::write_file(dir.path() / "model.safetensors.index.json", "not json");
  auto single = SafetensorsSet::open_dir(dir.path());
  ASSERT_TRUE(single.ok()) << single.error().message;
  EXPECT_EQ(single->source(), "model.safetensors");
}

}  // namespace
}  // namespace qs
