// A fresh, empty directory under the system temp dir for one test, removed at the end. The name
// carries the process id and the running gtest's name, so parallel ctest runs never collide.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

namespace starling::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
    path = std::filesystem::temp_directory_path() /
           ("starling-" + tag + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(std::hash<std::string>{}(test)));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace starling::test
