// Step 05 (PagedAttention), CPU: the block manager. A seeded property test
// replays a million random operations against an independent model of the
// expected state; a content-level test moves fake K/V through the BlockCopy
// lists and checks that a write into a fork never reaches the other sequence;
// focused tests pin the error messages, eviction order, prefix hits and the
// InputErrors of bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "llm/errors.hpp"
#include "step05_paged_attention/block_manager.hpp"
#include "step05_paged_attention/prefix_hash.hpp"
#include "test_support.hpp"

namespace step05 {
namespace {

using Tokens = std::vector<int>;

std::vector<std::int32_t> table_of(const BlockManager& manager, int sequence) {
  const auto table = manager.block_table(sequence);
  return {table.begin(), table.end()};
}

// ---------------------------------------------------------------------------
// The model: what the manager's state must be, kept without hashes, free
// lists or serial numbers. Each physical block holds at most one "cell" (one
// block's worth of K/V) at a time; a cell in the prefix cache is keyed by the
// FULL token prefix up to its end (no hash, so no collision), and remembers
// the cell it was published under (a hit needs the cell matched one level up,
// as block_manager.hpp promises). The model decides which blocks an
// allocation may take (any free one, else exactly the least recently
// released evictable ones) and when the pool is short; the manager's physical
// ids are only bound to the model's cells after the fact.
class ReferenceModel {
 public:
  ReferenceModel(int n_blocks, int block_size, int max_sequences, int max_blocks_per_sequence)
      : block_size_(block_size),
        max_blocks_per_sequence_(max_blocks_per_sequence),
        slots_(static_cast<std::size_t>(n_blocks)),
        tables_(static_cast<std::size_t>(max_sequences)),
        tokens_(static_cast<std::size_t>(max_sequences)) {}

  int blocks_for(int positions) const { return (positions + block_size_ - 1) / block_size_; }
  int length(int sequence) const { return static_cast<int>(tokens_[sequence].size()); }
  const Tokens& tokens(int sequence) const { return tokens_[sequence]; }
  int free_blocks() const { return static_cast<int>(slots_.size()) - live_; }
  int evictable_blocks() const { return static_cast<int>(lru_.size()); }
  int used_blocks() const { return live_ - evictable_blocks(); }

  // Blocks reserve(sequence, first_write, end) must take: new ones and
  // copies of shared ones in the written range.
  int blocks_needed(int sequence, int first_write, int end) const {
    const auto& table = tables_[sequence];
    const int held = static_cast<int>(table.size());
    const int target = blocks_for(end);
    int needed = std::max(0, target - held);
    const int last = first_write < end ? std::min(held, target) : first_write / block_size_;
    for (int logical = first_write / block_size_; logical < last; ++logical)
      if (slots_[table[logical]].refs > 1) ++needed;
    return needed;
  }
  bool fits(int needed) const { return needed <= free_blocks() + evictable_blocks(); }

  // Which evictable blocks `needed` allocations reclaim: the least recently
  // released first, once the free blocks are gone. The model forgets them.
  std::vector<int> evict_for(int needed) {
    std::vector<int> evicted;
    for (int i = free_blocks(); i < needed; ++i) {
      const int block = lru_.front();
      evicted.push_back(block);
      uncache(block);
    }
    return evicted;
  }

  // reserve + the tokens written: positions first_write.. hold `written`.
  // `manager_table` is the manager's table afterwards: the model takes from
  // it only the blocks the manager allocated (the copies and the new ones),
  // checks that each was free or evicted for this very call (evict_for), and
  // keeps its own expectation for every other entry.
  void write(int sequence, int first_write, const Tokens& written, const std::vector<int>& evicted,
             const std::vector<std::int32_t>& manager_table) {
    auto& table = tables_[sequence];
    const int end = first_write + static_cast<int>(written.size());
    const int held = static_cast<int>(table.size());
    const int target = blocks_for(end);
    ASSERT_EQ(static_cast<int>(manager_table.size()), std::max(held, target));
    std::vector<int> taken;  // blocks the manager allocated
    for (int logical = first_write / block_size_; logical < std::min(held, target); ++logical) {
      const int block = table[logical];
      if (slots_[block].refs > 1) {
        --slots_[block].refs;
        table[logical] = manager_table[logical];
        taken.push_back(table[logical]);
      } else if (slots_[block].cached) {
        uncache(block);
      }
    }
    for (int logical = held; logical < target; ++logical) {
      table.push_back(manager_table[logical]);
      taken.push_back(table.back());
    }
    for (const int block : taken) {
      // Not live: free before the call, or evicted by it (evict_for forgot those).
      ASSERT_FALSE(slots_[block].live()) << "block " << block << " was allocated but holds a live cell";
      slots_[block] = Slot{1, false, {}, 0, next_id_++};
      ++live_;
    }
    for (const int block : evicted)
      ASSERT_TRUE(std::find(taken.begin(), taken.end(), block) != taken.end())
          << "evicted block " << block << " is not one of the blocks allocated";
    auto& tokens = tokens_[sequence];
    tokens.resize(static_cast<std::size_t>(first_write));
    tokens.insert(tokens.end(), written.begin(), written.end());
  }

  void truncate(int sequence, int new_length) {
    auto& table = tables_[sequence];
    const int keep = blocks_for(new_length);
    for (int logical = static_cast<int>(table.size()) - 1; logical >= keep; --logical) release(table[logical]);
    table.resize(static_cast<std::size_t>(keep));
    tokens_[sequence].resize(static_cast<std::size_t>(new_length));
  }

  void fork(int parent, int child, int n_positions) {
    const int shared = blocks_for(n_positions);
    tables_[child].assign(tables_[parent].begin(), tables_[parent].begin() + shared);
    for (const int block : tables_[child]) ++slots_[block].refs;
    tokens_[child].assign(tokens_[parent].begin(), tokens_[parent].begin() + n_positions);
  }

  // The cached cells a walk from block 0 along `tokens` matches.
  std::vector<int> match(const Tokens& tokens, int max_blocks) const {
    std::vector<int> matched;
    std::uint64_t parent = 0;  // the id of the cell matched one level up (0: none, block 0)
    const int full = std::min(static_cast<int>(tokens.size()) / block_size_, max_blocks);
    for (int logical = 0; logical < full; ++logical) {
      const auto found = cache_.find(Tokens(tokens.begin(), tokens.begin() + (logical + 1) * block_size_));
      if (found == cache_.end() || slots_[found->second].parent != parent) break;
      matched.push_back(found->second);
      parent = slots_[found->second].id;
    }
    return matched;
  }

  int share(int sequence, const Tokens& tokens, int max_positions) {
    const auto matched = match(tokens, std::clamp(max_positions / block_size_, 0, max_blocks_per_sequence_));
    for (const int block : matched) {
      if (slots_[block].refs++ == 0) lru_.remove(block);
    }
    tables_[sequence] = matched;
    const int positions = static_cast<int>(matched.size()) * block_size_;
    tokens_[sequence].assign(tokens.begin(), tokens.begin() + positions);
    return positions;
  }

  void publish(int sequence) {
    const auto& tokens = tokens_[sequence];
    const auto& table = tables_[sequence];
    std::uint64_t parent = 0;
    for (int logical = 0; logical < static_cast<int>(tokens.size()) / block_size_; ++logical) {
      Tokens key(tokens.begin(), tokens.begin() + (logical + 1) * block_size_);
      const int block = table[logical];
      Slot& own = slots_[block];
      if (own.cached) {
        ASSERT_EQ(own.key, key) << "the test's model lost track of block " << block << "'s content";
        own.parent = parent;
      } else if (const auto found = cache_.find(key); found == cache_.end()) {
        enter(block, std::move(key), parent);
      } else if (slots_[found->second].parent == parent) {
        parent = slots_[found->second].id;  // another block has it: the first copy wins
        continue;
      } else {
        uncache(found->second);  // unreachable (its parent left the cache): replaced
        enter(block, std::move(key), parent);
      }
      parent = own.id;
    }
  }

  // Compares every observable of the manager with the model.
  void expect_matches(const BlockManager& manager) const {
    ASSERT_EQ(manager.free_blocks(), free_blocks());
    ASSERT_EQ(manager.evictable_blocks(), evictable_blocks());
    ASSERT_EQ(manager.used_blocks(), used_blocks());
    ASSERT_EQ(manager.free_blocks() + manager.evictable_blocks() + manager.used_blocks(), manager.n_blocks());
    std::vector<int> entries(slots_.size(), 0);  // [n_blocks] table entries naming each block
    for (std::size_t sequence = 0; sequence < tables_.size(); ++sequence) {
      const auto table = manager.block_table(static_cast<int>(sequence));
      ASSERT_EQ(static_cast<int>(table.size()), blocks_for(length(static_cast<int>(sequence))))
          << "sequence " << sequence << " of length " << length(static_cast<int>(sequence));
      ASSERT_TRUE(std::equal(table.begin(), table.end(), tables_[sequence].begin(), tables_[sequence].end()))
          << "sequence " << sequence;
      for (const int block : table) ++entries[block];
    }
    for (std::size_t block = 0; block < slots_.size(); ++block) {
      const Slot& slot = slots_[block];
      ASSERT_EQ(slot.refs, entries[block]) << "block " << block;  // the model's own bookkeeping
      ASSERT_EQ(manager.ref_count(static_cast<int>(block)), entries[block]) << "block " << block;
      ASSERT_EQ(manager.is_cached(static_cast<int>(block)), slot.cached) << "block " << block;
      // Free in the model (nobody holds it, not cached): neither owned nor cached in the manager.
      if (!slot.live()) {
        ASSERT_EQ(manager.ref_count(static_cast<int>(block)), 0) << "block " << block;
        ASSERT_FALSE(manager.is_cached(static_cast<int>(block))) << "block " << block;
      }
    }
  }

 private:
  struct Slot {
    int refs = 0;
    bool cached = false;
    Tokens key;                // when cached: every token up to the end of this block
    std::uint64_t parent = 0;  // when cached: the id of the cell it was published under (0: none)
    std::uint64_t id = 0;      // unique per cell (a block re-used holds a new cell)
    bool live() const { return refs > 0 || cached; }
  };

  void enter(int block, Tokens key, std::uint64_t parent) {
    Slot& slot = slots_[block];
    slot.cached = true;
    slot.parent = parent;
    slot.id = next_id_++;  // a new publication: cells that hung under the old one do not hang under it
    cache_[key] = block;
    slot.key = std::move(key);
  }

  void uncache(int block) {
    Slot& slot = slots_[block];
    cache_.erase(slot.key);
    slot.cached = false;
    slot.key.clear();
    if (slot.refs == 0) {
      lru_.remove(block);
      --live_;
    }
  }

  void release(int block) {
    Slot& slot = slots_[block];
    if (--slot.refs > 0) return;
    if (slot.cached)
      lru_.push_back(block);
    else
      --live_;
  }

  int block_size_;
  int max_blocks_per_sequence_;
  std::vector<Slot> slots_;               // [n_blocks] the cell each physical block holds
  std::vector<std::vector<int>> tables_;  // [max_sequences][blocks held]
  std::vector<Tokens> tokens_;            // [max_sequences][length] what each sequence's positions hold
  std::map<Tokens, int> cache_;           // full prefix -> block
  std::list<int> lru_;                    // evictable blocks, least recently released first
  int live_ = 0;                          // blocks held or cached
  std::uint64_t next_id_ = 1;
};

// Everything a failed reserve must leave as it was.
struct Snapshot {
  std::vector<std::int32_t> tables;
  std::uint64_t version;
  int free, evictable, used;
  long long allocated, evictions, copies;

  explicit Snapshot(const BlockManager& m)
      : tables(m.all_tables().begin(), m.all_tables().end()),
        version(m.tables_version()),
        free(m.free_blocks()),
        evictable(m.evictable_blocks()),
        used(m.used_blocks()),
        allocated(m.counters().blocks_allocated),
        evictions(m.counters().evictions),
        copies(m.counters().copy_on_write) {}
  bool operator==(const Snapshot&) const = default;
};

// The random operations, against both the manager and the model.
class PropertyRun {
 public:
  static constexpr int kBlockSize = 4;
  static constexpr int kBlocks = 40;
  static constexpr int kSequences = 8;
  static constexpr int kContext = 64;  // 16 blocks per sequence: 8 long sequences need 128 > 40
  static constexpr int kVocab = 3;     // few ids: unrelated prompts share blocks too

  explicit PropertyRun(std::uint64_t seed)
      : manager_(kBlocks, kBlockSize, kSequences, kContext / kBlockSize),
        model_(kBlocks, kBlockSize, kSequences, kContext / kBlockSize),
        rng_(seed) {
    // Shared "system prompts": requests that start with one hit the cache.
    for (const int length : {12, 17, 26}) system_prompts_.push_back(random_tokens(length));
  }

  void step() {
    const int sequence = pick(kSequences);
    const int length = model_.length(sequence);
    const int op = pick(100);
    if (length == 0 && op < 60) {
      start(sequence);
    } else if (length == 0) {
      const int parent = pick(kSequences);
      if (parent != sequence && model_.length(parent) > 0) fork(parent, sequence, pick(model_.length(parent) + 1));
    } else if (op < 30) {
      write(sequence, length, random_tokens(1 + pick(6)));  // decode / chunked growth
    } else if (op < 40) {
      const int first = std::max(0, length - 2 * kBlockSize - 1) + pick(std::min(length, 2 * kBlockSize + 1) + 1);
      write(sequence, first, random_tokens(1 + pick(6)));  // rewrite a tail (a rollback and new tokens)
    } else if (op < 50) {
      truncate(sequence, pick(length + 1));
    } else if (op < 68) {
      free_sequence(sequence);
    } else if (op < 88) {
      manager_.publish_full_blocks(sequence, model_.tokens(sequence));
      model_.publish(sequence);
    } else {
      const Tokens query = prompt();
      ASSERT_EQ(manager_.cached_prefix_length(query),
                static_cast<int>(model_.match(query, kContext / kBlockSize).size()) * kBlockSize);
    }
  }

  void check() {
    manager_.check_invariants();
    model_.expect_matches(manager_);
  }

  void free_everything() {
    for (int sequence = 0; sequence < kSequences; ++sequence) free_sequence(sequence);
  }

  const BlockManager& manager() const { return manager_; }
  long long full_errors() const { return full_errors_; }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  Tokens random_tokens(int n) {
    Tokens tokens(static_cast<std::size_t>(n));
    for (int& token : tokens) token = pick(kVocab);
    return tokens;
  }
  Tokens prompt() {
    Tokens tokens = pick(4) == 0 ? Tokens{} : system_prompts_[pick(static_cast<int>(system_prompts_.size()))];
    const Tokens suffix = random_tokens(1 + pick(12));
    tokens.insert(tokens.end(), suffix.begin(), suffix.end());
    return tokens;
  }

  // A new request: the cached part of its prompt, then the rest written.
  void start(int sequence) {
    const Tokens tokens = prompt();
    const int size = static_cast<int>(tokens.size());
    const int max_positions = pick(3) == 0 ? pick(size + 1) : size - 1;  // usually: recompute the last token
    // The admission query, before anything changes: what sharing the prefix
    // and reserving the rest takes from the pool (checked after both, below).
    const int available_before = manager_.available_blocks();
    const int admit_needed = manager_.blocks_needed_to_admit(tokens, max_positions, size);
    const int shared = manager_.share_cached_prefix(sequence, tokens, max_positions);
    ASSERT_EQ(shared, model_.share(sequence, tokens, max_positions));
    check();
    const long long full_before = full_errors_;
    write(sequence, shared, Tokens(tokens.begin() + shared, tokens.end()));
    if (size <= kContext && full_errors_ == full_before)
      ASSERT_EQ(available_before - manager_.available_blocks(), admit_needed) << "blocks_needed_to_admit";
    else if (size <= kContext)
      ASSERT_GT(admit_needed, available_before) << "blocks_needed_to_admit said it fits; reserve found it full";
    if (pick(2) == 0) {
      manager_.publish_full_blocks(sequence, model_.tokens(sequence));
      model_.publish(sequence);
    }
  }

  // reserve(first_write, end) and the tokens, then forget what lay past end.
  void write(int sequence, int first_write, Tokens written) {
    written.resize(std::min(written.size(), static_cast<std::size_t>(kContext - first_write)));
    if (written.empty()) return;
    const int end = first_write + static_cast<int>(written.size());
    const int old_length = model_.length(sequence);
    const int needed = model_.blocks_needed(sequence, first_write, end);
    // The side-effect-free query agrees with the model.
    ASSERT_EQ(manager_.blocks_needed_to_reserve(sequence, first_write, end), needed);
    ASSERT_EQ(manager_.can_reserve(sequence, first_write, end), model_.fits(needed));
    if (!model_.fits(needed)) {
      const Snapshot before(manager_);
      ASSERT_THROW(manager_.reserve(sequence, first_write, end), llm::KvCacheFullError);
      ASSERT_TRUE(Snapshot(manager_) == before) << "a failed reserve changed the manager";
      ++full_errors_;
      return;
    }
    const long long evictions_before = manager_.counters().evictions;
    const auto copies = manager_.reserve(sequence, first_write, end);
    const std::vector<int> evicted = model_.evict_for(needed);
    ASSERT_EQ(manager_.counters().evictions - evictions_before, static_cast<long long>(evicted.size()));
    model_.write(sequence, first_write, written, evicted, table_of(manager_, sequence));
    for (const BlockCopy& copy : copies) ASSERT_NE(copy.from, copy.to);
    if (end < old_length) {
      manager_.truncate(sequence, end);
      model_.truncate(sequence, end);
    }
  }

  void truncate(int sequence, int new_length) {
    manager_.truncate(sequence, new_length);
    model_.truncate(sequence, new_length);
  }
  void free_sequence(int sequence) { truncate(sequence, 0); }
  void fork(int parent, int child, int n_positions) {
    manager_.fork(parent, child, n_positions);
    model_.fork(parent, child, n_positions);
  }

  BlockManager manager_;
  ReferenceModel model_;
  std::mt19937_64 rng_;
  std::vector<Tokens> system_prompts_;
  long long full_errors_ = 0;
};

TEST(BlockManagerProperty, AMillionRandomOperationsMatchTheModel) {
  constexpr long long kOperations = 1'000'000;
  PropertyRun run(20240605);
  for (long long op = 0; op < kOperations; ++op) {
    run.step();
    run.check();
    if (::testing::Test::HasFatalFailure()) FAIL() << "after operation " << op;
  }
  // The run exercised what it claims to (it cannot pass vacuously).
  const BlockManagerCounters& counters = run.manager().counters();
  EXPECT_GT(counters.prefix_hit_blocks, 10'000);
  EXPECT_GT(counters.evictions, 10'000);
  EXPECT_GT(counters.copy_on_write, 10'000);
  EXPECT_GT(counters.published_blocks, 10'000);
  EXPECT_GT(run.full_errors(), 1'000);
  // No leak: with every sequence gone, nothing is held.
  run.free_everything();
  run.check();
  EXPECT_EQ(run.manager().used_blocks(), 0);
  EXPECT_EQ(run.manager().free_blocks() + run.manager().evictable_blocks(), run.manager().n_blocks());
}

// ---------------------------------------------------------------------------
// Content: a fake pool of one int per position, written through the tables
// and copied by the BlockCopy lists as a cache does.
class FakeKvPool {
 public:
  FakeKvPool(int n_blocks, int block_size)
      : block_size_(block_size), rows_(static_cast<std::size_t>(n_blocks) * block_size, -1) {}

  // What a paged cache does around one forward: reserve, copy, write.
  void write(BlockManager& manager, int sequence, int first_write, const Tokens& values) {
    const int end = first_write + static_cast<int>(values.size());
    for (const BlockCopy& copy : manager.reserve(sequence, first_write, end))
      std::copy_n(rows_.begin() + static_cast<std::ptrdiff_t>(copy.from) * block_size_, block_size_,
                  rows_.begin() + static_cast<std::ptrdiff_t>(copy.to) * block_size_);
    const auto table = manager.block_table(sequence);
    for (int position = first_write; position < end; ++position)
      rows_[row(table, position)] = values[static_cast<std::size_t>(position - first_write)];
  }

  Tokens read(const BlockManager& manager, int sequence, int length) const {
    const auto table = manager.block_table(sequence);
    Tokens values;
    for (int position = 0; position < length; ++position) values.push_back(rows_[row(table, position)]);
    return values;
  }

 private:
  std::size_t row(std::span<const std::int32_t> table, int position) const {
    return static_cast<std::size_t>(table[position / block_size_]) * block_size_ + position % block_size_;
  }
  int block_size_;
  std::vector<int> rows_;  // [n_blocks, block_size] one "K/V row" per position
};

TEST(BlockManagerCopyOnWrite, WritesIntoAForkNeverReachTheOtherSequence) {
  constexpr int kBlockSize = 4;
  BlockManager manager(64, kBlockSize, 4, 16);  // 4 x 16 blocks: never full
  FakeKvPool pool(64, kBlockSize);
  std::mt19937 rng(7);
  std::vector<Tokens> expected(4);  // what each sequence must read back

  const Tokens prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};  // 2.5 blocks
  pool.write(manager, 0, 0, prompt);
  expected[0] = prompt;
  for (int round = 0; round < 200; ++round) {
    // Fork 1..3 from a random live sequence at a random length, write into
    // the fork (sometimes rewriting shared positions), and check everyone.
    const int child = 1 + static_cast<int>(rng() % 3);
    int parent = static_cast<int>(rng() % 4);
    if (parent == child || expected[parent].empty()) parent = 0;
    manager.free_sequence(child);
    const int n = static_cast<int>(rng() % (expected[parent].size() + 1));
    manager.fork(parent, child, n);
    expected[child].assign(expected[parent].begin(), expected[parent].begin() + n);
    const int first_write = static_cast<int>(rng() % (expected[child].size() + 1));
    Tokens values(std::min<std::size_t>(1 + rng() % 6, 64 - first_write));
    for (int& v : values) v = 100 * (round + 1) + static_cast<int>(rng() % 100);
    pool.write(manager, child, first_write, values);
    expected[child].resize(static_cast<std::size_t>(first_write));
    expected[child].insert(expected[child].end(), values.begin(), values.end());
    // The parent writes too, into its own (possibly shared) tail.
    if (rng() % 2 == 0 && expected[parent].size() < 40) {
      const Tokens more = {-round, -round - 1};
      pool.write(manager, parent, static_cast<int>(expected[parent].size()), more);
      expected[parent].insert(expected[parent].end(), more.begin(), more.end());
    }
    for (int sequence = 0; sequence < 4; ++sequence)
      ASSERT_EQ(pool.read(manager, sequence, static_cast<int>(expected[sequence].size())), expected[sequence])
          << "sequence " << sequence << " after round " << round;
    manager.check_invariants();
  }
  EXPECT_GT(manager.counters().copy_on_write, 50);
}

TEST(BlockManagerCopyOnWrite, ForkSharesThenCopiesThePartialLastBlock) {
  BlockManager manager(8, 4, 2, 4);
  manager.reserve(0, 0, 6);  // blocks 0, 1 (the second half full)
  manager.fork(0, 1, 6);
  EXPECT_EQ(table_of(manager, 1), table_of(manager, 0));
  EXPECT_EQ(manager.ref_count(table_of(manager, 0)[1]), 2);
  const auto copies = manager.reserve(1, 6, 7);  // the child writes position 6: inside shared block 1
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].from, table_of(manager, 0)[1]);
  EXPECT_EQ(copies[0].to, table_of(manager, 1)[1]);
  EXPECT_EQ(table_of(manager, 1)[0], table_of(manager, 0)[0]);  // block 0 stays shared: nobody writes it
  EXPECT_EQ(manager.ref_count(table_of(manager, 0)[0]), 2);
  EXPECT_EQ(manager.counters().copy_on_write, 1);
  EXPECT_TRUE(manager.reserve(1, 7, 8).empty());  // the copy is private now
  manager.check_invariants();
}

// Copy-on-write bookkeeping (exercise ex05.1), three sequences on blocks of
// 3: only the held blocks a write falls in are copied, in logical order, each
// copy is private (refcount 1) and the original loses exactly one holder; a
// block nobody else holds is written in place.
TEST(BlockManagerCopyOnWrite, CopiesExactlyTheSharedBlocksAWriteFallsIn) {
  BlockManager manager(10, 3, 3, 4);
  manager.reserve(0, 0, 8);  // positions 0..7: blocks A, B, C (C half full)
  const auto a = table_of(manager, 0)[0], b = table_of(manager, 0)[1], c = table_of(manager, 0)[2];
  manager.fork(0, 1, 8);     // sequence 1 shares A, B, C
  manager.fork(0, 2, 5);     // sequence 2 shares A, B
  EXPECT_EQ(manager.ref_count(a), 3);
  EXPECT_EQ(manager.ref_count(b), 3);
  EXPECT_EQ(manager.ref_count(c), 2);

  // Sequence 2 writes positions 4..6: into B (shared) and one new block.
  EXPECT_EQ(manager.blocks_needed_to_reserve(2, 4, 7), 2);  // one copy + one new block
  auto copies = manager.reserve(2, 4, 7);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].from, b);
  EXPECT_EQ(copies[0].to, table_of(manager, 2)[1]);
  EXPECT_EQ(table_of(manager, 2)[0], a) << "A is not written: it stays shared";
  EXPECT_EQ(manager.ref_count(a), 3);
  EXPECT_EQ(manager.ref_count(b), 2);
  EXPECT_EQ(manager.ref_count(copies[0].to), 1);
  EXPECT_EQ(table_of(manager, 0), (std::vector<std::int32_t>{a, b, c})) << "the other holders keep the original";
  EXPECT_EQ(table_of(manager, 1), (std::vector<std::int32_t>{a, b, c}));
  manager.check_invariants();

  // Sequence 1 writes position 8: into C, shared with sequence 0 only.
  copies = manager.reserve(1, 8, 9);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].from, c);
  EXPECT_EQ(table_of(manager, 1)[2], copies[0].to);
  EXPECT_EQ(manager.ref_count(c), 1);
  // Now sequence 0 holds C alone: its write needs no copy.
  EXPECT_EQ(manager.blocks_needed_to_reserve(0, 8, 9), 0);
  EXPECT_TRUE(manager.reserve(0, 8, 9).empty());
  EXPECT_EQ(table_of(manager, 0)[2], c);

  // Sequence 1 rewrites positions 2..4: A (3 holders) and B (2), in that order.
  copies = manager.reserve(1, 2, 5);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].from, a);
  EXPECT_EQ(copies[1].from, b);
  EXPECT_EQ(table_of(manager, 1)[0], copies[0].to);
  EXPECT_EQ(table_of(manager, 1)[1], copies[1].to);
  EXPECT_NE(copies[0].to, copies[1].to);
  EXPECT_EQ(manager.ref_count(a), 2);
  EXPECT_EQ(manager.ref_count(b), 1);
  EXPECT_EQ(manager.counters().copy_on_write, 4);
  manager.check_invariants();

  // A write that starts right after a full shared block copies nothing.
  manager.free_sequence(2);
  manager.fork(0, 2, 6);  // A and B, both full
  EXPECT_TRUE(manager.reserve(2, 6, 7).empty());
  EXPECT_EQ(table_of(manager, 2)[0], a);
  EXPECT_EQ(table_of(manager, 2)[1], b);
  EXPECT_EQ(manager.ref_count(b), 2);
  EXPECT_EQ(manager.counters().copy_on_write, 4);
  manager.check_invariants();
}

// ---------------------------------------------------------------------------
// Focused tests.

TEST(BlockManager, OutOfBlocksSaysHowManyAndChangesNothing) {
  BlockManager manager(5, 4, 3, 8);
  manager.reserve(0, 0, 12);  // 3 blocks
  manager.fork(0, 1, 12);     // shares all 3
  const Snapshot before(manager);
  try {
    // 2 new blocks + 1 copy of the shared block 2 (position 10 is in it) = 3 > 2.
    manager.reserve(1, 10, 20);
    FAIL() << "expected KvCacheFullError";
  } catch (const llm::KvCacheFullError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(llm::testing::HasSubstr(message, "needs 3 blocks"));
    EXPECT_TRUE(llm::testing::HasSubstr(message, "2 new, 1 copy-on-write"));
    EXPECT_TRUE(llm::testing::HasSubstr(message, "only 2 are available"));
    EXPECT_TRUE(llm::testing::HasSubstr(message, "of 5"));
  }
  EXPECT_TRUE(Snapshot(manager) == before);
  manager.check_invariants();
  // What fits still works: 1 new block + the copy.
  EXPECT_EQ(manager.reserve(1, 10, 16).size(), 1u);
  EXPECT_EQ(manager.free_blocks(), 0);
  manager.check_invariants();
}

TEST(BlockManager, EvictableBlocksComeBackOnAPrefixHit) {
  BlockManager manager(6, 4, 2, 4);
  const Tokens prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  manager.reserve(0, 0, 9);
  manager.publish_full_blocks(0, prompt);
  EXPECT_EQ(manager.counters().published_blocks, 2);  // the partial third block is not entered
  const auto first_table = table_of(manager, 0);
  manager.free_sequence(0);
  EXPECT_EQ(manager.evictable_blocks(), 2);
  EXPECT_EQ(manager.free_blocks(), 4);
  EXPECT_EQ(manager.available_blocks(), 6);

  EXPECT_EQ(manager.cached_prefix_length(prompt), 8);
  EXPECT_EQ(manager.share_cached_prefix(1, prompt, 8), 8);
  EXPECT_EQ(table_of(manager, 1), std::vector<std::int32_t>(first_table.begin(), first_table.begin() + 2));
  EXPECT_EQ(manager.evictable_blocks(), 0);
  EXPECT_EQ(manager.used_blocks(), 2);
  EXPECT_EQ(manager.ref_count(first_table[0]), 1);
  EXPECT_EQ(manager.counters().prefix_hit_blocks, 2);
  // max_positions rounds down to whole blocks.
  manager.free_sequence(1);
  EXPECT_EQ(manager.share_cached_prefix(1, prompt, 7), 4);
  manager.check_invariants();
}

TEST(BlockManager, EvictsTheLeastRecentlyReleasedTailFirst) {
  BlockManager manager(6, 2, 3, 3);
  const Tokens a = {1, 1, 2, 2, 3, 3};
  const Tokens b = {4, 4, 5, 5, 6, 6};
  manager.reserve(0, 0, 6);
  manager.publish_full_blocks(0, a);
  manager.reserve(1, 0, 6);
  manager.publish_full_blocks(1, b);
  const auto a_blocks = table_of(manager, 0);
  const auto b_blocks = table_of(manager, 1);
  manager.free_sequence(0);  // a's blocks released first: tail, middle, head
  manager.free_sequence(1);
  ASSERT_EQ(manager.free_blocks(), 0);
  ASSERT_EQ(manager.evictable_blocks(), 6);
  // One new block evicts a's tail; a's head still hits, its full prefix does not.
  manager.reserve(2, 0, 2);
  EXPECT_EQ(table_of(manager, 2)[0], a_blocks[2]);
  EXPECT_EQ(manager.counters().evictions, 1);
  EXPECT_EQ(manager.cached_prefix_length(a), 4);
  EXPECT_EQ(manager.cached_prefix_length(b), 6);
  // Two more: a's middle, then a's head, before anything of b.
  manager.reserve(2, 2, 6);
  EXPECT_EQ(table_of(manager, 2)[1], a_blocks[1]);
  EXPECT_EQ(table_of(manager, 2)[2], a_blocks[0]);
  EXPECT_EQ(manager.cached_prefix_length(a), 0);
  EXPECT_EQ(manager.cached_prefix_length(b), 6);
  for (const int block : b_blocks) EXPECT_TRUE(manager.is_cached(block));
  manager.check_invariants();
}

TEST(BlockManager, APrefixHitTouchesItsBlocksAgain) {
  // A block taken back by a hit and released later is younger than one
  // released in between.
  BlockManager manager(2, 2, 2, 1);
  manager.reserve(0, 0, 2);
  manager.publish_full_blocks(0, Tokens{1, 1});
  manager.reserve(1, 0, 2);
  manager.publish_full_blocks(1, Tokens{2, 2});
  const int block_of_1 = table_of(manager, 0)[0];
  manager.free_sequence(0);
  manager.free_sequence(1);
  EXPECT_EQ(manager.share_cached_prefix(0, Tokens{1, 1}, 2), 2);  // {1, 1} is used again...
  manager.free_sequence(0);                                       // ...and released last
  manager.reserve(1, 0, 2);                                       // evicts {2, 2}
  EXPECT_NE(table_of(manager, 1)[0], block_of_1);
  EXPECT_EQ(manager.cached_prefix_length(Tokens{1, 1}), 2);
  EXPECT_EQ(manager.cached_prefix_length(Tokens{2, 2}), 0);
}

TEST(BlockManager, OnlyTheSameTokensUnderTheSameParentHit) {
  BlockManager manager(8, 4, 2, 4);
  const Tokens published = {1, 2, 3, 4, 5, 6, 7, 8};
  manager.reserve(0, 0, 8);
  manager.publish_full_blocks(0, published);
  EXPECT_EQ(manager.cached_prefix_length(published), 8);
  EXPECT_EQ(manager.cached_prefix_length(Tokens{1, 2, 3, 4, 5, 6, 7, 9}), 4);  // same parent, other tokens
  EXPECT_EQ(manager.cached_prefix_length(Tokens{1, 2, 3, 5, 5, 6, 7, 8}), 0);  // other parent, same tokens
  EXPECT_EQ(manager.cached_prefix_length(Tokens{5, 6, 7, 8}), 0);              // a block is not a prefix
  EXPECT_EQ(manager.cached_prefix_length(Tokens{1, 2, 3, 4, 5, 6, 7}), 4);     // a partial block never hits
  EXPECT_EQ(manager.cached_prefix_length(Tokens{}), 0);
  // cached_prefix_length changes nothing.
  EXPECT_EQ(manager.counters().prefix_queries, 0);
  EXPECT_EQ(manager.ref_count(table_of(manager, 0)[0]), 1);
}

// Two different 2-token blocks with the same key under the root: [a, d] and
// [b, 0], where the keys of [a] and [b] differ by d < 2^32. The last step of
// hash_block adds the token before mixing, so the two chains meet there. A
// birthday search over 2^18 first tokens finds such a pair (about 16 are
// expected): real 64-bit collisions, built in milliseconds.
std::pair<Tokens, Tokens> colliding_blocks() {
  constexpr int kCandidates = 1 << 18;
  std::vector<std::pair<std::uint64_t, int>> keys;  // [kCandidates] (key of [a], a)
  keys.reserve(kCandidates);
  for (int a = 0; a < kCandidates; ++a) {
    const int block[] = {a};
    keys.emplace_back(hash_block(kPrefixHashRoot, block), a);
  }
  std::sort(keys.begin(), keys.end());
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    const std::uint64_t gap = keys[i + 1].first - keys[i].first;
    if (gap < (std::uint64_t{1} << 32))
      return {Tokens{keys[i].second, static_cast<int>(static_cast<std::uint32_t>(gap))}, Tokens{keys[i + 1].second, 0}};
  }
  ADD_FAILURE() << "no colliding pair among " << kCandidates << " candidates";
  return {};
}

TEST(BlockManager, ARealHashCollisionNeverHits) {
  const auto [cached, other] = colliding_blocks();
  ASSERT_EQ(cached.size(), 2u);
  ASSERT_NE(cached, other);
  ASSERT_EQ(hash_block(kPrefixHashRoot, cached), hash_block(kPrefixHashRoot, other));
  BlockManager manager(8, 2, 3, 4);
  manager.reserve(0, 0, 2);
  manager.publish_full_blocks(0, cached);
  EXPECT_EQ(manager.cached_prefix_length(cached), 2);
  // Same parent (the root), same key, other tokens: the stored tokens differ.
  EXPECT_EQ(manager.cached_prefix_length(other), 0);
  EXPECT_EQ(manager.share_cached_prefix(1, other, 2), 0);
  // Publishing the other block finds its key taken by other tokens: it
  // stays out, and so does every block after it.
  Tokens longer = other;
  longer.insert(longer.end(), {5, 5});
  manager.reserve(1, 0, 4);
  manager.publish_full_blocks(1, longer);
  for (const int block : table_of(manager, 1)) EXPECT_FALSE(manager.is_cached(block));
  EXPECT_EQ(manager.counters().published_blocks, 1);
  manager.check_invariants();
}

TEST(BlockManager, ACollidingParentNeverAdoptsAnotherPrefixsChild) {
  // [a, d, 7, 7] and [b, 0, 7, 7]: equal keys at both levels, and the same
  // parent key and tokens for the second block.
  const auto [first, second] = colliding_blocks();
  ASSERT_EQ(first.size(), 2u);
  const Tokens child = {7, 7};
  Tokens first_prefix = first, second_prefix = second;
  first_prefix.insert(first_prefix.end(), child.begin(), child.end());
  second_prefix.insert(second_prefix.end(), child.begin(), child.end());
  BlockManager manager(8, 2, 3, 4);
  manager.reserve(0, 0, 4);
  manager.publish_full_blocks(0, first_prefix);
  // Sequence 0 keeps its first block and rewrites it: that block leaves the
  // cache, its child ([7, 7] computed after [a, d]) stays there, evictable.
  manager.truncate(0, 1);
  manager.reserve(0, 1, 2);
  EXPECT_EQ(manager.cached_prefix_length(first_prefix), 0);
  EXPECT_EQ(manager.evictable_blocks(), 1);
  // The colliding block takes the freed key...
  manager.reserve(1, 0, 2);
  manager.publish_full_blocks(1, second);
  EXPECT_EQ(manager.cached_prefix_length(second), 2);
  // ...and the old child matches the walk's parent key and its own tokens,
  // but hangs under the old entry: no hit.
  EXPECT_EQ(manager.cached_prefix_length(second_prefix), 2);
  EXPECT_EQ(manager.share_cached_prefix(2, second_prefix, 4), 2);
  manager.check_invariants();
}

TEST(BlockManager, PublishingTwiceOrADuplicateKeepsTheFirstCopy) {
  BlockManager manager(8, 2, 3, 4);
  const Tokens tokens = {1, 2, 3, 4};
  manager.reserve(0, 0, 4);
  manager.publish_full_blocks(0, tokens);
  manager.publish_full_blocks(0, tokens);  // already cached: stays as is
  EXPECT_EQ(manager.counters().published_blocks, 2);
  manager.reserve(1, 0, 4);  // the same prefix, computed again in other blocks
  manager.publish_full_blocks(1, tokens);
  EXPECT_EQ(manager.counters().published_blocks, 2);
  for (const int block : table_of(manager, 1)) EXPECT_FALSE(manager.is_cached(block));
  EXPECT_EQ(manager.share_cached_prefix(2, tokens, 4), 4);
  EXPECT_EQ(table_of(manager, 2), table_of(manager, 0));
  manager.check_invariants();
}

TEST(BlockManager, AWrittenBlockLeavesTheCacheAndItsChildrenWithIt) {
  BlockManager manager(8, 2, 3, 4);
  const Tokens tokens = {1, 2, 3, 4, 5, 6};
  manager.reserve(0, 0, 6);
  manager.publish_full_blocks(0, tokens);
  manager.fork(0, 1, 6);  // holds the same blocks: a write by 0 now copies
  manager.truncate(0, 1);
  EXPECT_EQ(manager.reserve(0, 1, 2).size(), 1u);      // block 0 is shared with 1: copied
  EXPECT_EQ(manager.cached_prefix_length(tokens), 6);  // the original is still cached
  manager.free_sequence(0);

  // Sequence 1 alone rewrites its block 0: the block leaves the cache...
  const int head = table_of(manager, 1)[0];
  manager.reserve(1, 1, 2);
  EXPECT_FALSE(manager.is_cached(head));
  EXPECT_EQ(manager.cached_prefix_length(tokens), 0);
  // ...and the cached blocks after it cannot be reached from block 0, even
  // when the same head is published again by another sequence...
  manager.reserve(2, 0, 2);
  manager.publish_full_blocks(2, Tokens{1, 2});
  EXPECT_EQ(manager.cached_prefix_length(tokens), 2);
  // ...until the whole prefix is published again.
  manager.free_sequence(1);
  manager.reserve(2, 2, 6);
  manager.publish_full_blocks(2, tokens);
  EXPECT_EQ(manager.cached_prefix_length(tokens), 6);
  manager.check_invariants();
}

TEST(BlockManager, TablesVersionChangesWithTheTablesOnly) {
  BlockManager manager(8, 2, 2, 4);
  auto version = manager.tables_version();
  const auto expect_changed = [&](bool changed) {
    EXPECT_EQ(manager.tables_version() != version, changed);
    version = manager.tables_version();
  };
  manager.reserve(0, 0, 3);
  expect_changed(true);
  manager.reserve(0, 3, 4);  // room already held
  expect_changed(false);
  manager.publish_full_blocks(0, Tokens{1, 2, 3, 4});
  expect_changed(false);
  EXPECT_EQ(manager.cached_prefix_length(Tokens{1, 2, 3, 4}), 4);
  expect_changed(false);
  manager.fork(0, 1, 4);
  expect_changed(true);
  manager.reserve(1, 3, 4);  // copy-on-write: a new entry
  expect_changed(true);
  manager.truncate(1, 4);
  expect_changed(false);
  manager.free_sequence(1);
  expect_changed(true);
  EXPECT_EQ(manager.share_cached_prefix(1, Tokens{1, 2, 3, 4}, 4), 4);
  expect_changed(true);
  const auto all = manager.all_tables();
  EXPECT_EQ(all.size(), 8u);
  EXPECT_EQ(all[4], manager.block_table(1)[0]);
  EXPECT_EQ(all[6], -1);
}

TEST(BlockManager, BadArgumentsAreInputErrors) {
  EXPECT_THROW(BlockManager(0, 4, 1, 1), llm::InputError);
  EXPECT_THROW(BlockManager(4, 0, 1, 1), llm::InputError);
  EXPECT_THROW(BlockManager(4, 4, 0, 1), llm::InputError);
  EXPECT_THROW(BlockManager(4, 4, 1, 0), llm::InputError);
  EXPECT_THROW(BlockManager(4, 1 << 20, 1, 1 << 20), llm::InputError);  // positions overflow an int

  BlockManager manager(8, 4, 2, 3);
  manager.reserve(0, 0, 5);
  EXPECT_THROW(manager.reserve(-1, 0, 1), llm::InputError);
  EXPECT_THROW(manager.reserve(2, 0, 1), llm::InputError);
  EXPECT_THROW(manager.reserve(0, 0, 13), llm::InputError);  // past 3 blocks of 4
  EXPECT_THROW(manager.reserve(0, 6, 5), llm::InputError);   // first_write > end
  EXPECT_THROW(manager.reserve(0, 9, 10), llm::InputError);  // a gap after the 8 positions held
  EXPECT_THROW(manager.reserve(0, -1, 2), llm::InputError);
  EXPECT_THROW(manager.truncate(0, 9), llm::InputError);
  EXPECT_THROW(manager.truncate(0, -1), llm::InputError);
  EXPECT_THROW(manager.truncate(5, 0), llm::InputError);
  EXPECT_THROW(manager.fork(0, 0, 1), llm::InputError);
  EXPECT_THROW(manager.fork(0, 1, 9), llm::InputError);  // the parent holds 8 positions
  EXPECT_THROW(manager.fork(0, 7, 1), llm::InputError);
  EXPECT_THROW(manager.fork(1, 0, 0), llm::InputError);                                  // the child holds blocks
  EXPECT_THROW(manager.share_cached_prefix(0, Tokens{1, 2, 3, 4}, 4), llm::InputError);  // holds blocks
  EXPECT_THROW(manager.share_cached_prefix(9, Tokens{1, 2, 3, 4}, 4), llm::InputError);
  EXPECT_THROW(manager.publish_full_blocks(0, Tokens(12, 1)), llm::InputError);  // 3 blocks, 2 held
  EXPECT_THROW(manager.publish_full_blocks(3, Tokens(4, 1)), llm::InputError);
  EXPECT_THROW(manager.block_table(2), llm::InputError);
  EXPECT_THROW(manager.blocks_held(-1), llm::InputError);
  EXPECT_THROW(manager.ref_count(8), llm::InputError);
  EXPECT_THROW(manager.is_cached(-1), llm::InputError);
  // Tokens that contradict a cached block's.
  manager.publish_full_blocks(0, Tokens{1, 2, 3, 4});
  EXPECT_THROW(manager.publish_full_blocks(0, Tokens{1, 2, 3, 5}), llm::InputError);
  manager.check_invariants();
  EXPECT_EQ(manager.blocks_held(0), 2);
}

}  // namespace
}  // namespace step05
