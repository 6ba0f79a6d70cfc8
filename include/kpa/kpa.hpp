#pragma once
// kpa: paged attention for LLM decode on Kokkos. The one header applications include.

#include <kpa/attention_params.hpp>
#include <kpa/block_allocator.hpp>
#include <kpa/cache_ops.hpp>
#include <kpa/error.hpp>
#include <kpa/launch_plan.hpp>
#include <kpa/merge_attn_states.hpp>
#include <kpa/numeric_types.hpp>
#include <kpa/paged_attention.hpp>
#include <kpa/version.hpp>
