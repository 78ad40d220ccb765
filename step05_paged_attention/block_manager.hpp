#pragma once
// The block manager: PagedAttention's bookkeeping, with no K/V memory of its
// own (chapter 05, section 3). A pool of n_blocks physical blocks of
// block_size positions; each sequence maps its logical blocks to physical
// ones through its block table, as a page table maps pages to frames. The
// paged KV caches (paged_kv_cache.hpp) own the K/V pools; step 07's
// scheduler asks this class what fits and reserves through it.
//
// Every physical block is in exactly one of three states:
//   free       refcount 0, not in the prefix cache: on the free list
//   used       refcount > 0: in the tables of `refcount` sequences
//   evictable  refcount 0 but in the prefix cache (its K/V still valid); the
//              least recently released one is evicted when the free list is empty
//
// Sharing: fork() puts a parent's blocks into a child's table; a write into a
// block held by more than one sequence first copies it (reserve() returns the
// copies). Prefix caching: a FULL block's key hashes its parent's key and its
// tokens; publish_full_blocks() enters a sequence's full blocks and
// share_cached_prefix() hands a new request those of its longest cached
// prefix. A hit compares the stored tokens (and serials: block_manager.cpp),
// so a 64-bit hash collision never hands out another prefix's K/V.
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace step05 {

// Copy-on-write work for a cache: copy every layer's rows of physical block
// `from` into physical block `to`, before the forward writes into `to`.
struct BlockCopy {
  std::int32_t from = -1;
  std::int32_t to = -1;
};

// Running totals since construction (for tables and tests).
struct BlockManagerCounters {
  long long blocks_allocated = 0;   // blocks taken from the free list or by eviction
  long long copy_on_write = 0;      // BlockCopy entries returned by reserve()
  long long evictions = 0;          // evictable blocks reclaimed for an allocation
  long long prefix_queries = 0;     // share_cached_prefix calls
  long long prefix_queried_blocks = 0;  // full blocks those calls could have shared (the hit rate's denominator)
  long long prefix_hit_blocks = 0;  // blocks those calls shared from the cache
  long long published_blocks = 0;   // blocks entered into the prefix cache
};

class BlockManager {
 public:
  // n_blocks >= 1 physical blocks of block_size >= 1 positions; sequence ids
  // 0..max_sequences-1; a sequence holds at most max_blocks_per_sequence
  // blocks (ceil(context / block_size)). Throws llm::InputError otherwise.
  BlockManager(int n_blocks, int block_size, int max_sequences, int max_blocks_per_sequence);

  int n_blocks() const { return n_blocks_; }
  int block_size() const { return block_size_; }
  int max_sequences() const { return max_sequences_; }
  int max_blocks_per_sequence() const { return max_blocks_per_sequence_; }
  // Blocks that cover `positions` positions: ceil(positions / block_size).
  int blocks_for(int positions) const { return (positions + block_size_ - 1) / block_size_; }

  // --- Growth and release ------------------------------------------------

  // Makes `sequence` hold the blocks of positions 0..end-1, and makes every
  // block that positions first_write..end-1 fall in private to it: a held
  // block shared with another sequence is replaced by a fresh copy (returned,
  // for the cache to copy the rows), a held block in the prefix cache leaves
  // the cache (its contents are about to change). first_write <= the
  // positions the sequence held before (its length: what is already written).
  // Takes free blocks first, then evicts the least recently released
  // evictable ones. Throws llm::KvCacheFullError, saying how many blocks were
  // needed and how many were available, and changes nothing when the pool
  // cannot supply them; llm::InputError for a bad sequence id, end past
  // max_blocks_per_sequence * block_size, or first_write > end.
  std::vector<BlockCopy> reserve(int sequence, int first_write, int end);
  // What reserve(sequence, first_write, end) would take from the pool: new
  // blocks plus copy-on-write copies. Changes nothing; the same InputErrors.
  int blocks_needed_to_reserve(int sequence, int first_write, int end) const;
  bool can_reserve(int sequence, int first_write, int end) const {
    return blocks_needed_to_reserve(sequence, first_write, end) <= available_blocks();
  }
  // What a sequence holding nothing would take from the pool to share the
  // cached prefix of `tokens` (at most max_positions, as share_cached_prefix)
  // and then hold positions 0..end-1: the blocks past the prefix, plus each
  // evictable block of the prefix (sharing makes it used: it leaves the
  // pool). Changes nothing.
  int blocks_needed_to_admit(std::span<const int> tokens, int max_positions, int end) const;

  // Keeps the blocks of positions 0..new_length-1 and releases the rest
  // (refcount - 1; a block nobody holds becomes free, or evictable when it is
  // in the prefix cache). Blocks are released last-first, so that at equal
  // age a prefix's tail is evicted before its head (a cached prefix whose head
  // is gone can never be hit again).
  void truncate(int sequence, int new_length);
  void free_sequence(int sequence) { truncate(sequence, 0); }

  // `child` (holding no blocks) shares the blocks of `parent` that cover
  // positions 0..n_positions-1 (refcounts + 1). The child's next write into
  // a shared block copies it (reserve). Throws llm::InputError when the child
  // holds blocks or the parent holds fewer than blocks_for(n_positions).
  void fork(int parent, int child, int n_positions);

  // --- Automatic prefix caching ------------------------------------------

  // Positions of the longest prefix of `tokens` held by cached full blocks (a
  // multiple of block_size; 0 on a miss). Changes nothing.
  int cached_prefix_length(std::span<const int> tokens) const;
  // `sequence` (holding no blocks) takes the cached blocks of the longest
  // cached prefix of `tokens`, at most max_positions positions (rounded down
  // to whole blocks). An evictable block taken this way becomes used again.
  // Returns the positions the sequence now holds (0 on a miss).
  int share_cached_prefix(int sequence, std::span<const int> tokens, int max_positions);
  // Positions 0..tokens.size()-1 of `sequence` hold the K/V of `tokens`:
  // enters each of its full blocks into the prefix cache. A block already
  // cached stays as is; a block whose prefix is already cached in another
  // block is left out (the first copy wins).
  void publish_full_blocks(int sequence, std::span<const int> tokens);

  // --- Reading -------------------------------------------------------------

  // The physical block of each logical block `sequence` holds: [blocks held].
  std::span<const std::int32_t> block_table(int sequence) const;
  int blocks_held(int sequence) const;
  // Every table side by side, unheld entries -1:
  // [max_sequences, max_blocks_per_sequence]. A device cache uploads this
  // array as is; tables_version() changes whenever any entry does.
  std::span<const std::int32_t> all_tables() const { return tables_; }
  std::uint64_t tables_version() const { return tables_version_; }

  int free_blocks() const;       // free list
  int evictable_blocks() const;  // cached, held by nobody
  int used_blocks() const;       // held by at least one sequence
  // What an allocation can get: free + evictable.
  int available_blocks() const { return free_blocks() + evictable_blocks(); }
  int ref_count(int block) const;
  bool is_cached(int block) const;  // in the prefix cache (used or evictable)
  const BlockManagerCounters& counters() const { return counters_; }

  // Checks every invariant and throws std::logic_error naming the first one
  // broken: each block in exactly one state; refcount == the number of table
  // entries naming it; free + used + evictable == n_blocks; tables hold valid
  // ids only; each cache entry names a cached block with that hash.
  void check_invariants() const;

 private:
  // Per physical block.
  struct Block {
    int ref_count = 0;
    bool cached = false;            // in by_hash_
    std::uint64_t hash = 0;         // valid when cached: hash_block(parent_hash, tokens)
    std::uint64_t parent_hash = 0;  // the previous block's hash (a fixed seed for block 0)
    // Which publication of the previous block this one was cached under: its
    // cache_serial (0 for block 0). A hit needs it to equal the serial of the
    // block the lookup matched one level up: see the .cpp for why a parent
    // hash alone cannot make a 64-bit collision harmless.
    std::uint64_t parent_serial = 0;
    std::uint64_t cache_serial = 0;         // unique per entry into the cache (1, 2, ...); valid when cached
    std::vector<int> tokens;                // [block_size] when cached: compared on a hit
    std::list<int>::iterator lru_position;  // in evictable_lru_ when evictable
  };

  // reserve's arithmetic, before any change: the blocks it takes and the
  // held blocks its writes fall in (logical first_written_block up to,
  // not including, last_written_held).
  struct ReserveCount {
    int target = 0;      // blocks held after it: blocks_for(end) at least
    int new_blocks = 0;  // blocks past the ones held
    int copies = 0;      // written held blocks shared with another sequence
    int first_written_block = 0;
    int last_written_held = 0;
  };
  ReserveCount count_reserve(int sequence, int first_write, int end) const;
  // check_invariants in three parts: the tables (returns how many entries
  // name each block: [n_blocks]), each block's state against them, the
  // prefix cache's entries.
  std::vector<int> check_tables() const;
  void check_block_states(const std::vector<int>& table_entries) const;
  void check_prefix_cache() const;
  // The hash chain of `tokens`' first full_blocks blocks ([full_blocks]),
  // checked before publish_full_blocks changes anything: a held block
  // already cached must be cached for exactly these tokens (else they are not
  // what the sequence's rows hold: InputError).
  std::vector<std::uint64_t> checked_chain(int sequence, std::span<const int> tokens, int full_blocks) const;
  void check_sequence(int sequence, const char* operation) const;
  void check_block(int block, const char* operation) const;
  // Row `sequence` of tables_: [max_blocks_per_sequence].
  std::int32_t* table_row(int sequence) {
    return tables_.data() + static_cast<std::size_t>(sequence) * max_blocks_per_sequence_;
  }
  const std::int32_t* table_row(int sequence) const {
    return tables_.data() + static_cast<std::size_t>(sequence) * max_blocks_per_sequence_;
  }
  // A block with refcount 1: the top of the free list, else the least
  // recently released evictable block (which leaves the prefix cache).
  // The caller has checked available_blocks().
  int allocate_block();
  // refcount - 1; at 0 the block becomes evictable (cached) or free.
  void release_block(int block);
  // Takes a block out of the prefix cache; an evictable one becomes free.
  void uncache_block(int block);
  // Enters `block` into the prefix cache under `hash` as the child of the
  // entry with serial `parent_serial`.
  void cache_block(int block, std::uint64_t hash, std::uint64_t parent_hash, std::uint64_t parent_serial,
                   std::span<const int> tokens);
  // The cache entry for block tokens `tokens` whose parent is the entry
  // (parent_hash, parent_serial): its block, or -1.
  int find_cached(std::uint64_t hash, std::uint64_t parent_hash, std::uint64_t parent_serial,
                  std::span<const int> tokens) const;
  // Walks the cache from block 0 along `tokens`' full blocks, at most
  // max_blocks; writes the blocks it matches to `matched` (when not null,
  // [max_blocks]) and returns how many.
  int match_cached_prefix(std::span<const int> tokens, int max_blocks, std::int32_t* matched) const;

  int n_blocks_;
  int block_size_;
  int max_sequences_;
  int max_blocks_per_sequence_;
  std::vector<Block> blocks_;                       // [n_blocks]
  std::vector<std::int32_t> tables_;                // [max_sequences, max_blocks_per_sequence], -1 = none
  std::vector<int> held_;                           // [max_sequences] blocks held per sequence
  std::vector<int> free_list_;                      // a stack of free blocks
  std::list<int> evictable_lru_;                    // evictable blocks, least recently released first
  std::unordered_map<std::uint64_t, int> by_hash_;  // prefix cache: hash -> block
  std::uint64_t next_cache_serial_ = 1;             // the serial of the next entry into the cache
  BlockManagerCounters counters_;
  std::uint64_t tables_version_ = 0;
};

}  // namespace step05
