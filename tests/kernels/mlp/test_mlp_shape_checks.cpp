// Argument validation of the MLP API that runs without a GPU.
#include <gtest/gtest.h>

#include "deepfuse/error.hpp"
#include "deepfuse/mlp.hpp"

namespace deepfuse {
namespace {

TEST(MlpShape, RejectsSizesThatAreNotMultiplesOf64) {
  EXPECT_NO_THROW(validate_mlp_shape({4096, 14336}));
  EXPECT_NO_THROW(validate_mlp_shape({64, 64}));
  for (MlpShape bad : {MlpShape{4000, 14336}, MlpShape{4096, 14300}, MlpShape{0, 64}, MlpShape{64, -64},
                       MlpShape{96, 64}}) {
    try {
      validate_mlp_shape(bad);
      FAIL() << "accepted " << bad.hidden << "x" << bad.intermediate;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("multiple of 64"), std::string::npos) << e.what();
    }
  }
}

TEST(MlpVariantNames, RoundTripAndUnknown) {
  for (MlpVariant v : {MlpVariant::naive, MlpVariant::unfused, MlpVariant::fused})
    EXPECT_EQ(parse_mlp_variant(mlp_variant_name(v)), v);
  EXPECT_THROW(parse_mlp_variant("fast"), Error);
}

}  // namespace
}  // namespace deepfuse
