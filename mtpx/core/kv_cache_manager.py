"""Per-request paged KV block tables with prefix caching, over one ``BlockPool``.

Design source: vLLM v1's ``KVCacheManager`` (vllm/v1/core/kv_cache_manager.py:
``get_computed_blocks`` / ``allocate_slots`` / ``cache_blocks`` / ``free``) on top of its
``BlockPool`` (see ``mtpx.core.block_pool``). Pure bookkeeping: no tensors.

One block table per request, shared by every attention layer of the target model and of every MTP
draft module: they all write position ``p`` of a request at slot ``table[p // block_size] *
block_size + p % block_size``.

What a block's content depends on, and so what its key must cover. Draft module ``k`` (1-based)
computes its KV at position ``j`` from the target hidden state at ``j`` and the token ``x_{j+k}``
(docs/architecture.md, "MTP semantics"), so with ``L = num_lookahead_tokens`` modules a block that ends
at position ``e - 1`` holds KV computed from the tokens ``x_0 .. x_{e-1+L}``: its own tokens, every
token before it, and the ``L`` tokens after it. The target's KV and the recurrent boundary state
depend on ``x_0 .. x_{e-1}`` only. Hence:

* the key: a block is published under ``lookahead_key(chain hash, the L tokens after it)`` (the
  plain chained hash when ``L = 0``), so a hit is served only to a request whose tokens agree with
  every token the block's content was computed from. Several blocks may hold the same target KV
  under different keys (requests that diverge within ``L`` tokens after a block), and a chain may
  mix blocks published by different requests: each block is exact for every request its key
  matches, whoever computed it.
* write side (``cache_blocks``): block ``i`` is published only when the ``L`` tokens after it are
  known (``(i+1)*S + L <= len(token_ids)``) and every position of it is below the caller's
  ``num_final_tokens``: computed, for the target and every draft module, from the request's
  committed tokens (a draft module's KV that read an unverified draft is not final; the engine
  and the speculator decide the bound).
* read side (``get_computed_blocks``): the walk stops at the first block whose key is not cached;
  no trim is needed, because a matched block's content is exact for this request, and a request
  computes its first non-hit position's hidden states itself.
* a request that keeps only its first ``d < L`` draft modules exact (automatic k's per-request
  depth, mtpx/auto_k/policy.py) publishes under ``lookahead_key(chain, the d tokens after
  it)``: its blocks hold exact KV for the target and modules 1..d only. A lookup for depth ``d``
  tries the keys of depths ``L, L - 1, .., d`` per block, since a block exact for more modules is
  exact for fewer; a deeper request never hits a shallower block.
"""
from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

from mtpx.core.block_pool import BlockPool, hash_block, lookahead_key

__all__ = ["KVCacheManager"]


class KVCacheManager:
    """Block tables for running requests over one ``BlockPool`` (``self.pool``), as vLLM v1's
    ``KVCacheManager``.

    Args:
        num_blocks: physical KV blocks in the pool (config ``engine.num_blocks``), >= 1.
        block_size: token positions per block (config ``engine.block_size``), >= 1.
        enable_prefix_caching: publish finished full blocks and reuse them across requests.
        num_lookahead_tokens: ``L``, the number of tokens after a block that its content depends
            on (the number of MTP draft modules whose KV lives in the blocks; 0 without a
            speculator); every publish key covers them (module doc). >= 0.

    Raises:
        ValueError: an argument is out of range (the message names the config key to fix).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 num_lookahead_tokens: int = 0):
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"engine.num_blocks must be an integer >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"engine.block_size must be an integer >= 1, got {block_size!r}")
        if (not isinstance(num_lookahead_tokens, int) or isinstance(num_lookahead_tokens, bool)
                or num_lookahead_tokens < 0):
            raise ValueError("num_lookahead_tokens (the number of MTP draft modules whose KV is in "
                             f"the cache) must be an integer >= 0, got {num_lookahead_tokens!r}")
        self.pool = BlockPool(num_blocks, block_size)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.num_lookahead_tokens = num_lookahead_tokens
        self._tables: dict[Hashable, list[int]] = {}
        # Prefix-caching write-side state per request: the publish keys of its first len(keys)
        # blocks, which have been handled (published, refused as duplicates, or came from a hit)
        # and are skipped by later cache_blocks calls; and the chained hash of the last handled
        # block (absent after a hit until cache_blocks recomputes it from the tokens).
        self._keys: dict[Hashable, list[bytes]] = {}
        self._chain: dict[Hashable, bytes] = {}

    # ------------------------------------------------------------------ properties
    @property
    def num_blocks(self) -> int:
        """Total number of physical blocks."""
        return self.pool.num_blocks

    @property
    def block_size(self) -> int:
        """Token positions per block."""
        return self.pool.block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0 (free or cached-but-evictable)."""
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one request, in [0, 1]."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def has_request(self, request_id: Hashable) -> bool:
        """True iff ``request_id`` has a block table (allocated and not yet freed)."""
        return request_id in self._tables

    def block_table(self, request_id: Hashable) -> list[int]:
        """The request's live block table (entry i holds positions [i*block_size, (i+1)*block_size));
        ``[]`` for an unknown request. Do not mutate it."""
        return self._tables.get(request_id, [])

    # ------------------------------------------------------------------ read side
    def get_computed_blocks(self, request_id: Hashable, token_ids: Sequence[int],
                            num_lookahead_tokens: int | None = None) -> tuple[list[int], int]:
        """Longest reusable cached prefix of ``token_ids`` (vLLM's ``get_computed_blocks``).

        Walks the full blocks of ``token_ids`` that have their ``L = num_lookahead_tokens`` tokens
        after them in ``token_ids``, and stops at the first whose key (module doc) is not cached.
        At most ``(len(token_ids) - 1) // block_size`` blocks are matched, so at least one token is
        left to compute (its logits are needed).

        Side-effect free: takes no references and counts nothing. Pass the returned blocks to
        ``allocate_slots`` before anything else changes the pool (they may otherwise be evicted).

        Args:
            request_id: the request (unused; kept for the vLLM-shaped API).
            token_ids: the request's tokens (prompt, plus any output tokens for a re-prefill).
            num_lookahead_tokens: the request's depth ``d`` (module doc), 0 .. ``L``; None: ``L``.

        Returns:
            ``(blocks, num_hit_tokens)`` with ``num_hit_tokens == len(blocks) * block_size``;
            ``([], 0)`` when prefix caching is off.
        """
        del request_id
        d = self._depth(num_lookahead_tokens)
        if not self.enable_prefix_caching:
            return [], 0
        S, L, n = self.block_size, self.num_lookahead_tokens, len(token_ids)
        max_blocks = max(0, min(n - 1, n - d) // S)
        blocks: list[int] = []
        chain: bytes | None = None
        for i in range(max_blocks):
            chain = hash_block(chain, token_ids[i * S:(i + 1) * S])
            end = (i + 1) * S
            b = next((b for depth in range(min(L, n - end), d - 1, -1)
                      if (b := self.pool.lookup(self._key(chain, token_ids, end, depth))) is not None),
                     None)
            if b is None:
                break
            blocks.append(b)
        return blocks, len(blocks) * S

    def _depth(self, num_lookahead_tokens: int | None) -> int:
        if num_lookahead_tokens is None:
            return self.num_lookahead_tokens
        if not 0 <= num_lookahead_tokens <= self.num_lookahead_tokens:
            raise ValueError(f"a request's num_lookahead_tokens must be in [0, "
                             f"{self.num_lookahead_tokens}], got {num_lookahead_tokens}")
        return num_lookahead_tokens

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, request_id: Hashable, num_tokens: int,
                       computed_blocks: Sequence[int] = ()) -> bool:
        """Make the request's block table cover positions ``[0, num_tokens)``.

        For a request without a table, ``computed_blocks`` (from ``get_computed_blocks``) become
        its first entries and are touched (one reference each); new blocks are then taken from the
        pool for the rest. A table is never shrunk.

        Args:
            request_id: the request.
            num_tokens: number of leading positions that must have a slot (>= 0); include any
                positions that will be written speculatively (draft tokens).
            computed_blocks: prefix-hit blocks; only for a request without a table.

        Returns:
            True on success; False when the pool cannot supply the new blocks, in which case
            NOTHING changed (no touch, no allocation, no table created). A touched cached block
            that had ref_cnt 0 leaves the free queue, so it is not counted as available.

        Raises:
            ValueError: ``num_tokens < 0``; ``computed_blocks`` given for a request that already has
                a table, or with prefix caching off, or containing a duplicate or unpublished block.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        computed_blocks = list(computed_blocks)
        table = self._tables.get(request_id)
        if table is not None and computed_blocks:
            raise ValueError(f"request {request_id!r} already has a block table; computed_blocks "
                             "can only be given on its first allocation")
        if computed_blocks:
            if not self.enable_prefix_caching:
                raise ValueError("computed_blocks given but prefix caching is off")
            if len(set(computed_blocks)) != len(computed_blocks):
                raise ValueError(f"duplicate block in computed_blocks {computed_blocks}")
            for b in computed_blocks:
                if not self.pool.is_published(b):
                    raise ValueError(f"computed block {b} is not in the prefix cache (evicted "
                                     "since get_computed_blocks?)")
        have = len(table) if table is not None else len(computed_blocks)
        num_new = max(0, -(-num_tokens // self.block_size) - have)
        num_touched_free = sum(1 for b in computed_blocks if self.pool.ref_cnt[b] == 0)
        if num_new > self.pool.num_free_blocks - num_touched_free:
            return False
        if table is None:
            self.pool.touch(computed_blocks)
            table = self._tables[request_id] = computed_blocks
            if self.enable_prefix_caching:
                self._keys[request_id] = [self.pool.block_hash[b] for b in computed_blocks]
        if num_new:
            table.extend(self.pool.allocate(num_new))
        return True

    # ------------------------------------------------------------------ write side
    def cache_blocks(self, request_id: Hashable, token_ids: Sequence[int],
                     num_final_tokens: int, num_lookahead_tokens: int | None = None) -> int:
        """Publish the request's full blocks whose content is final and whose key is known.

        Block i (positions ``[i*S, (i+1)*S)``) is published iff ``(i+1)*S <= num_final_tokens`` and
        ``(i+1)*S + d <= len(token_ids)``, in order, under its key (module doc), ``d`` the
        request's depth.
        Blocks handled by an earlier call (published, or refused as duplicates of another cached
        block) or that came from a prefix hit are skipped, so repeated calls cost O(new blocks).

        Args:
            request_id: a request with a block table.
            token_ids: the request's committed tokens; their prefix must not change between calls.
            num_final_tokens: leading positions whose KV, for the target and every draft module,
                was computed from ``token_ids`` (no unverified draft read) and will never be
                rewritten; the caller decides it (for depth ``d``: the target and modules 1..d).
            num_lookahead_tokens: the request's depth ``d`` (module doc), 0 .. ``L``; it may fall
                between calls for a request, never rise (handled blocks keep their keys); None: ``L``.

        Returns:
            The number of blocks newly published (duplicates of content cached elsewhere are not
            counted: they stay private). 0 when prefix caching is off.

        Raises:
            KeyError: unknown request.
            ValueError: a block to publish lies beyond the request's block table.
        """
        d = self._depth(num_lookahead_tokens)
        if not self.enable_prefix_caching:
            return 0
        table = self._tables[request_id]
        keys = self._keys[request_id]
        S = self.block_size
        num_full = min(num_final_tokens, len(token_ids) - d) // S
        if num_full > len(table):
            raise ValueError(f"request {request_id!r}: cache_blocks up to block {num_full} but its "
                             f"table has only {len(table)} blocks")
        if num_full <= len(keys):
            return 0
        chain = self._chain.get(request_id)
        if chain is None and keys:   # after a hit: the chain through the hit blocks
            for i in range(len(keys)):
                chain = hash_block(chain, token_ids[i * S:(i + 1) * S])
        published = 0
        for i in range(len(keys), num_full):
            chain = hash_block(chain, token_ids[i * S:(i + 1) * S])
            key = self._key(chain, token_ids, (i + 1) * S, d)
            keys.append(key)
            if self.pool.publish(table[i], key):
                published += 1
        self._chain[request_id] = chain
        return published

    def _key(self, chain: bytes, token_ids: Sequence[int], end: int, depth: int) -> bytes:
        """The publish key of the block ending at ``end`` (exclusive) with chained hash ``chain``,
        for a request of depth ``depth`` (its ``depth`` tokens after the block, module doc)."""
        if self.num_lookahead_tokens == 0:
            return chain
        return lookahead_key(chain, token_ids[end:end + depth])

    # ------------------------------------------------------------------ release
    def free(self, request_id: Hashable) -> None:
        """Release the request's blocks (in reverse order, so its tail is evicted first) and forget
        it. Published blocks stay hittable until evicted. Unknown ids are a no-op."""
        table = self._tables.pop(request_id, None)
        self._keys.pop(request_id, None)
        self._chain.pop(request_id, None)
        if table is not None:
            self.pool.free(reversed(table))

    def reset_prefix_cache(self) -> bool:
        """Drop every published hash; only allowed when no block is referenced.

        Returns:
            True if cleared, False (nothing changed) when some request still holds blocks.
        """
        return self.pool.reset_prefix_cache()

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Check the pool/table bookkeeping; raise ``AssertionError`` describing the first breach.

        * every ``ref_cnt[b]`` equals the number of (table, entry) pairs holding ``b``;
        * ``b`` is in the free queue iff ``ref_cnt[b] == 0``;
        * every hash in the hash map points at a block whose ``block_hash`` is that hash, and every
          block with a ``block_hash`` is in the map;
        * a request's handled-block count never exceeds its table, and handled hit blocks carry the
          hash recorded for them.
        """
        pool = self.pool
        holders = Counter(b for table in self._tables.values() for b in table)
        for b in range(pool.num_blocks):
            if pool.ref_cnt[b] != holders.get(b, 0):
                raise AssertionError(f"block {b}: ref_cnt {pool.ref_cnt[b]} but held by "
                                     f"{holders.get(b, 0)} table entries")
            if pool.is_free(b) != (pool.ref_cnt[b] == 0):
                raise AssertionError(f"block {b}: in free queue={pool.is_free(b)} with ref_cnt "
                                     f"{pool.ref_cnt[b]}")
        if len(pool.free_block_ids()) != sum(1 for c in pool.ref_cnt if c == 0):
            raise AssertionError("free queue has duplicate entries")
        cached = pool.cached_hashes()
        for h, b in cached.items():
            if pool.block_hash[b] != h:
                raise AssertionError(f"hash map entry points at block {b} whose hash differs")
        n_hashed = sum(1 for h in pool.block_hash if h is not None)
        if n_hashed != len(cached):
            raise AssertionError(f"{n_hashed} blocks carry a hash but the map has {len(cached)}")
        for rid, keys in self._keys.items():
            table = self._tables.get(rid)
            if table is None or len(keys) > len(table):
                raise AssertionError(f"request {rid!r}: {len(keys)} handled blocks, table "
                                     f"{table}")
            for i, h in enumerate(keys):
                bh = pool.block_hash[table[i]]
                if bh is not None and bh != h:
                    raise AssertionError(f"request {rid!r} block {i} published under another hash")

    def check_writes(self, block_ids: Sequence[int]) -> None:
        """The write side of check_invariants, before a KV write into blocks `block_ids` (ids at or
        past num_blocks, the runner's pad slots, are skipped): raise ``AssertionError`` when one is
        published (invariant 4) or held by no table (a freed block: invariant 5, the freeing side)."""
        blocks = [b for b in block_ids if b < self.num_blocks]
        bad = [b for b in blocks if self.pool.is_published(b)]
        if bad:
            raise AssertionError(f"write into published prefix-cache blocks {bad}")
        free = [b for b in blocks if self.pool.ref_cnt[b] == 0]
        if free:
            raise AssertionError(f"write into free KV blocks {free}")

    def __repr__(self) -> str:
        return (f"KVCacheManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"prefix_caching={self.enable_prefix_caching}, "
                f"lookahead={self.num_lookahead_tokens}, requests={len(self._tables)}, "
                f"free={self.num_free_blocks})")
