#include "deepfuse/error.hpp"

#include <string>

namespace deepfuse::detail {

void fail_library(const char* library, int status, const char* status_text, const char* call,
                  const char* file, int line) {
  // Built with append rather than a chain of operator+: GCC 12 reports a false -Wrestrict
  // positive for the chained temporaries.
  std::string message(library);
  message.append(" error ").append(std::to_string(status));
  message.append(" (").append(status_text ? status_text : "unknown").append(")");
  message.append(" in ").append(call);
  message.append(" at ").append(file).append(":").append(std::to_string(line));
  throw Error(message);
}

void fail_check(const std::string& message, const char* /*file*/, int /*line*/) {
  // User-facing: the message itself names what is wrong; file:line would only add noise.
  throw Error(message);
}

}  // namespace deepfuse::detail
