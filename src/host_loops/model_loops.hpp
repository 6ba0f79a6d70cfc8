#pragma once
// The loops of HostIsa::AmxModel, compiled in a translation unit of their own
// (src/host_loops_model.cpp) beside the sets the CPU runs.

#include <kpa/detail/host_loops.hpp>

namespace kpa::detail {

/// In `loops` (the AVX2 set's), the AMX level's loops over software models where the sizes suit
/// them: its 16-lane tiles over avx2::Avx512Model, and for passes of Several its tile products
/// over amx::TileModel.
template <int H, class CacheT>
void use_model_loops(HostLoops<H, CacheT>& loops, int head_size, int block_size, Passes passes);

}  // namespace kpa::detail
