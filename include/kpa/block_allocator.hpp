#pragma once
// kpa::BlockAllocator: the bookkeeping of a paged KV cache, for applications that do not have a
// serving engine's own. It hands out physical blocks, keeps each sequence's block list, turns
// appended tokens into slot mappings, forks sequences that share their prefix blocks (reference
// counts, copy-on-write of a shared last block) and fills block_tables / seq_lens for a batch.
// Host-side and not thread-safe; the cache itself is touched only through the copies it reports.

#include <kpa/detail/validate.hpp>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kpa {

class BlockAllocator {
 public:
  using SequenceId = std::int64_t;

  /// A copy-on-write the caller must apply (kpa::copy_blocks) before writing the new tokens.
  struct BlockCopy {
    std::int64_t src;
    std::int64_t dst;
  };

  struct Append {
    std::vector<std::int64_t> slots;  ///< slot_mapping entries of the appended tokens
    std::vector<BlockCopy> copies;    ///< copy-on-write of a shared last block (at most one)
  };

  BlockAllocator(int num_blocks, int block_size);

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  int block_size() const { return block_size_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()); }

  /// Starts an empty sequence. Throws kpa::Error if `id` exists.
  void add_sequence(SequenceId id);
  /// Appends `count` tokens to sequence `id`, allocating blocks as needed. When the sequence's
  /// partly filled last block is shared with a fork, the sequence gets a private copy first
  /// (reported in Append::copies). Throws kpa::Error, changing nothing, when blocks run out.
  Append append_tokens(SequenceId id, int count);
  /// Starts sequence `child` as a fork of `parent`: same tokens, blocks shared.
  void fork(SequenceId parent, SequenceId child);
  /// Ends sequence `id`; blocks no other sequence holds become free.
  void free_sequence(SequenceId id);

  bool has_sequence(SequenceId id) const { return sequences_.count(id) != 0; }
  int seq_len(SequenceId id) const;
  const std::vector<int>& block_table(SequenceId id) const;
  int ref_count(int block) const;

  /// Writes the block tables and lengths of `batch` (in order) into block_tables
  /// ([batch.size(), columns], unused columns set to 0) and seq_lens; returns the longest length.
  /// The views may live in any memory space.
  template <class BlockTableView, class SeqLenView>
  int fill_batch(const std::vector<SequenceId>& batch, const BlockTableView& block_tables,
                 const SeqLenView& seq_lens) const;

 private:
  struct Sequence {
    int length = 0;
    std::vector<int> blocks;
  };
  const Sequence& sequence(const char* call, SequenceId id) const;
  int allocate_block();
  void release_block(int block);

  int block_size_;
  std::vector<int> ref_counts_;
  std::vector<int> free_;  ///< a stack: the most recently freed block is reused first
  std::unordered_map<SequenceId, Sequence> sequences_;
};

template <class BlockTableView, class SeqLenView>
int BlockAllocator::fill_batch(const std::vector<SequenceId>& batch, const BlockTableView& block_tables,
                               const SeqLenView& seq_lens) const {
  constexpr const char* call = "kpa::BlockAllocator::fill_batch";
  static_assert(BlockTableView::rank == 2 && SeqLenView::rank == 1, "block_tables is 2-D, seq_lens 1-D");
  if (block_tables.extent(0) != batch.size() || seq_lens.extent(0) != batch.size()) {
    detail::fail(call, "block_tables has ", block_tables.extent(0), " rows and seq_lens ", seq_lens.extent(0),
                 " entries for a batch of ", batch.size());
  }
  auto tables = Kokkos::create_mirror_view(block_tables);
  auto lens = Kokkos::create_mirror_view(seq_lens);
  int max_len = 0;
  for (std::size_t row = 0; row < batch.size(); ++row) {
    const Sequence& seq = sequence(call, batch[row]);
    if (seq.blocks.size() > block_tables.extent(1)) {
      detail::fail(call, "sequence ", batch[row], " holds ", seq.blocks.size(), " blocks, block_tables has ",
                   block_tables.extent(1), " columns");
    }
    for (std::size_t col = 0; col < block_tables.extent(1); ++col) {
      tables(row, col) = col < seq.blocks.size() ? seq.blocks[col] : 0;
    }
    lens(row) = seq.length;
    max_len = seq.length > max_len ? seq.length : max_len;
  }
  Kokkos::deep_copy(block_tables, tables);
  Kokkos::deep_copy(seq_lens, lens);
  return max_len;
}

}  // namespace kpa
