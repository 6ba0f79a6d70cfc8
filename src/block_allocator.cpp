#include <kpa/block_allocator.hpp>

#include <limits>
#include <string>

namespace kpa {

BlockAllocator::BlockAllocator(int num_blocks, int block_size) : block_size_(block_size) {
  constexpr const char* call = "kpa::BlockAllocator";
  if (num_blocks < 0) detail::fail(call, "num_blocks must not be negative, got ", num_blocks);
  if (block_size <= 0) detail::fail(call, "block_size must be positive, got ", block_size);
  ref_counts_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 is handed out first
}

const BlockAllocator::Sequence& BlockAllocator::sequence(const char* call, SequenceId id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) detail::fail(call, "unknown sequence ", id);
  return it->second;
}

int BlockAllocator::allocate_block() {
  const int block = free_.back();
  free_.pop_back();
  ref_counts_[block] = 1;
  return block;
}

void BlockAllocator::release_block(int block) {
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

void BlockAllocator::add_sequence(SequenceId id) {
  if (!sequences_.emplace(id, Sequence{}).second) {
    detail::fail("kpa::BlockAllocator::add_sequence", "sequence ", id, " exists already");
  }
}

BlockAllocator::Append BlockAllocator::append_tokens(SequenceId id, int count) {
  constexpr const char* call = "kpa::BlockAllocator::append_tokens";
  if (count < 0) detail::fail(call, "count must not be negative, got ", count);
  sequence(call, id);
  Sequence& seq = sequences_[id];
  const std::int64_t new_length = static_cast<std::int64_t>(seq.length) + count;
  if (new_length > std::numeric_limits<int>::max()) {
    detail::fail(call, "sequence ", id, " would hold ", new_length, " tokens, more than INT_MAX");
  }
  const auto needed_blocks = static_cast<std::size_t>((new_length + block_size_ - 1) / block_size_);
  // A partly filled last block held by another sequence too must be copied before it is written.
  const bool copy_on_write = count > 0 && seq.length % block_size_ != 0 && ref_counts_[seq.blocks.back()] > 1;
  const std::size_t new_blocks = needed_blocks - seq.blocks.size() + (copy_on_write ? 1 : 0);
  if (new_blocks > free_.size()) {
    detail::fail(call, "out of blocks: sequence ", id, " needs ", new_blocks, " more, ", free_.size(), " of ",
                 ref_counts_.size(), " are free");
  }
  Append result;
  if (copy_on_write) {
    const int shared = seq.blocks.back();
    const int own = allocate_block();
    release_block(shared);
    seq.blocks.back() = own;
    result.copies.push_back(BlockCopy{shared, own});
  }
  while (seq.blocks.size() < needed_blocks) seq.blocks.push_back(allocate_block());
  result.slots.reserve(count);
  for (std::int64_t t = seq.length; t < new_length; ++t) {
    result.slots.push_back(static_cast<std::int64_t>(seq.blocks[t / block_size_]) * block_size_ + t % block_size_);
  }
  seq.length = static_cast<int>(new_length);
  return result;
}

void BlockAllocator::fork(SequenceId parent, SequenceId child) {
  constexpr const char* call = "kpa::BlockAllocator::fork";
  const Sequence& source = sequence(call, parent);
  if (has_sequence(child)) detail::fail(call, "sequence ", child, " exists already");
  Sequence copy = source;
  for (int block : copy.blocks) ++ref_counts_[block];
  sequences_.emplace(child, std::move(copy));
}

void BlockAllocator::free_sequence(SequenceId id) {
  const Sequence& seq = sequence("kpa::BlockAllocator::free_sequence", id);
  for (int block : seq.blocks) release_block(block);
  sequences_.erase(id);
}

int BlockAllocator::seq_len(SequenceId id) const { return sequence("kpa::BlockAllocator::seq_len", id).length; }

const std::vector<int>& BlockAllocator::block_table(SequenceId id) const {
  return sequence("kpa::BlockAllocator::block_table", id).blocks;
}

int BlockAllocator::ref_count(int block) const {
  if (block < 0 || block >= num_blocks()) {
    detail::fail("kpa::BlockAllocator::ref_count", "block ", block, " is outside [0, ", num_blocks(), ")");
  }
  return ref_counts_[block];
}

}  // namespace kpa
