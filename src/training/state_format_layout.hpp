// The state format's constants shared by its encoder and decoder (see state_format.hpp).
#pragma once

#include <cstdint>
#include <string_view>

namespace starling::training::state_format::layout {

inline constexpr char kMagic[8] = {'S', 'T', 'A', 'R', 'S', 'T', 'A', 'T'};
enum Tag : std::uint8_t { kModel = 1, kOptimizer = 2, kExtra = 3, kMetadata = 4 };
inline constexpr std::string_view kTagNames[] = {"", "model", "optimizer", "extra", "metadata"};

}  // namespace starling::training::state_format::layout
