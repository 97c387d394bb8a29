"""Physical KV-cache block pool with prefix caching (pure Python bookkeeping, no tensors).

Design source: vLLM v1's ``BlockPool`` (vllm/v1/core/block_pool.py) and ``KVCacheManager``
(vllm/v1/core/kv_cache_manager.py). The KV cache is cut into ``num_blocks`` fixed-size blocks of
``block_size`` token positions each; this module only tracks which physical block ids are in use,
by how many requests, and which of them hold published (reusable) prefix content:

* ``ref_cnt[b]``: number of block tables that currently hold block ``b``.
* ``block_hash[b]``: the chained content hash under which ``b`` is published to the prefix cache,
  or ``None`` when ``b`` is private / holds nothing reusable.
* A free queue of every block with ``ref_cnt == 0``, in eviction order (front = evicted first).
  As in vLLM, a published block whose last reference goes away stays published *and* free: it can
  still be hit by a later request (which takes it back out of the free queue), until ``allocate``
  pops it from the front of the queue, which evicts it (its hash is dropped).

Unlike vLLM, a hash maps to at most one block: publishing content that is already cached under
another block is refused and the duplicate stays private (freed like any other block).
"""
from __future__ import annotations

import hashlib
import struct
from collections import Counter, OrderedDict
from typing import Iterable, Sequence

__all__ = ["BlockPool", "NoFreeBlocksError", "hash_block", "lookahead_key", "ROOT_HASH"]

#: Parent digest used for the first block of a sequence (no parent). A fixed 32-byte marker, so the
#: first block's hash is computed exactly like every other block's. (The seed names the module's
#: former path, mtpx.cache: hashes stay what they were.)
ROOT_HASH: bytes = hashlib.sha256(b"mtpx.cache.block_pool.root").digest()


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Chained content hash of one block (as vLLM v1's ``hash_block_tokens``).

    Args:
        parent_hash: the hash of the previous block of the same sequence (a ``bytes`` digest), or
            ``None`` for the first block (``ROOT_HASH`` is used instead).
        token_ids: the block's token ids (normally exactly ``block_size`` of them), each packed as a
            little-endian signed int64.

    Returns:
        The 32-byte SHA-256 digest of ``parent digest || packed token ids``. Because the parent
        digest is folded in, the hash identifies the block's tokens *and* every token before them.

    Raises:
        struct.error: a token id does not fit in a signed 64-bit integer.
        TypeError: ``parent_hash`` is neither ``bytes`` nor ``None``.
    """
    if parent_hash is None:
        parent_hash = ROOT_HASH
    if not isinstance(parent_hash, (bytes, bytearray)):
        raise TypeError(f"parent_hash must be bytes or None, got {type(parent_hash).__name__}")
    h = hashlib.sha256()
    h.update(parent_hash)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


#: Domain marker of ``lookahead_key``: a block's publish key never equals any chained hash.
_LOOKAHEAD_MARKER: bytes = hashlib.sha256(b"mtpx.cache.block_pool.lookahead").digest()


def lookahead_key(chain_hash: bytes, lookahead_ids: Sequence[int]) -> bytes:
    """Publish key of a block whose content also depends on the tokens after it.

    Args:
        chain_hash: the block's chained hash (``hash_block``), identifying every token up to the
            end of the block.
        lookahead_ids: the tokens right after the block that its content was computed from (the
            first ``num_lookahead_tokens`` of the next block(s)); packed as ``hash_block`` packs.

    Returns:
        The 32-byte SHA-256 digest of ``marker || chain_hash || packed lookahead ids``.

    Raises:
        struct.error: a token id does not fit in a signed 64-bit integer.
    """
    h = hashlib.sha256()
    h.update(_LOOKAHEAD_MARKER)
    h.update(chain_hash)
    h.update(struct.pack(f"<{len(lookahead_ids)}q", *lookahead_ids))
    return h.digest()


class NoFreeBlocksError(RuntimeError):
    """Raised by ``BlockPool.allocate`` when fewer free (ref_cnt 0) blocks exist than were asked."""


class BlockPool:
    """Reference-counted pool of physical KV blocks ``0 .. num_blocks - 1`` with a prefix cache.

    Follows vLLM v1's ``BlockPool`` (free block queue in LRU eviction order + hash -> block map).

    Args:
        num_blocks: number of physical blocks (>= 1).
        block_size: token positions per block (>= 1); stored for callers, the pool itself never
            looks at token positions.

    Raises:
        ValueError: ``num_blocks < 1`` or ``block_size < 1``.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if int(num_blocks) != num_blocks or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if int(block_size) != block_size or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.num_blocks: int = int(num_blocks)
        self.block_size: int = int(block_size)
        self.ref_cnt: list[int] = [0] * self.num_blocks
        self.block_hash: list[bytes | None] = [None] * self.num_blocks
        # Ordered set of blocks with ref_cnt 0; front (first) = next to be allocated/evicted.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self.num_blocks))
        self._hash_to_block: dict[bytes, int] = {}

    # ------------------------------------------------------------------ queries
    @property
    def num_free_blocks(self) -> int:
        """Number of blocks with ref_cnt 0 (published-but-unreferenced blocks included: evictable)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Number of blocks currently published to the prefix cache (referenced or not)."""
        return len(self._hash_to_block)

    def free_block_ids(self) -> list[int]:
        """The free queue as a list of block ids, in eviction order (index 0 is evicted first)."""
        return list(self._free)

    def is_free(self, block: int) -> bool:
        """True iff ``block`` is in the free queue (equivalently, its ref_cnt is 0)."""
        return block in self._free

    def cached_hashes(self) -> dict[bytes, int]:
        """A copy of the prefix-cache map ``hash -> block id``."""
        return dict(self._hash_to_block)

    def lookup(self, block_hash: bytes) -> int | None:
        """The block published under ``block_hash``, or ``None`` if that content is not cached.

        Takes no reference: call ``touch`` to keep the block from being evicted.
        """
        return self._hash_to_block.get(block_hash)

    def is_published(self, block: int) -> bool:
        """True iff ``block`` is currently published to the prefix cache (has a hash)."""
        self._check_id(block)
        return self.block_hash[block] is not None

    # ------------------------------------------------------------------ mutations
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (least recently freed first).

        A taken block that is still published is evicted first (its hash leaves the prefix cache and
        its ``block_hash`` becomes ``None``). Every returned block has ref_cnt 1.

        Args:
            n: number of blocks (>= 0).

        Returns:
            The block ids, in the order taken.

        Raises:
            ValueError: ``n < 0``.
            NoFreeBlocksError: ``n > num_free_blocks``; nothing is changed then.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise NoFreeBlocksError(
                f"asked for {n} KV blocks but only {len(self._free)} of {self.num_blocks} are free")
        out = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self.ref_cnt[block] = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take one reference on each of ``blocks`` (cached blocks found by a prefix hit).

        ``ref_cnt += 1``; a block whose ref_cnt was 0 leaves the free queue (so it can no longer be
        evicted). A block listed twice gets two references.

        Raises:
            IndexError: a block id is out of range (checked before anything changes).
        """
        blocks = list(blocks)
        for b in blocks:
            self._check_id(b)
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self._free[b]
            self.ref_cnt[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference on each of ``blocks``.

        Blocks whose ref_cnt reaches 0 are appended to the END of the free queue in the order given
        (vLLM passes a request's blocks in reverse, so that its tail blocks, the least likely to be
        shared, are evicted first). Published blocks stay published (and hittable) until evicted.

        Raises:
            IndexError: a block id is out of range.
            ValueError: a block would drop below ref_cnt 0 (double free).
            Both are checked before anything changes.
        """
        blocks = list(blocks)
        for b in blocks:
            self._check_id(b)
        for b, k in Counter(blocks).items():
            if k > self.ref_cnt[b]:
                raise ValueError(
                    f"double free of KV block {b}: ref_cnt {self.ref_cnt[b]}, freed {k} time(s)")
        for b in blocks:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self._free[b] = None  # appended at the end (never present: ref_cnt was > 0)

    def publish(self, block: int, block_hash: bytes) -> bool:
        """Publish a referenced block to the prefix cache under ``block_hash``.

        Returns:
            True if ``block`` is now published under ``block_hash`` (including the no-op case where
            it already was); False if that hash is already cached by another block (the duplicate
            content stays private and nothing changes).

        Raises:
            IndexError: ``block`` out of range.
            ValueError: ``block`` is not referenced (ref_cnt 0: its content is not owned by anyone),
                or it is already published under a different hash.
        """
        self._check_id(block)
        if self.ref_cnt[block] == 0:
            raise ValueError(f"cannot publish KV block {block}: it is not referenced (ref_cnt 0)")
        current = self.block_hash[block]
        if current is not None:
            if current == block_hash:
                return True
            raise ValueError(f"KV block {block} is already published under a different hash")
        if block_hash in self._hash_to_block:
            return False
        self.block_hash[block] = block_hash
        self._hash_to_block[block_hash] = block
        return True

    def reset_prefix_cache(self) -> bool:
        """Drop every published hash, only when no block is referenced.

        Returns:
            True if the cache was cleared, False (nothing changed) if some block has ref_cnt > 0.
        """
        if len(self._free) != self.num_blocks:
            return False
        for b in self._hash_to_block.values():
            self.block_hash[b] = None
        self._hash_to_block.clear()
        return True

    # ------------------------------------------------------------------ internals
    def _evict(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None:
            del self._hash_to_block[h]
            self.block_hash[block] = None

    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"KV block id {block} out of range [0, {self.num_blocks})")

    def __repr__(self) -> str:
        return (f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={self.num_free_blocks}, cached={self.num_cached_blocks})")
