// Running the `deepfuse` binary from tests (DEEPFUSE_CLI is its path, set by tests.cmake; the
// environment variable DEEPFUSE_CLI overrides it for binaries carried to another machine, see
// scripts/device/gpu.sh --bin) and reading what it printed: shared by the CPU CLI tests and the CUDA
// backend's CLI tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "model/model_test_util.hpp"

namespace deepfuse::testing {

struct RunResult {
  int exit_code;
  std::string out, err;
};

// Runs `deepfuse ARGS` through the shell, stdout and stderr captured into files under `dir`.
inline RunResult run_cli(const ScratchDir& dir, const std::string& args) {
  const auto out = dir.path() / "stdout.txt", err = dir.path() / "stderr.txt";
  const char* moved = std::getenv("DEEPFUSE_CLI");
  const std::string binary = moved ? moved : DEEPFUSE_CLI;
  const std::string command = binary + " " + args + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text_file(out), read_text_file(err)};
}

// Exit code 2, nothing on stdout, exactly one stderr line containing every part.
inline void expect_bad_input(const RunResult& result, std::initializer_list<std::string> parts) {
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_EQ(result.out, "");
  ASSERT_FALSE(result.err.empty());
  EXPECT_EQ(result.err.find('\n'), result.err.size() - 1) << "not one line: " << result.err;
  EXPECT_EQ(result.err.rfind("deepfuse: error: ", 0), 0u) << result.err;
  for (const auto& part : parts) EXPECT_NE(result.err.find(part), std::string::npos) << part << " not in " << result.err;
}

// The ids on generate's first stdout line.
inline std::vector<int> generated_ids(const RunResult& result) {
  std::vector<int> ids;
  std::istringstream line(result.out.substr(0, result.out.find('\n')));
  for (int id; line >> id;) ids.push_back(id);
  return ids;
}

// What generate printed before its stats line: the generated text (or ids).
inline std::string generated_output(const RunResult& result) {
  const auto stats = result.out.rfind("\nprompt tokens: ");
  return stats == std::string::npos ? result.out : result.out.substr(0, stats);
}

inline std::string stats_line(const RunResult& result) {
  const auto stats = result.out.rfind("\nprompt tokens: ");
  return stats == std::string::npos ? "" : result.out.substr(stats + 1);
}

}  // namespace deepfuse::testing
