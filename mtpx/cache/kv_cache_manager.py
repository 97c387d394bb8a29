"""Per-request paged KV block tables with prefix caching, over one ``BlockPool``.

Design source: vLLM v1's ``KVCacheManager`` (vllm/v1/core/kv_cache_manager.py:
``get_computed_blocks`` / ``allocate_slots`` / ``cache_blocks`` / ``free``) on top of its
``BlockPool`` (see ``mtpx.cache.block_pool``). Pure bookkeeping: no tensors.

One block table per request, shared by every attention layer of the target model and of every MTP
draft module: they all write position ``p`` of a request at slot ``table[p // block_size] *
block_size + p % block_size``.

Multi-token prediction makes a block's KV depend on tokens *after* the block: draft module ``k``
(1-based) computes its KV at position ``j`` from the target hidden state at ``j`` and the token at
``j + k``. So:

* write side (``cache_blocks``): the caller passes ``num_final_tokens``, the number of leading
  positions whose KV, for the target and every draft module, will never be rewritten; only full
  blocks below it are published.
* read side (``get_computed_blocks``): a hit of ``H`` matched tokens is trimmed to
  ``floor((H - num_lookahead_tokens) / block_size) * block_size`` tokens, so that the last
  ``num_lookahead_tokens`` matched positions are recomputed and the draft modules get the target
  hidden states they need for the first positions that are not hit.
"""
from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

from mtpx.cache.block_pool import BlockPool, hash_block

__all__ = ["KVCacheManager"]


class KVCacheManager:
    """Block tables for running requests over one ``BlockPool`` (``self.pool``), as vLLM v1's
    ``KVCacheManager``.

    Args:
        num_blocks: physical KV blocks in the pool (config ``engine.num_blocks``), >= 1.
        block_size: token positions per block (config ``engine.block_size``), >= 1.
        enable_prefix_caching: publish finished full blocks and reuse them across requests.
        num_lookahead_tokens: number of MTP draft modules whose KV lives in the blocks (0 without a
            speculator); the read-side trim of a prefix hit, in tokens. >= 0.

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
        # Prefix-caching write-side state per request: the chained hashes of its first
        # len(hashes) blocks; those blocks have been handled (published, refused as duplicates,
        # or came from a hit) and are skipped by later cache_blocks calls.
        self._hashes: dict[Hashable, list[bytes]] = {}

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
    def get_computed_blocks(self, request_id: Hashable, token_ids: Sequence[int]
                            ) -> tuple[list[int], int]:
        """Longest reusable cached prefix of ``token_ids`` (vLLM's ``get_computed_blocks``).

        Walks the FULL blocks of ``token_ids`` and stops at the first whose chained hash is not
        cached. At most ``(len(token_ids) - 1) // block_size`` blocks are matched, so at least one
        token is left to compute (its logits are needed). With ``num_lookahead_tokens = L > 0`` the
        ``H`` matched tokens are trimmed to ``max(0, floor((H - L) / block_size)) * block_size``.

        Side-effect free: takes no references and counts nothing. Pass the returned blocks to
        ``allocate_slots`` before anything else changes the pool (they may otherwise be evicted).

        Args:
            request_id: the request (unused; kept for the vLLM-shaped API).
            token_ids: the request's tokens (prompt, plus any output tokens for a re-prefill).

        Returns:
            ``(blocks, num_hit_tokens)`` with ``num_hit_tokens == len(blocks) * block_size``;
            ``([], 0)`` when prefix caching is off.
        """
        del request_id
        if not self.enable_prefix_caching:
            return [], 0
        S = self.block_size
        max_blocks = max(0, (len(token_ids) - 1) // S)
        blocks: list[int] = []
        parent: bytes | None = None
        for i in range(max_blocks):
            parent = hash_block(parent, token_ids[i * S:(i + 1) * S])
            b = self.pool.lookup(parent)
            if b is None:
                break
            blocks.append(b)
        matched = len(blocks) * S
        if self.num_lookahead_tokens > 0:
            matched = max(0, (matched - self.num_lookahead_tokens) // S * S)
        return blocks[:matched // S], matched

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
                self._hashes[request_id] = [self.pool.block_hash[b] for b in computed_blocks]
        if num_new:
            table.extend(self.pool.allocate(num_new))
        return True

    # ------------------------------------------------------------------ write side
    def cache_blocks(self, request_id: Hashable, token_ids: Sequence[int],
                     num_final_tokens: int) -> int:
        """Publish the request's full blocks that lie entirely below ``num_final_tokens``.

        Block i (positions ``[i*S, (i+1)*S)``) is published iff ``(i+1)*S <= num_final_tokens`` and
        ``(i+1)*S <= len(token_ids)``, in order, under the chained hash of ``token_ids``. Blocks
        handled by an earlier call (published, or refused as duplicates of another cached block)
        or that came from a prefix hit are skipped, so repeated calls cost O(new blocks).

        Args:
            request_id: a request with a block table.
            token_ids: the request's tokens; their prefix must not change between calls.
            num_final_tokens: leading positions whose KV (target and every draft module) will never
                be rewritten; the caller decides it.

        Returns:
            The number of blocks newly published (duplicates of content cached elsewhere are not
            counted: they stay private). 0 when prefix caching is off.

        Raises:
            KeyError: unknown request.
            ValueError: a block to publish lies beyond the request's block table.
        """
        if not self.enable_prefix_caching:
            return 0
        table = self._tables[request_id]
        hashes = self._hashes[request_id]
        S = self.block_size
        num_full = min(num_final_tokens, len(token_ids)) // S
        if num_full > len(table):
            raise ValueError(f"request {request_id!r}: cache_blocks up to block {num_full} but its "
                             f"table has only {len(table)} blocks")
        published = 0
        for i in range(len(hashes), num_full):
            h = hash_block(hashes[-1] if hashes else None, token_ids[i * S:(i + 1) * S])
            hashes.append(h)
            if self.pool.publish(table[i], h):
                published += 1
        return published

    # ------------------------------------------------------------------ release
    def free(self, request_id: Hashable) -> None:
        """Release the request's blocks (in reverse order, so its tail is evicted first) and forget
        it. Published blocks stay hittable until evicted. Unknown ids are a no-op."""
        table = self._tables.pop(request_id, None)
        self._hashes.pop(request_id, None)
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
        for rid, hashes in self._hashes.items():
            table = self._tables.get(rid)
            if table is None or len(hashes) > len(table):
                raise AssertionError(f"request {rid!r}: {len(hashes)} handled blocks, table "
                                     f"{table}")
            for i, h in enumerate(hashes):
                bh = pool.block_hash[table[i]]
                if bh is not None and bh != h:
                    raise AssertionError(f"request {rid!r} block {i} published under another hash")

    def __repr__(self) -> str:
        return (f"KVCacheManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"prefix_caching={self.enable_prefix_caching}, "
                f"lookahead={self.num_lookahead_tokens}, requests={len(self._tables)}, "
                f"free={self.num_free_blocks})")
