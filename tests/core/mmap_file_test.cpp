#include "core/mmap_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace qs {
namespace {

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("qs_core_mmap_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path write(const std::string& name, const std::string& bytes) {
    auto p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(MappedFileTest, MapsTheWholeFile) {
  std::string content = "hello\0world", big(100000, 'x');
  content += big;
  auto f = MappedFile::open(write("a.bin", content));
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_EQ(f->size(), content.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), f->size()), content);
  EXPECT_EQ(f->bytes().size(), content.size());
  EXPECT_EQ(f->path().filename(), "a.bin");
}

TEST_F(MappedFileTest, MoveKeepsTheMapping) {
  auto f = MappedFile::open(write("a.bin", "abcdef"));
  ASSERT_TRUE(f.ok());
  const uint8_t* p = f->data();
  MappedFile a = std::move(f).value();
  EXPECT_EQ(a.data(), p);
  MappedFile b;
  b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 6u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT: moved-from is empty by contract
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data()[5], 'f');
}

TEST_F(MappedFileTest, Errors) {
  auto missing = MappedFile::open(dir_ / "missing.bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, (dir_ / "missing.bin").string() + ": no such file");

  auto empty = MappedFile::open(write("empty.bin", ""));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().message, (dir_ / "empty.bin").string() + ": file is empty");

  auto directory = MappedFile::open(dir_);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.error().message, dir_.string() + ": is a directory, expected a file");
}

TEST_F(MappedFileTest, UnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root can read any file";
  auto p = write("secret.bin", "xyz");
  ::chmod(p.c_str(), 0);
  auto f = MappedFile::open(p);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().message, p.string() + ": cannot open: Permission denied");
}

}  // namespace
}  // namespace qs
