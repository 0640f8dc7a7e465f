#include "kernels/common/cluster_launch.hpp"

#include <cstdlib>
#include <string>

namespace deepfuse::kernels {

bool programmatic_launches_enabled() {
  static const bool enabled = [] {
    const char* setting = std::getenv("DEEPFUSE_PDL");
    return !(setting && std::string(setting) == "0");
  }();
  return enabled;
}

}  // namespace deepfuse::kernels
