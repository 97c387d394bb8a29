"""Paged KV block pool + per-request block tables with prefix caching (mtpx.core.block_pool,
mtpx.core.kv_cache_manager): exact-value unit tests and a hypothesis state-machine test against an
independent model (prefix tuples instead of hashes, a plain list as the LRU free queue)."""
from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from mtpx.core.block_pool import ROOT_HASH, BlockPool, NoFreeBlocksError, hash_block, lookahead_key
from mtpx.core.kv_cache_manager import KVCacheManager


def chain(token_ids, block_size):
    """Chained hashes of the full blocks of token_ids."""
    out, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


def snapshot(mgr: KVCacheManager):
    p = mgr.pool
    return (list(p.ref_cnt), list(p.block_hash), p.free_block_ids(), p.cached_hashes(),
            {r: list(t) for r, t in mgr._tables.items()}, {r: list(h) for r, h in mgr._keys.items()})


# ----------------------------------------------------------------------------- hash_block
def test_hash_block_exact_and_chained():
    expected = hashlib.sha256(ROOT_HASH + struct.pack("<3q", 1, 2, -3)).digest()
    assert hash_block(None, [1, 2, -3]) == expected
    assert len(expected) == 32
    h0 = hash_block(None, [1, 2])
    assert hash_block(h0, [3, 4]) == hashlib.sha256(h0 + struct.pack("<2q", 3, 4)).digest()
    # the same block content under different parents hashes differently
    assert hash_block(h0, [3, 4]) != hash_block(hash_block(None, [1, 5]), [3, 4])
    assert hash_block(None, [3, 4]) != hash_block(h0, [3, 4])
    # deterministic, order-sensitive, and no collision between (1,) and (1, 0)
    assert hash_block(None, (7, 8)) == hash_block(None, [7, 8])
    assert hash_block(None, [7, 8]) != hash_block(None, [8, 7])
    assert hash_block(None, [1]) != hash_block(None, [1, 0])
    with pytest.raises(struct.error):
        hash_block(None, [2 ** 63])
    with pytest.raises(TypeError):
        hash_block("abc", [1])


# ----------------------------------------------------------------------------- BlockPool
def test_pool_allocate_free_order_and_errors():
    pool = BlockPool(5, 4)
    assert pool.num_free_blocks == 5 and pool.free_block_ids() == [0, 1, 2, 3, 4]
    assert pool.allocate(0) == []
    assert pool.allocate(2) == [0, 1]
    assert pool.ref_cnt == [1, 1, 0, 0, 0] and pool.num_free_blocks == 3
    with pytest.raises(NoFreeBlocksError, match=r"asked for 4 .* only 3"):
        pool.allocate(4)
    assert pool.ref_cnt == [1, 1, 0, 0, 0] and pool.free_block_ids() == [2, 3, 4]
    with pytest.raises(ValueError):
        pool.allocate(-1)
    assert pool.allocate(3) == [2, 3, 4]
    pool.free([4, 2, 0])                      # appended at the end in the order given
    assert pool.free_block_ids() == [4, 2, 0]
    assert pool.allocate(1) == [4]
    with pytest.raises(ValueError, match="double free"):
        pool.free([2])
    with pytest.raises(ValueError, match="double free"):
        pool.free([1, 1])                     # ref_cnt 1: nothing may change
    assert pool.ref_cnt == [0, 1, 0, 1, 1]
    with pytest.raises(IndexError):
        pool.free([5])
    with pytest.raises(ValueError):
        BlockPool(0, 4)
    with pytest.raises(ValueError):
        BlockPool(4, 0)


def test_pool_publish_touch_evict():
    pool = BlockPool(4, 2)
    a, b = pool.allocate(2)
    ha, hb = hash_block(None, [1, 2]), hash_block(None, [3, 4])
    assert pool.publish(a, ha) is True
    assert pool.publish(a, ha) is True                 # idempotent
    with pytest.raises(ValueError):
        pool.publish(a, hb)                            # different hash for a published block
    assert pool.publish(b, ha) is False                # duplicate content stays private
    assert pool.block_hash[b] is None and not pool.is_published(b)
    assert pool.lookup(ha) == a and pool.lookup(hb) is None and pool.is_published(a)
    with pytest.raises(ValueError):
        pool.publish(3, hb)                            # unreferenced
    pool.free([b, a])
    assert pool.free_block_ids() == [2, 3, b, a]
    assert pool.lookup(ha) == a                        # still cached while free
    pool.touch([a])                                    # prefix hit: leaves the free queue
    assert pool.ref_cnt[a] == 1 and pool.free_block_ids() == [2, 3, b]
    pool.touch([a])
    assert pool.ref_cnt[a] == 2
    pool.free([a, a])
    assert pool.free_block_ids() == [2, 3, b, a] and pool.num_free_blocks == 4
    assert pool.allocate(3) == [2, 3, b]
    assert pool.lookup(ha) == a
    assert pool.allocate(1) == [a]                     # evicted on reuse
    assert pool.lookup(ha) is None and pool.block_hash[a] is None
    assert pool.reset_prefix_cache() is False          # blocks referenced


def test_pool_reset_prefix_cache():
    pool = BlockPool(3, 1)
    blocks = pool.allocate(3)
    for i, blk in enumerate(blocks):
        assert pool.publish(blk, hash_block(None, [i]))
    assert pool.reset_prefix_cache() is False and pool.num_cached_blocks == 3
    pool.free(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.num_cached_blocks == 0 and pool.block_hash == [None] * 3
    assert pool.free_block_ids() == [0, 1, 2]


# ----------------------------------------------------------------------------- KVCacheManager
def test_manager_constructor_validation():
    with pytest.raises(ValueError, match="engine.num_blocks"):
        KVCacheManager(0, 4, True)
    with pytest.raises(ValueError, match="engine.block_size"):
        KVCacheManager(4, 0, True)
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        KVCacheManager(4, 4, True, num_lookahead_tokens=-1)
    m = KVCacheManager(8, 4, True, 2)
    assert (m.num_blocks, m.block_size, m.num_free_blocks, m.usage) == (8, 4, 8, 0.0)


def test_manager_allocate_cache_hit_free_exact():
    m = KVCacheManager(10, 4, True)
    toks = list(range(100, 111))                       # 11 tokens: 2 full blocks + 3
    assert m.get_computed_blocks("a", toks) == ([], 0)
    assert m.allocate_slots("a", 11) is True
    assert m.block_table("a") == [0, 1, 2] and m.has_request("a")
    assert m.usage == pytest.approx(0.3)
    assert m.allocate_slots("a", 12) is True and m.block_table("a") == [0, 1, 2]
    assert m.allocate_slots("a", 5) is True and m.block_table("a") == [0, 1, 2]  # never shrinks
    assert m.cache_blocks("a", toks, 3) == 0           # no full block below 3
    assert m.cache_blocks("a", toks, 4) == 1
    assert m.cache_blocks("a", toks, 11) == 1          # block 1; block 2 is partial
    assert m.cache_blocks("a", toks, 11) == 0          # already handled
    toks.append(111)
    assert m.cache_blocks("a", toks, 11) == 0          # block 2 not final yet
    assert m.cache_blocks("a", toks, 100) == 1         # capped by len(token_ids) = 12
    h = chain(toks, 4)
    assert [m.pool.block_hash[b] for b in (0, 1, 2)] == h
    m.check_invariants()

    # same prefix, 10 tokens: at most (10-1)//4 = 2 blocks
    assert m.get_computed_blocks("b", toks[:10]) == ([0, 1], 8)
    # exactly 8 tokens cached: (8-1)//4 = 1 block (one token left to compute)
    assert m.get_computed_blocks("b", toks[:8]) == ([0], 4)
    assert m.get_computed_blocks("b", toks[:3]) == ([], 0)
    assert m.get_computed_blocks("b", [100, 101, 102, 999, 104, 105, 106, 107, 1]) == ([], 0)
    # divergence in block 1 -> hit only block 0
    assert m.get_computed_blocks("b", toks[:4] + [0, 0, 0, 0, 0]) == ([0], 4)
    # no side effects
    assert m.pool.ref_cnt == [1, 1, 1] + [0] * 7

    blocks, n = m.get_computed_blocks("b", toks[:10])
    assert m.allocate_slots("b", 10, blocks) is True
    assert m.block_table("b") == [0, 1, 3]
    assert m.pool.ref_cnt[:4] == [2, 2, 1, 1]
    with pytest.raises(ValueError):
        m.allocate_slots("b", 12, blocks)              # already has a table
    m.check_invariants()
    # b's hit blocks count as handled: its own block 2 ([108, 109, 110, 111]) duplicates a's block 2
    assert m.cache_blocks("b", toks, 12) == 0
    assert m.pool.block_hash[3] is None
    m.free("a")
    assert m.pool.free_block_ids() == [4, 5, 6, 7, 8, 9, 2]
    m.free("b")
    m.free("b")                                        # unknown: no-op
    assert m.pool.free_block_ids() == [4, 5, 6, 7, 8, 9, 2, 3, 1, 0]
    assert m.num_free_blocks == 10 and not m.has_request("b") and m.block_table("b") == []
    m.check_invariants()
    # still hittable after free; evicted in LRU order: a's tail (2) before b's, its head last
    assert m.get_computed_blocks("c", toks + [5]) == ([0, 1, 2], 12)
    assert m.allocate_slots("c", 4 * 7) is True        # takes 4..9 and evicts 2
    assert m.block_table("c") == [4, 5, 6, 7, 8, 9, 2]
    assert m.pool.lookup(h[2]) is None
    assert m.get_computed_blocks("d", toks + [5]) == ([0, 1], 8)
    m.free("c")
    m.check_invariants()


def test_check_writes_names_published_and_free_blocks():
    """The engine's KV-write guard (check_invariants): a write may land in the writer's own
    unpublished blocks and in pad slots (ids >= num_blocks), never in a published or free block."""
    m = KVCacheManager(4, 2, True)
    toks = [7, 8, 9]
    assert m.allocate_slots("a", 3) is True and m.block_table("a") == [0, 1]
    m.check_writes([1, 1, 4, 9])                      # a's open block, pad ids skipped
    assert m.cache_blocks("a", toks, 3) == 1           # block 0 published
    with pytest.raises(AssertionError, match=r"^write into published prefix-cache blocks \[0\]$"):
        m.check_writes([1, 0, 4])
    with pytest.raises(AssertionError, match=r"^write into free KV blocks \[2, 3\]$"):
        m.check_writes([1, 2, 3])


def test_lookahead_key_exact():
    c = hash_block(None, [1, 2])
    marker = hashlib.sha256(b"mtpx.cache.block_pool.lookahead").digest()
    assert lookahead_key(c, [3, 4]) == hashlib.sha256(marker + c + struct.pack("<2q", 3, 4)).digest()
    assert lookahead_key(c, [3, 4]) != hash_block(c, [3, 4])       # never a chained hash
    assert lookahead_key(c, [3, 4]) != lookahead_key(c, [3, 5])


def test_manager_lookahead_keys_exact():
    """With L = 3 lookahead tokens, block i is keyed on tokens [0, 4(i+1) + 3): published only once
    those are known, hit only by a request that has them all and agrees on them."""
    S, L = 4, 3
    m = KVCacheManager(16, S, True, num_lookahead_tokens=L)
    toks = list(range(50, 66))                         # 16 tokens
    assert m.allocate_slots("a", 16)
    # num_final 16, but block 3 needs tokens 16..18: 3 blocks, keyed on their next 3 tokens
    assert m.cache_blocks("a", toks, 16) == 3
    c = chain(toks, S)
    assert [m.pool.block_hash[b] for b in (0, 1, 2)] == [
        lookahead_key(c[i], toks[4 * (i + 1):4 * (i + 1) + 3]) for i in range(3)]
    assert m.pool.block_hash[3] is None
    assert m.cache_blocks("a", toks + [1, 2], 16) == 0  # block 3 still lacks one lookahead token
    assert m.cache_blocks("a", toks + [1, 2, 3], 16) == 1
    # a hit needs the block's 3 lookahead tokens: 10 tokens -> block 0 only (block 1 needs 11)
    assert m.get_computed_blocks("x", toks[:10]) == ([0], 4)
    assert m.get_computed_blocks("x", toks[:11]) == ([0, 1], 8)
    assert m.get_computed_blocks("x", toks[:15]) == ([0, 1, 2], 12)
    assert m.get_computed_blocks("x", toks + [1, 2, 3, 4]) == ([0, 1, 2, 3], 16)
    assert m.get_computed_blocks("x", toks[:6]) == ([], 0)
    # same block-1 tokens, another token right after it: block 1's draft-module KV read 58, not 99
    other = toks[:8] + [99] + toks[9:]
    assert m.get_computed_blocks("y", other) == ([0], 4)
    # y computes block 1 itself and publishes it under its own key beside a's
    blocks, n = m.get_computed_blocks("y", other)
    assert m.allocate_slots("y", 16, blocks)
    assert m.block_table("y") == [0, 4, 5, 6]
    assert m.cache_blocks("y", other, 16) == 2          # blocks 1 and 2 (block 3 lacks lookahead)
    assert m.pool.block_hash[4] == lookahead_key(c[1], [99, 59, 60])
    m.check_invariants()
    # chains mix blocks of different publishers: z agrees with a on block 0 and with y on block 1
    assert m.get_computed_blocks("z", other + [1, 2, 3]) == ([0, 4, 5], 12)
    m.free("a")
    m.free("y")
    m.check_invariants()
    # a request that hit blocks publishes its next blocks chained through them
    blocks, n = m.get_computed_blocks("w", toks + [1, 2, 3, 4, 5])
    assert (blocks, n) == ([0, 1, 2, 3], 16)
    assert m.allocate_slots("w", 24, blocks)
    longer = toks + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert m.cache_blocks("w", longer, 24) == 2          # blocks 4 and 5 (ends at 24, 3 after)
    b5 = m.block_table("w")[4]
    assert m.pool.block_hash[b5] == lookahead_key(chain(longer, S)[4], longer[20:23])
    m.check_invariants()


def test_manager_request_depth_keys_exact():
    """A request of depth d < L (modules 1..d exact) publishes block i under its d tokens after it;
    a lookup of depth d hits blocks of depth d or deeper, never shallower ones."""
    S, L = 4, 3
    m = KVCacheManager(16, S, True, num_lookahead_tokens=L)
    toks = list(range(50, 62))                         # 12 tokens
    c = chain(toks, S)
    assert m.allocate_slots("a", 12)
    assert m.cache_blocks("a", toks, 12, num_lookahead_tokens=1) == 2   # block 2 lacks its 1 token
    assert [m.pool.block_hash[b] for b in (0, 1)] == [lookahead_key(c[0], [54]), lookahead_key(c[1], [58])]
    assert m.get_computed_blocks("x", toks, 3) == ([], 0)          # deeper: no hit
    assert m.get_computed_blocks("x", toks, 1) == ([0, 1], 8)
    assert m.get_computed_blocks("x", toks, 0) == ([0, 1], 8)      # shallower: hits
    assert m.get_computed_blocks("x", toks[:9], 1) == ([0, 1], 8)  # 1 token after block 1 suffices
    # a depth-3 publisher's blocks serve every depth
    assert m.allocate_slots("b", 12)
    assert m.cache_blocks("b", toks, 12, num_lookahead_tokens=3) == 2
    assert m.block_table("b") == [3, 4, 5]
    assert m.get_computed_blocks("x", toks, 3) == ([3, 4], 8)
    assert m.get_computed_blocks("x", toks, 1) == ([3, 4], 8)      # the deepest key first
    # 9 tokens: block 1's depth-3 key needs 11, so a's depth-1 block 1 follows b's block 0
    assert m.get_computed_blocks("x", toks[:9], 1) == ([3, 1], 8)
    assert m.get_computed_blocks("x", toks[:9], 2) == ([3], 4)
    m.check_invariants()
    with pytest.raises(ValueError, match="num_lookahead_tokens must be in"):
        m.get_computed_blocks("x", toks, 4)


def test_manager_prefix_caching_off():
    m = KVCacheManager(4, 2, False)
    assert m.allocate_slots("a", 4)
    assert m.cache_blocks("a", [1, 2, 3, 4], 4) == 0
    assert m.pool.num_cached_blocks == 0
    assert m.get_computed_blocks("b", [1, 2, 3, 4, 5]) == ([], 0)
    with pytest.raises(ValueError):
        m.allocate_slots("b", 4, [0])
    m.free("a")
    assert m.num_free_blocks == 4


def test_manager_allocate_slots_out_of_blocks_no_side_effects():
    m = KVCacheManager(4, 2, True)
    toks = [1, 2, 3, 4, 5]
    assert m.allocate_slots("a", 4)                    # blocks 0, 1
    assert m.cache_blocks("a", toks, 4) == 2
    m.free("a")                                        # free queue [2, 3, 1, 0], 0 and 1 cached
    blocks, n = m.get_computed_blocks("b", toks)
    assert (blocks, n) == ([0, 1], 4)
    assert m.allocate_slots("c", 2)                    # takes 2 -> free [3, 1, 0]
    # b needs 2 hit blocks (both ref_cnt 0, leaving the free queue) + 2 new for 8 tokens: only 1
    before = snapshot(m)
    assert m.allocate_slots("b", 8, blocks) is False
    assert snapshot(m) == before and not m.has_request("b")
    # 6 tokens: 1 new block, and exactly 1 free block besides the hit ones
    assert m.allocate_slots("b", 6, blocks) is True
    assert m.block_table("b") == [0, 1, 3] and m.num_free_blocks == 0
    before = snapshot(m)
    assert m.allocate_slots("c", 3) is False           # growing an existing table
    assert snapshot(m) == before
    assert m.allocate_slots("c", 2) is True            # already covered: no new block needed
    m.check_invariants()
    assert m.reset_prefix_cache() is False
    m.free("b")
    m.free("c")
    assert m.num_free_blocks == 4 and m.usage == 0.0
    assert m.reset_prefix_cache() is True
    assert m.get_computed_blocks("d", toks) == ([], 0)
    m.check_invariants()


def test_manager_check_invariants_detects_corruption():
    m = KVCacheManager(4, 2, True)
    m.allocate_slots("a", 4)
    m.check_invariants()
    m.pool.ref_cnt[0] += 1
    with pytest.raises(AssertionError):
        m.check_invariants()


def test_manager_duplicate_publish_within_one_request_stays_private():
    m = KVCacheManager(6, 2, True)
    toks = [7, 7, 7, 7]                                # hashes differ (chained): both published
    m.allocate_slots("a", 4)
    assert m.cache_blocks("a", toks, 4) == 2
    m.allocate_slots("b", 4)                           # same content, no hit taken
    assert m.cache_blocks("b", toks, 4) == 0           # both refused as duplicates
    assert m.block_table("b") == [2, 3] and m.pool.block_hash[2:4] == [None, None]
    m.free("b")
    assert m.pool.free_block_ids() == [4, 5, 3, 2]
    m.check_invariants()


# ----------------------------------------------------------------------------- state machine
class PrefixCacheMachine(RuleBasedStateMachine):
    """Random allocate / grow / cache / free / hit / reset against an independent model.

    Model: ``cached`` maps a token-prefix tuple (a whole number of blocks) to the block that
    published it, ``free_q`` is the LRU free queue as a list, ``refs`` the reference counts.
    """

    @initialize(num_blocks=st.integers(1, 16), block_size=st.integers(1, 4),
                lookahead=st.sampled_from([0, 0, 1, 2, 3, 5]),
                bases=st.lists(st.lists(st.integers(0, 2), min_size=2, max_size=16),
                               min_size=1, max_size=3))
    def setup(self, num_blocks, block_size, lookahead, bases):
        self.S, self.L = block_size, lookahead
        self.m = KVCacheManager(num_blocks, block_size, True, num_lookahead_tokens=lookahead)
        self.bases = bases
        self.history: list[list[int]] = []                 # earlier requests' tokens
        self.next_id = 0
        self.reqs: dict[int, tuple[list[int], int]] = {}   # rid -> (tokens, num allocated tokens)
        self.cached: dict[tuple, int] = {}
        self.block_key: dict[int, tuple] = {}
        self.free_q = list(range(num_blocks))
        self.refs = [0] * num_blocks

    # -- model helpers
    def expected_hit(self, toks):
        """Blocks whose key (every token their content depends on) this request has and agrees on."""
        S, L = self.S, self.L
        blocks = []
        for i in range(max(0, min(len(toks) - 1, len(toks) - L)) // S):
            b = self.cached.get(tuple(toks[:(i + 1) * S + L]))
            if b is None:
                break
            blocks.append(b)
        return blocks, len(blocks) * S

    def model_allocate(self, n):
        taken, self.free_q = self.free_q[:n], self.free_q[n:]
        for b in taken:
            key = self.block_key.pop(b, None)
            if key is not None:
                del self.cached[key]
            self.refs[b] = 1
        return taken

    # -- rules
    @rule(data=st.data())
    def new_request(self, data):
        base = data.draw(st.sampled_from(self.bases + self.history))  # shared prefixes
        cut = data.draw(st.one_of(st.just(len(base)), st.integers(0, len(base))))
        suffix = data.draw(st.lists(st.integers(0, 2), min_size=1 if cut == 0 else 0, max_size=8))
        toks = base[:cut] + suffix
        if not toks:
            return
        rid = self.next_id
        self.next_id += 1
        blocks, n_hit = self.m.get_computed_blocks(rid, toks)
        assert (blocks, n_hit) == self.expected_hit(toks)
        assert n_hit < len(toks) and n_hit == len(blocks) * self.S
        num_tokens = data.draw(st.one_of(st.just(len(toks)), st.integers(n_hit + 1, len(toks))))
        need = -(-num_tokens // self.S) - len(blocks)
        avail = len(self.free_q) - sum(1 for b in blocks if self.refs[b] == 0)
        before = snapshot(self.m)
        ok = self.m.allocate_slots(rid, num_tokens, blocks)
        assert ok == (need <= avail)
        if not ok:
            assert snapshot(self.m) == before
            return
        for b in blocks:
            if self.refs[b] == 0:
                self.free_q.remove(b)
            self.refs[b] += 1
        new = self.model_allocate(need)
        assert self.m.block_table(rid) == blocks + new
        for b in blocks:                                   # hit blocks keep their hash
            assert self.m.pool.block_hash[b] is not None
        self.reqs[rid] = (toks, num_tokens)
        self.history.append(toks)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def grow(self, data):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        toks, n = self.reqs[rid]
        toks = toks + data.draw(st.lists(st.integers(0, 2), max_size=6))
        num_tokens = data.draw(st.integers(0, len(toks)))
        table_len = len(self.m.block_table(rid))
        need = max(0, -(-num_tokens // self.S) - table_len)
        before = snapshot(self.m)
        ok = self.m.allocate_slots(rid, num_tokens)
        assert ok == (need <= len(self.free_q))
        if not ok:
            assert snapshot(self.m) == before
            return
        new = self.model_allocate(need)
        assert self.m.block_table(rid)[table_len:] == new
        self.reqs[rid] = (toks, max(n, num_tokens))
        self.history.append(toks)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def cache(self, data):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        toks, n = self.reqs[rid]
        top = min(n, len(self.m.block_table(rid)) * self.S)
        num_final = data.draw(st.one_of(st.just(top), st.integers(0, top)))
        S, table = self.S, self.m.block_table(rid)
        handled = len(self.m._keys[rid])
        expected = 0
        for i in range(handled, max(0, min(num_final, len(toks) - self.L)) // S):
            key = tuple(toks[:(i + 1) * S + self.L])
            if key not in self.cached:
                self.cached[key] = table[i]
                self.block_key[table[i]] = key
                expected += 1
        assert self.m.cache_blocks(rid, toks, num_final) == expected

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        table = list(self.m.block_table(rid))
        self.m.free(rid)
        del self.reqs[rid]
        for b in reversed(table):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_q.append(b)

    @rule()
    def reset(self):
        ok = self.m.reset_prefix_cache()
        assert ok == (not any(self.refs))
        if ok:
            self.cached.clear()
            self.block_key.clear()

    # -- invariants, checked after every step
    @invariant()
    def matches_model(self):
        self.m.check_invariants()
        pool = self.m.pool
        assert pool.ref_cnt == self.refs
        assert pool.free_block_ids() == self.free_q          # exact LRU order
        assert pool.num_free_blocks == len(self.free_q)
        for key, b in self.cached.items():                   # keeps its hash until evicted
            assert pool.block_hash[b] == model_key(key, self.S, self.L)
            assert pool.lookup(pool.block_hash[b]) == b
        assert pool.num_cached_blocks == len(self.cached)

    def teardown(self):
        if not hasattr(self, "m"):
            return
        for rid in list(self.reqs):
            self.m.free(rid)
        self.m.check_invariants()
        assert self.m.num_free_blocks == self.m.num_blocks and self.m.usage == 0.0


def model_key(key, S, L):
    """The publish key of the block whose content depends on the tokens `key` (L after it)."""
    end = len(key) - L
    c = chain(list(key[:end]), S)[-1]
    return lookahead_key(c, list(key[end:])) if L else c


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestPrefixCacheMachine = PrefixCacheMachine.TestCase
