#include "kernels/common/cluster_launch.hpp"

#include <cstdlib>
#include <string>

namespace deepfuse::kernels {

bool enabled_unless_zero(const char* variable) {
  const char* setting = std::getenv(variable);
  return !(setting && std::string(setting) == "0");
}

bool programmatic_launches_enabled() {
  static const bool enabled = enabled_unless_zero("DEEPFUSE_PDL");
  return enabled;
}

}  // namespace deepfuse::kernels
