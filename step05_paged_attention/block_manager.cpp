#include "step05_paged_attention/block_manager.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"
#include "step05_paged_attention/prefix_hash.hpp"

// Why a parent hash is not enough to make the prefix cache collision-safe,
// and what the serials add. A lookup walks the chain from block 0 and, at
// level k, accepts the entry under hash(h[k-1], tokens[k]) when its stored
// tokens and parent hash equal the query's. The tokens prove block k's own
// ids; the parent hash proves only that the publisher's block k-1 had hash
// h[k-1]. Were another prefix to share that 64-bit hash (a collision), and to
// have been cached under it after the first one left the cache, the lookup
// would match it at level k-1 and then accept a level-k block computed after
// the OTHER prefix. So every entry also records which entry it was published
// under (the parent's cache_serial, a number never reused), and a hit at level
// k needs exactly the entry the walk matched at level k-1. By induction from
// block 0 a hit's K/V were computed from the query's own tokens, whatever the
// hashes do; the hash only finds candidates fast. An entry whose parent left
// the cache is unreachable until its prefix is published again.

namespace step05 {
namespace {

// The parent serial of block 0: no entry has serial 0.
constexpr std::uint64_t kRootParentSerial = 0;

bool same_tokens(const std::vector<int>& stored, std::span<const int> tokens) {
  return std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end());
}

}  // namespace

BlockManager::BlockManager(int n_blocks, int block_size, int max_sequences, int max_blocks_per_sequence)
    : n_blocks_(n_blocks),
      block_size_(block_size),
      max_sequences_(max_sequences),
      max_blocks_per_sequence_(max_blocks_per_sequence) {
  if (n_blocks < 1 || block_size < 1 || max_sequences < 1 || max_blocks_per_sequence < 1)
    throw llm::InputError(fmt::format(
        "block manager: n_blocks ({}), block_size ({}), max_sequences ({}) and max_blocks_per_sequence ({}) "
        "must all be >= 1",
        n_blocks, block_size, max_sequences, max_blocks_per_sequence));
  // Positions are ints everywhere (KvCache, KvView): a sequence's last one must be one.
  if (static_cast<long long>(max_blocks_per_sequence) * block_size > INT_MAX)
    throw llm::InputError(fmt::format("block manager: {} blocks of {} positions per sequence overflow an int",
                                      max_blocks_per_sequence, block_size));
  blocks_.resize(static_cast<std::size_t>(n_blocks));
  tables_.assign(static_cast<std::size_t>(max_sequences) * max_blocks_per_sequence, -1);
  held_.assign(static_cast<std::size_t>(max_sequences), 0);
  // Block 0 on top: a fresh pool hands out 0, 1, 2, ... (readable tables);
  // released blocks go back on top and are reused first (their rows are the
  // likeliest still in the GPU's L2).
  free_list_.reserve(static_cast<std::size_t>(n_blocks));
  for (int block = n_blocks - 1; block >= 0; --block) free_list_.push_back(block);
}

void BlockManager::check_sequence(int sequence, const char* operation) const {
  if (sequence < 0 || sequence >= max_sequences_)
    throw llm::InputError(
        fmt::format("block manager {}: sequence {} out of range [0, {})", operation, sequence, max_sequences_));
}

void BlockManager::check_block(int block, const char* operation) const {
  if (block < 0 || block >= n_blocks_)
    throw llm::InputError(fmt::format("block manager {}: block {} out of range [0, {})", operation, block, n_blocks_));
}

// --- Growth and release ------------------------------------------------------

BlockManager::ReserveCount BlockManager::count_reserve(int sequence, int first_write, int end) const {
  check_sequence(sequence, "reserve");
  const int max_positions = max_blocks_per_sequence_ * block_size_;
  if (end < 0 || end > max_positions)
    throw llm::InputError(
        fmt::format("block manager reserve: sequence {} asks for positions up to {}, past the {} "
                    "a sequence can hold ({} blocks of {})",
                    sequence, end, max_positions, max_blocks_per_sequence_, block_size_));
  const int held = held_[static_cast<std::size_t>(sequence)];
  // A write past the positions held would leave a gap no block covers.
  if (first_write < 0 || first_write > end || first_write > held * block_size_)
    throw llm::InputError(fmt::format(
        "block manager reserve: sequence {} writes from position {} to {}: the first write must be in [0, end] and "
        "at most the {} positions its {} blocks cover",
        sequence, first_write, end, held * block_size_, held));
  // A copy-on-write copy takes a block like a new one; making a cached block
  // private takes none (it stays used).
  ReserveCount count;
  count.target = blocks_for(end);
  count.new_blocks = std::max(0, count.target - held);
  count.first_written_block = first_write / block_size_;
  count.last_written_held = first_write < end ? std::min(held, count.target) : count.first_written_block;
  const std::int32_t* row = table_row(sequence);
  for (int logical = count.first_written_block; logical < count.last_written_held; ++logical)
    if (blocks_[static_cast<std::size_t>(row[logical])].ref_count > 1) ++count.copies;
  return count;
}

int BlockManager::blocks_needed_to_reserve(int sequence, int first_write, int end) const {
  const ReserveCount count = count_reserve(sequence, first_write, end);
  return count.new_blocks + count.copies;
}

int BlockManager::blocks_needed_to_admit(std::span<const int> tokens, int max_positions, int end) const {
  const int max_blocks = std::clamp(max_positions / block_size_, 0, max_blocks_per_sequence_);
  std::vector<std::int32_t> matched(static_cast<std::size_t>(max_blocks));  // [max_blocks] the prefix's blocks
  const int shared = match_cached_prefix(tokens, max_blocks, matched.data());
  int evictable = 0;
  for (int logical = 0; logical < shared; ++logical)
    if (blocks_[static_cast<std::size_t>(matched[static_cast<std::size_t>(logical)])].ref_count == 0) ++evictable;
  return evictable + std::max(0, blocks_for(end) - shared);
}

std::vector<BlockCopy> BlockManager::reserve(int sequence, int first_write, int end) {
  // Count before changing anything, so that a pool too small leaves every
  // table and block as it was.
  const ReserveCount count = count_reserve(sequence, first_write, end);
  const int held = held_[static_cast<std::size_t>(sequence)];
  std::int32_t* row = table_row(sequence);
  const int needed = count.new_blocks + count.copies;
  if (needed > available_blocks())
    throw llm::KvCacheFullError(fmt::format(
        "paged KV cache full: sequence {} needs {} blocks of {} positions to hold positions 0..{} ({} new, {} "
        "copy-on-write copies) but only {} are available ({} free, {} evictable) of {}",
        sequence, needed, block_size_, end - 1, count.new_blocks, count.copies, available_blocks(), free_blocks(),
        evictable_blocks(), n_blocks_));

  std::vector<BlockCopy> block_copies;
  block_copies.reserve(static_cast<std::size_t>(count.copies));
  // The held blocks the writes fall in (count_reserve found them): each must
  // be this sequence's alone before the forward writes into it.
  // BEGIN EXERCISE ex05.1
  for (int logical = count.first_written_block; logical < count.last_written_held; ++logical) {
    const int block = row[logical];
    Block& held_block = blocks_[static_cast<std::size_t>(block)];
    if (held_block.ref_count > 1) {
      // Shared: the other holders keep the original (and its cache entry).
      const int copy = allocate_block();
      --held_block.ref_count;
      row[logical] = copy;
      block_copies.push_back({block, copy});
    } else if (held_block.cached) {
      // Private but cached: its rows are about to change, so no later
      // request may take them for the old prefix.
      uncache_block(block);
    }
  }
  // END EXERCISE ex05.1
  // Growth: fresh blocks (refcount 1) for the positions past the ones held.
  for (int logical = held; logical < count.target; ++logical) row[logical] = allocate_block();
  held_[static_cast<std::size_t>(sequence)] = std::max(held, count.target);
  counters_.copy_on_write += count.copies;
  if (needed > 0) ++tables_version_;
  return block_copies;
}

void BlockManager::truncate(int sequence, int new_length) {
  check_sequence(sequence, "truncate");
  int& held = held_[static_cast<std::size_t>(sequence)];
  if (new_length < 0 || new_length > held * block_size_)
    throw llm::InputError(
        fmt::format("block manager truncate: sequence {} to length {}: it holds {} blocks ({} "
                    "positions); the new length must be in [0, {}]",
                    sequence, new_length, held, held * block_size_, held * block_size_));
  const int keep = blocks_for(new_length);
  std::int32_t* row = table_row(sequence);
  // Last-first: the tail enters the LRU list before the head, so at equal
  // age it is evicted first (a cached prefix is useless without its head).
  for (int logical = held - 1; logical >= keep; --logical) {
    release_block(row[logical]);
    row[logical] = -1;
  }
  if (keep < held) ++tables_version_;
  held = keep;
}

void BlockManager::fork(int parent, int child, int n_positions) {
  check_sequence(parent, "fork");
  check_sequence(child, "fork");
  const int parent_held = held_[static_cast<std::size_t>(parent)];
  if (parent == child || held_[static_cast<std::size_t>(child)] != 0 || n_positions < 0 ||
      n_positions > parent_held * block_size_)
    throw llm::InputError(fmt::format(
        "block manager fork: sequence {} (holding {} blocks) cannot share the first {} positions of sequence {} "
        "(holding {} blocks of {}): the child must be another sequence holding none, and the parent must hold them",
        child, held_[static_cast<std::size_t>(child)], n_positions, parent, parent_held, block_size_));
  const int shared = blocks_for(n_positions);
  const std::int32_t* from = table_row(parent);
  std::int32_t* to = table_row(child);
  for (int logical = 0; logical < shared; ++logical) {
    to[logical] = from[logical];
    ++blocks_[static_cast<std::size_t>(from[logical])].ref_count;
  }
  held_[static_cast<std::size_t>(child)] = shared;
  if (shared > 0) ++tables_version_;
}

int BlockManager::allocate_block() {
  int block;
  if (!free_list_.empty()) {
    block = free_list_.back();
    free_list_.pop_back();
  } else {
    // The caller checked available_blocks(), so an evictable block exists.
    block = evictable_lru_.front();
    uncache_block(block);  // evictable -> free (on the free list's top)
    free_list_.pop_back();
    ++counters_.evictions;
  }
  blocks_[static_cast<std::size_t>(block)].ref_count = 1;
  ++counters_.blocks_allocated;
  return block;
}

void BlockManager::release_block(int block) {
  Block& released = blocks_[static_cast<std::size_t>(block)];
  if (--released.ref_count > 0) return;
  if (released.cached)
    released.lru_position = evictable_lru_.insert(evictable_lru_.end(), block);  // the most recent, last
  else
    free_list_.push_back(block);
}

void BlockManager::uncache_block(int block) {
  Block& entry = blocks_[static_cast<std::size_t>(block)];
  by_hash_.erase(entry.hash);
  entry.cached = false;
  entry.tokens.clear();  // keeps the capacity for the block's next entry
  if (entry.ref_count == 0) {
    evictable_lru_.erase(entry.lru_position);
    free_list_.push_back(block);
  }
}

void BlockManager::cache_block(int block, std::uint64_t hash, std::uint64_t parent_hash, std::uint64_t parent_serial,
                               std::span<const int> tokens) {
  Block& entry = blocks_[static_cast<std::size_t>(block)];
  entry.cached = true;
  entry.hash = hash;
  entry.parent_hash = parent_hash;
  entry.parent_serial = parent_serial;
  entry.cache_serial = next_cache_serial_++;
  entry.tokens.assign(tokens.begin(), tokens.end());
  by_hash_[hash] = block;
  ++counters_.published_blocks;
}

// --- Automatic prefix caching ------------------------------------------------

int BlockManager::find_cached(std::uint64_t hash, std::uint64_t parent_hash, std::uint64_t parent_serial,
                              std::span<const int> tokens) const {
  const auto found = by_hash_.find(hash);
  if (found == by_hash_.end()) return -1;
  const Block& entry = blocks_[static_cast<std::size_t>(found->second)];
  // The serial decides; equal serials imply equal parent hashes, so that
  // comparison is only a cheap cross-check.
  const bool same_prefix =
      entry.parent_serial == parent_serial && entry.parent_hash == parent_hash && same_tokens(entry.tokens, tokens);
  return same_prefix ? found->second : -1;
}

int BlockManager::match_cached_prefix(std::span<const int> tokens, int max_blocks, std::int32_t* matched) const {
  const int full_blocks = static_cast<int>(std::min<std::size_t>(tokens.size() / block_size_, max_blocks));
  std::uint64_t parent_hash = kPrefixHashRoot;
  std::uint64_t parent_serial = kRootParentSerial;
  for (int logical = 0; logical < full_blocks; ++logical) {
    const auto block_tokens = tokens.subspan(static_cast<std::size_t>(logical) * block_size_, block_size_);
    const std::uint64_t hash = hash_block(parent_hash, block_tokens);
    const int block = find_cached(hash, parent_hash, parent_serial, block_tokens);
    if (block < 0) return logical;  // the first miss ends the prefix
    if (matched) matched[logical] = block;
    parent_hash = hash;
    parent_serial = blocks_[static_cast<std::size_t>(block)].cache_serial;
  }
  return full_blocks;
}

int BlockManager::cached_prefix_length(std::span<const int> tokens) const {
  return match_cached_prefix(tokens, max_blocks_per_sequence_, nullptr) * block_size_;
}

int BlockManager::share_cached_prefix(int sequence, std::span<const int> tokens, int max_positions) {
  check_sequence(sequence, "share_cached_prefix");
  if (held_[static_cast<std::size_t>(sequence)] != 0)
    throw llm::InputError(
        fmt::format("block manager share_cached_prefix: sequence {} holds {} blocks; it must "
                    "hold none",
                    sequence, held_[static_cast<std::size_t>(sequence)]));
  ++counters_.prefix_queries;
  const int max_blocks = std::clamp(max_positions / block_size_, 0, max_blocks_per_sequence_);
  counters_.prefix_queried_blocks += std::min<long long>(max_blocks, static_cast<long long>(tokens.size()) / block_size_);
  // The walk writes the matched blocks straight into the (empty) table row.
  std::int32_t* row = table_row(sequence);
  const int shared = match_cached_prefix(tokens, max_blocks, row);
  for (int logical = 0; logical < shared; ++logical) {
    Block& block = blocks_[static_cast<std::size_t>(row[logical])];
    if (block.ref_count++ == 0) evictable_lru_.erase(block.lru_position);  // evictable -> used
  }
  held_[static_cast<std::size_t>(sequence)] = shared;
  counters_.prefix_hit_blocks += shared;
  if (shared > 0) ++tables_version_;
  return shared * block_size_;
}

std::vector<std::uint64_t> BlockManager::checked_chain(int sequence, std::span<const int> tokens,
                                                       int full_blocks) const {
  const std::int32_t* row = table_row(sequence);
  std::vector<std::uint64_t> hashes(static_cast<std::size_t>(full_blocks));  // [full_blocks] the chain
  for (int logical = 0; logical < full_blocks; ++logical) {
    const auto block_tokens = tokens.subspan(static_cast<std::size_t>(logical) * block_size_, block_size_);
    const std::uint64_t parent_hash = logical == 0 ? kPrefixHashRoot : hashes[static_cast<std::size_t>(logical - 1)];
    hashes[static_cast<std::size_t>(logical)] = hash_block(parent_hash, block_tokens);
    const Block& block = blocks_[static_cast<std::size_t>(row[logical])];
    if (block.cached && (block.hash != hashes[static_cast<std::size_t>(logical)] || block.parent_hash != parent_hash ||
                         !same_tokens(block.tokens, block_tokens)))
      throw llm::InputError(
          fmt::format("block manager publish_full_blocks: block {} (logical {}) of sequence {} "
                      "is cached for other tokens than the ones given",
                      row[logical], logical, sequence));
  }
  return hashes;
}

void BlockManager::publish_full_blocks(int sequence, std::span<const int> tokens) {
  check_sequence(sequence, "publish_full_blocks");
  const int held = held_[static_cast<std::size_t>(sequence)];
  const int full_blocks = static_cast<int>(tokens.size() / block_size_);
  if (full_blocks > held)
    throw llm::InputError(
        fmt::format("block manager publish_full_blocks: {} tokens fill {} blocks of {} but "
                    "sequence {} holds {}",
                    tokens.size(), full_blocks, block_size_, sequence, held));
  const std::int32_t* row = table_row(sequence);
  const std::vector<std::uint64_t> hashes = checked_chain(sequence, tokens, full_blocks);

  std::uint64_t parent_hash = kPrefixHashRoot;
  std::uint64_t parent_serial = kRootParentSerial;  // the entry this level's block hangs under
  for (int logical = 0; logical < full_blocks; ++logical) {
    const auto block_tokens = tokens.subspan(static_cast<std::size_t>(logical) * block_size_, block_size_);
    const std::uint64_t hash = hashes[static_cast<std::size_t>(logical)];
    const int block = row[logical];
    Block& own = blocks_[static_cast<std::size_t>(block)];
    if (own.cached) {
      // Already cached: it stays. Its rows are these tokens' (checked
      // above), so it hangs under the entry this walk verified one level up
      // (the same one, unless that one left the cache and came back).
      own.parent_serial = parent_serial;
    } else if (const auto found = by_hash_.find(hash); found == by_hash_.end()) {
      cache_block(block, hash, parent_hash, parent_serial, block_tokens);
    } else {
      const int other = found->second;
      const Block& entry = blocks_[static_cast<std::size_t>(other)];
      if (entry.parent_hash != parent_hash || !same_tokens(entry.tokens, block_tokens))
        return;  // a 64-bit collision with another prefix: this prefix stops being cached here
      if (entry.parent_serial == parent_serial) {
        // Another block holds this prefix already: the first copy wins.
        parent_hash = hash;
        parent_serial = entry.cache_serial;
        continue;
      }
      // The entry hangs under a parent that left the cache: no lookup can
      // reach it any more. This block takes its place.
      uncache_block(other);
      cache_block(block, hash, parent_hash, parent_serial, block_tokens);
    }
    parent_hash = hash;
    parent_serial = own.cache_serial;
  }
}

// --- Reading -----------------------------------------------------------------

std::span<const std::int32_t> BlockManager::block_table(int sequence) const {
  check_sequence(sequence, "block_table");
  return {table_row(sequence), static_cast<std::size_t>(held_[static_cast<std::size_t>(sequence)])};
}

int BlockManager::blocks_held(int sequence) const {
  check_sequence(sequence, "blocks_held");
  return held_[static_cast<std::size_t>(sequence)];
}

int BlockManager::free_blocks() const { return static_cast<int>(free_list_.size()); }
int BlockManager::evictable_blocks() const { return static_cast<int>(evictable_lru_.size()); }
int BlockManager::used_blocks() const { return n_blocks_ - free_blocks() - evictable_blocks(); }

int BlockManager::ref_count(int block) const {
  check_block(block, "ref_count");
  return blocks_[static_cast<std::size_t>(block)].ref_count;
}

bool BlockManager::is_cached(int block) const {
  check_block(block, "is_cached");
  return blocks_[static_cast<std::size_t>(block)].cached;
}

namespace {

[[noreturn]] void broken(const std::string& what) { throw std::logic_error("block manager invariant broken: " + what); }

}  // namespace

std::vector<int> BlockManager::check_tables() const {
  std::vector<int> table_entries(blocks_.size(), 0);  // [n_blocks]
  for (int sequence = 0; sequence < max_sequences_; ++sequence) {
    const int held = held_[static_cast<std::size_t>(sequence)];
    if (held < 0 || held > max_blocks_per_sequence_)
      broken(fmt::format("sequence {} holds {} blocks, outside [0, {}]", sequence, held, max_blocks_per_sequence_));
    const std::int32_t* row = table_row(sequence);
    for (int logical = 0; logical < max_blocks_per_sequence_; ++logical) {
      const std::int32_t block = row[logical];
      if (logical >= held) {
        if (block != -1)
          broken(fmt::format("sequence {} entry {} past its {} blocks is {}, not -1", sequence, logical, held, block));
      } else if (block < 0 || block >= n_blocks_) {
        broken(
            fmt::format("sequence {} entry {} names block {}, outside [0, {})", sequence, logical, block, n_blocks_));
      } else {
        ++table_entries[static_cast<std::size_t>(block)];
      }
    }
  }
  return table_entries;
}

void BlockManager::check_block_states(const std::vector<int>& table_entries) const {
  const std::size_t n = blocks_.size();
  std::vector<int> on_free_list(n, 0);  // [n_blocks] times each block is on the free list
  std::vector<int> on_lru(n, 0);        // [n_blocks] times each block is in the LRU list
  for (const int block : free_list_) {
    if (block < 0 || block >= n_blocks_)
      broken(fmt::format("free list holds block {}, outside [0, {})", block, n_blocks_));
    ++on_free_list[static_cast<std::size_t>(block)];
  }
  for (auto position = evictable_lru_.begin(); position != evictable_lru_.end(); ++position) {
    const int block = *position;
    if (block < 0 || block >= n_blocks_)
      broken(fmt::format("LRU list holds block {}, outside [0, {})", block, n_blocks_));
    ++on_lru[static_cast<std::size_t>(block)];
    if (blocks_[static_cast<std::size_t>(block)].lru_position != position)
      broken(fmt::format("evictable block {}'s LRU position is stale", block));
  }
  for (std::size_t block = 0; block < n; ++block) {
    const Block& b = blocks_[block];
    if (b.ref_count != table_entries[block])
      broken(fmt::format("block {} has refcount {} but {} table entries name it", block, b.ref_count,
                         table_entries[block]));
    const bool used = b.ref_count > 0;
    const bool evictable = !used && b.cached;
    const bool free = !used && !b.cached;
    if (on_free_list[block] != (free ? 1 : 0))
      broken(fmt::format("block {} (refcount {}, cached {}) is on the free list {} times", block, b.ref_count, b.cached,
                         on_free_list[block]));
    if (on_lru[block] != (evictable ? 1 : 0))
      broken(fmt::format("block {} (refcount {}, cached {}) is in the LRU list {} times", block, b.ref_count, b.cached,
                         on_lru[block]));
  }
  if (free_blocks() + used_blocks() + evictable_blocks() != n_blocks_ || used_blocks() < 0)
    broken(fmt::format("free {} + used {} + evictable {} != {} blocks", free_blocks(), used_blocks(),
                       evictable_blocks(), n_blocks_));
}

void BlockManager::check_prefix_cache() const {
  int cached = 0;
  for (std::size_t block = 0; block < blocks_.size(); ++block) {
    const Block& b = blocks_[block];
    if (!b.cached) continue;
    ++cached;
    if (static_cast<int>(b.tokens.size()) != block_size_)
      broken(fmt::format("cached block {} stores {} tokens, not {}", block, b.tokens.size(), block_size_));
    if (hash_block(b.parent_hash, b.tokens) != b.hash)
      broken(fmt::format("cached block {}'s hash is not the hash of its parent hash and tokens", block));
    const auto found = by_hash_.find(b.hash);
    if (found == by_hash_.end() || found->second != static_cast<int>(block))
      broken(fmt::format("cached block {} is not the cache entry of its hash", block));
  }
  if (static_cast<int>(by_hash_.size()) != cached)
    broken(fmt::format("the cache has {} entries but {} blocks are marked cached", by_hash_.size(), cached));
  for (const auto& [hash, block] : by_hash_) {
    if (block < 0 || block >= n_blocks_)
      broken(fmt::format("a cache entry names block {}, outside [0, {})", block, n_blocks_));
    if (!blocks_[static_cast<std::size_t>(block)].cached || blocks_[static_cast<std::size_t>(block)].hash != hash)
      broken(fmt::format("a cache entry names block {}, which is not cached with that hash", block));
  }
}

void BlockManager::check_invariants() const {
  check_block_states(check_tables());
  check_prefix_cache();
}

}  // namespace step05
