#include "deepfuse/error.hpp"

#include <string>

namespace deepfuse::detail {

void fail_library(const char* library, int status, const char* status_text, const char* call,
                  const char* file, int line) {
  throw Error(std::string(library) + " error " + std::to_string(status) + " (" +
              (status_text ? status_text : "unknown") + ") in " + call + " at " + file + ":" +
              std::to_string(line));
}

void fail_check(const std::string& message, const char* /*file*/, int /*line*/) {
  // User-facing: the message itself names what is wrong; file:line would only add noise.
  throw Error(message);
}

}  // namespace deepfuse::detail
