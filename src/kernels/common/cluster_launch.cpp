#include "kernels/common/cluster_launch.hpp"

#include "core/ab_switch.hpp"

namespace deepfuse::kernels {

bool programmatic_launches_enabled() {
  static const bool enabled = ab_switch("DEEPFUSE_PDL", 1) != 0;
  return enabled;
}

}  // namespace deepfuse::kernels
