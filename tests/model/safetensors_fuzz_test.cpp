// Property test: corrupted safetensors inputs must give an Error or a fully valid file, never a
// crash, hang or out-of-bounds read (run this binary under ASan/UBSan to check the last part).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "model/safetensors.h"
#include "model_test_util.h"

namespace qs {
namespace {

using test::SafetensorsBuilder;

struct Outcome {
  int accepted = 0;
  int rejected = 0;
  int total() const { return accepted + rejected; }
  ~Outcome() {  // visible with --gtest_output=xml
    ::testing::Test::RecordProperty("accepted", accepted);
    ::testing::Test::RecordProperty("rejected", rejected);
  }
};

// Checks an accepted file from first principles: what the parser promised must hold.
void expect_fully_valid(const SafetensorsFile& f, size_t file_size) {
  ASSERT_LE(f.header_bytes() + 8 + f.data_bytes(), file_size);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const TensorInfo& t : f.tensors()) {
    ASSERT_LE(t.begin, t.end);
    ASSERT_LE(t.end, f.data_bytes());
    unsigned __int128 bits = t.element_bits;
    for (int64_t d : t.shape) {
      ASSERT_GE(d, 0);
      bits *= static_cast<uint64_t>(d);
    }
    ASSERT_EQ(bits % 8, 0u);
    ASSERT_EQ(bits / 8, t.end - t.begin) << t.name;
    if (t.begin != t.end) ranges.emplace_back(t.begin, t.end);
    ASSERT_EQ(f.find(t.name), &t);
    if (t.dtype) {
      auto v = f.tensor(t.name);
      ASSERT_TRUE(v.ok()) << v.error().message;
      ASSERT_EQ(v->nbytes, t.nbytes());
      // Touch every byte, so that an out-of-range view is caught by ASan.
      const auto* p = static_cast<const uint8_t*>(v->data);
      unsigned sum = 0;
      for (size_t i = 0; i < v->nbytes; ++i) sum += p[i];
      (void)sum;
    } else {
      ASSERT_FALSE(f.tensor(t.name).ok());
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) ASSERT_LE(ranges[i - 1].second, ranges[i].first);
}

// Parses from an exactly-sized heap copy (so that a read past the end is an ASan error).
void check_input(const std::string& input, Outcome& outcome) {
  std::vector<uint8_t> exact(input.begin(), input.end());
  auto f = SafetensorsFile::parse(exact, "fuzz.safetensors");
  if (f.ok()) {
    ++outcome.accepted;
    expect_fully_valid(*f, exact.size());
  } else {
    ++outcome.rejected;
    const std::string& m = f.error().message;
    ASSERT_EQ(m.rfind("fuzz.safetensors: ", 0), 0u) << m;
    ASSERT_EQ(m.find('\n'), std::string::npos) << m;
    ASSERT_LT(m.size(), 1000u) << m;
  }
}

std::string base_file() {
  return SafetensorsBuilder()
      .add("model.embed_tokens.weight", DType::BF16, {4, 3}, test::test_values(12, 1))
      .add("model.norm.weight", DType::F32, {3}, {1.0f, 2.0f, 3.0f})
      .add("lm_head.weight", DType::F16, {2, 3}, test::test_values(6, 2))
      .add_raw("q", "I8", {5}, "abcde")
      .add("scalar", DType::F32, {}, {9.0f})
      .metadata("format", "pt")
      .build();
}

std::string with_length(std::string file, uint64_t n) {
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return file;
}

TEST(SafetensorsFuzz, BaseFileIsValid) {
  Outcome o;
  check_input(base_file(), o);
  EXPECT_EQ(o.accepted, 1);
}

TEST(SafetensorsFuzz, EveryTruncationIsRejected) {
  const std::string base = base_file();
  Outcome o;
  for (size_t len = 0; len < base.size(); ++len) {
    check_input(base.substr(0, len), o);
    if (HasFatalFailure()) return;
  }
  // A shorter file always loses header or tensor bytes: nothing may be accepted.
  EXPECT_EQ(o.accepted, 0);
  EXPECT_EQ(o.rejected, static_cast<int>(base.size()));
}

TEST(SafetensorsFuzz, HeaderLengthValues) {
  const std::string base = base_file();
  uint64_t real = 0;
  for (int i = 7; i >= 0; --i) real = (real << 8) | static_cast<uint8_t>(base[i]);
  std::vector<uint64_t> lengths = {0,
                                   1,
                                   2,
                                   7,
                                   8,
                                   1ull << 31,
                                   1ull << 32,
                                   1ull << 63,
                                   ~0ull,
                                   ~0ull - 7,
                                   100'000'001,
                                   base.size(),
                                   base.size() - 7,
                                   base.size() - 8,
                                   base.size() - 9};
  for (int64_t d = -40; d <= 40; ++d) lengths.push_back(real + d);
  Outcome o;
  for (uint64_t n : lengths) {
    check_input(with_length(base, n), o);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(o.rejected, 0);
}

TEST(SafetensorsFuzz, RandomByteFlips) {
  const std::string base = base_file();
  const size_t header_end =
      8 + (static_cast<uint8_t>(base[0]) | (static_cast<uint8_t>(base[1]) << 8));
  std::mt19937 rng(12345);
  Outcome o;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = base;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      size_t pos;
      switch (rng() % 4) {
        case 0:
          pos = rng() % 8;
          break;  // the length
        case 1:
          pos = rng() % s.size();
          break;  // anywhere
        default:
          pos = 8 + rng() % (header_end - 8);
          break;  // the JSON
      }
      if (rng() % 2) {
        s[pos] = static_cast<char>(s[pos] ^ (1u << (rng() % 8)));
      } else {
        static const char kInteresting[] = "{}[]\",:0123456789-.e \\\x00\xff";
        s[pos] = kInteresting[rng() % (sizeof(kInteresting) - 1)];
      }
    }
    check_input(s, o);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(o.total(), 3000);
  EXPECT_GT(o.rejected, 1000);
}

// Headers built from random pieces: wrong types, bad/overlapping offsets, huge shapes, duplicate
// keys, unknown dtypes. The length prefix is always right, so the JSON layer is what is tested.
std::string random_value(std::mt19937& rng, int depth = 0) {
  switch (rng() % (depth > 2 ? 6 : 9)) {
    case 0:
      return std::to_string(static_cast<int64_t>(rng() % 64) - 8);
    case 1:
      return "18446744073709551615";
    case 2:
      return "-9223372036854775808";
    case 3:
      return "\"F32\"";
    case 4:
      return "1.5e300";
    case 5:
      return (rng() % 2) ? "null" : "true";
    case 6:
      return "[" + random_value(rng, depth + 1) + ", " + random_value(rng, depth + 1) + "]";
    case 7:
      return "{\"k\": " + random_value(rng, depth + 1) + "}";
    default:
      return "\"\\u00e9\\n\"";
  }
}

std::string random_entry(std::mt19937& rng, uint64_t data_size) {
  static const char* kDtypes[] = {"F32",  "F16", "BF16",    "I8", "U8", "F64",
                                  "BOOL", "F4",  "F6_E2M3", "X",  "",   "f32"};
  auto dim = [&]() -> std::string {
    switch (rng() % 6) {
      case 0:
        return "0";
      case 1:
        return "4294967296";
      case 2:
        return "-1";
      default:
        return std::to_string(1 + rng() % 6);
    }
  };
  auto offset = [&]() -> std::string {
    switch (rng() % 5) {
      case 0:
        return std::to_string(data_size + rng() % 4);
      case 1:
        return "18446744073709551615";
      default:
        return std::to_string(rng() % (data_size + 1));
    }
  };
  std::string e = "{";
  std::vector<std::string> fields;
  if (rng() % 10)
    fields.push_back(
        std::string("\"dtype\": ") +
        (rng() % 8 ? "\"" + std::string(kDtypes[rng() % 12]) + "\"" : random_value(rng)));
  if (rng() % 10) {
    std::string shape = "[";
    int rank = static_cast<int>(rng() % 4);
    for (int i = 0; i < rank; ++i) shape += (i ? ", " : "") + dim();
    fields.push_back("\"shape\": " + (rng() % 8 ? shape + "]" : random_value(rng)));
  }
  if (rng() % 10) {
    std::string off = rng() % 8 ? "[" + offset() + ", " + offset() + "]" : random_value(rng);
    fields.push_back("\"data_offsets\": " + off);
  }
  if (rng() % 8 == 0 && !fields.empty()) fields.push_back(fields[rng() % fields.size()]);  // dup
  std::shuffle(fields.begin(), fields.end(), rng);
  for (size_t i = 0; i < fields.size(); ++i) e += (i ? ", " : "") + fields[i];
  return e + "}";
}

TEST(SafetensorsFuzz, RandomStructuredHeaders) {
  std::mt19937 rng(777);
  Outcome o;
  for (int iter = 0; iter < 3000; ++iter) {
    const uint64_t data_size = rng() % 64;
    std::string header = "{";
    int n = static_cast<int>(rng() % 5);
    for (int i = 0; i < n; ++i) {
      std::string name = "__metadata__";
      if (rng() % 6) name = std::string(1, 't') += std::to_string(rng() % 6);
      std::string value = rng() % 10 ? random_entry(rng, data_size) : random_value(rng);
      if (name == "__metadata__" && rng() % 2) value = "{\"format\": \"pt\"}";
      if (i > 0) header += ", ";
      header.append("\"").append(name).append("\": ").append(value);
    }
    header += "}";
    if (rng() % 20 == 0) header.insert(rng() % header.size(), 1, static_cast<char>(rng() % 256));
    if (rng() % 20 == 0) header.erase(rng() % header.size(), 1);
    std::string data(data_size, '\x5a');
    check_input(SafetensorsBuilder::assemble(header, data, rng() % 4 != 0), o);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(o.total(), 3000);
  // The generator must produce both outcomes, or it tests nothing.
  EXPECT_GT(o.accepted, 50);
  EXPECT_GT(o.rejected, 1000);
}

}  // namespace
}  // namespace qs
