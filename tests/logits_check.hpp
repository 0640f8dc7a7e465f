// Comparing a backend's logits with the reference decoder's, position by position: relative
// error per position and top-1 agreement.
//
// Near ties. The GPU runs in bf16 and is allowed ~1e-2 relative error per position, i.e. each
// logit may be off by about 1% of the row's RMS. When the reference's best two logits are closer
// than that, the GPU can legitimately pick the other one; with a vocabulary of ~1000 random logits
// that happens at a few percent of positions. Such a swap counts as agreement when the reference
// itself rates the two picks within kNearTieFraction of the row's RMS (a few times the allowed
// error); any other disagreement counts against the backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace deepfuse::testing {

inline constexpr double kNearTieFraction = 0.05;

// Index of the largest value, the lowest one on ties (as greedy sampling picks).
inline size_t argmax(std::span<const float> row) {
  return static_cast<size_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

inline double rms(std::span<const float> row) {
  double sum = 0;
  for (float v : row) sum += static_cast<double>(v) * v;
  return std::sqrt(sum / static_cast<double>(row.size()));
}

// Whether the reference rates ids a and b as a near tie in this row: closer than `fraction` of its
// RMS (kNearTieFraction for bf16's error; a larger error budget allows proportionally more).
inline bool near_tie(std::span<const float> reference_row, size_t a, size_t b, double fraction = kNearTieFraction) {
  return std::abs(static_cast<double>(reference_row[a]) - reference_row[b]) < fraction * rms(reference_row);
}

// ||ours - reference|| / ||reference|| for one row; NaN anywhere in ours gives NaN.
inline double row_relative_error(std::span<const float> ours, std::span<const float> reference) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double d = static_cast<double>(ours[i]) - reference[i];
    diff += d * d;
    norm += static_cast<double>(reference[i]) * reference[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

struct LogitsComparison {
  int positions = 0;
  double worst_error = 0;        // largest per-position relative error (NaN if any row had NaN)
  int worst_position = -1;
  int top1_same = 0;             // same argmax
  int top1_near_tie = 0;         // different argmax at a near tie of the reference
  std::vector<int> top1_wrong;   // positions where neither holds

  double top1_agreement() const { return static_cast<double>(top1_same + top1_near_tie) / positions; }
  std::string describe() const {
    std::string wrong;
    for (int p : top1_wrong) wrong += (wrong.empty() ? "" : ",") + std::to_string(p);
    return "positions " + std::to_string(positions) + ", worst relative error " + std::to_string(worst_error) +
           " at position " + std::to_string(worst_position) + ", top-1 same " + std::to_string(top1_same) +
           ", swapped at near ties " + std::to_string(top1_near_tie) + ", wrong at [" + wrong + "]";
  }
};

// Both are [positions, vocab] row-major and of the same size (callers assert that first).
inline LogitsComparison compare_logits(const std::vector<float>& ours, const std::vector<float>& reference,
                                       size_t vocab, double near_tie_fraction = kNearTieFraction) {
  LogitsComparison c;
  c.positions = static_cast<int>(reference.size() / vocab);
  for (int p = 0; p < c.positions; ++p) {
    const std::span<const float> mine(ours.data() + p * vocab, vocab), theirs(reference.data() + p * vocab, vocab);
    const double error = row_relative_error(mine, theirs);
    // The first NaN sticks, so a bound on worst_error fails.
    const bool worse = std::isnan(error) || error > c.worst_error || c.worst_position < 0;
    if (worse && !std::isnan(c.worst_error)) {
      c.worst_error = error;
      c.worst_position = p;
    }
    const size_t my_pick = argmax(mine), their_pick = argmax(theirs);
    if (my_pick == their_pick) ++c.top1_same;
    else if (near_tie(theirs, my_pick, their_pick, near_tie_fraction)) ++c.top1_near_tie;
    else c.top1_wrong.push_back(p);
  }
  return c;
}

// W8A8 (the FP8 GEMMs: activations rounded to e4m3 per token) against the plain reference. That
// rounding is chaotic: a bf16-sized difference upstream flips later roundings, so the reference's
// emulation of it (reference::DecoderOptions::e4m3_activations) on weights perturbed at bf16's
// resolution lands as far from the unperturbed emulation as from the plain reference
// (test_decoder.cpp, E4m3ActivationRounding). No backend can follow the emulation position by
// position; instead the emulation measures how far the rounding alone moves these logits, and a
// backend may be that far from the plain reference, with a margin for being another draw.
struct RoundingTolerance {
  double max_error;          // per-position relative error
  double near_tie_fraction;  // of a row's RMS: the swaps that error explains
};
inline constexpr double kRoundingDrawMargin = 1.5;
// `bf16_max_error`: the bound without the rounding (its near ties are kNearTieFraction).
inline RoundingTolerance rounding_tolerance(const LogitsComparison& emulation_vs_plain, double bf16_max_error) {
  const double max_error = std::max(bf16_max_error, kRoundingDrawMargin * emulation_vs_plain.worst_error);
  return {max_error, kNearTieFraction * max_error / bf16_max_error};
}

}  // namespace deepfuse::testing
