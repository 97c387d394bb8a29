"""The FlashInfer attention backend (CUDA): paged causal attention with FlashInfer's batch wrappers.

Planning. `plan(meta)` (once per forward, before the layers; mtpx.attention.backend) turns the
right-padded [B, T] grid into FlashInfer's ragged CSR inputs (`paged_kv_plan_inputs`, torch index
arithmetic): qo_indptr over the valid tokens; paged_kv_indptr / indices / last_page_len over the
first ceil(kv_len_b / page_size) blocks of each block table, kv_len_b = the request's last valid
position + 1. The decode wrapper when every request has exactly one valid query token, else the
prefill ("append") wrapper; requests without valid tokens are left out. Each plan takes its own
wrapper from a ring of RING per kind, so the plans of one engine step (the verification forward and
every module forward of the draft loop, all made before the loop) never overwrite each other; a
wrapper the ring reused in between is planned again before it runs. The wrapper's `plan()` runs in
`plan(meta)` when the head counts, head dim and dtypes are known (`attention_shape`, from
ModelCache), else at the first layer. The 128 MiB float workspace is shared by every wrapper (they
run one at a time, as in vLLM); plan buffers are per wrapper; both are created lazily. Under
torch.compile `forward` runs eager between the graphs (the plan is host state; vLLM's piecewise CUDA
graphs cut at attention the same way).

Layout: "NHD" paged cache (cache.k, cache.v), each [max_num_pages, page_size, num_kv_heads,
head_dim], i.e. KVCache's [num_blocks, block_size, Hkv, D]; queries [nnz, H, D]; GQA via
num_kv_heads (query head h reads kv head h // (H / Hkv)); sm_scale = head_dim ** -0.5. FlashInfer's
causal mask aligns the queries to the end of the KV (query i of qo_len L, kv_len K attends keys
0 .. K - L + i); our queries sit at p0 .. p0 + L - 1 with K = p0 + L, so each attends up to its own
position, as the torch reference (cached_attention). fp16/bf16 only: float32/float64 models raise
ValueError (model.dtype=bfloat16 or engine.attention_backend=torch).

Source: https://docs.flashinfer.ai/api/prefill.html (BatchPrefillWithPagedKVCacheWrapper: plan(
qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
head_dim, page_size, causal, q_data_type, kv_data_type), run(q, paged_kv_cache)),
https://docs.flashinfer.ai/api/decode.html (BatchDecodeWithPagedKVCacheWrapper) and the page-table
layout they link (1 <= last_page_len <= page_size; key kv_idx masked when kv_idx > kv_len + qo_idx -
qo_len).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from mtpx.attention.kv_cache import KVCache
from mtpx.attention.meta import ForwardMeta

WORKSPACE_BYTES = 128 * 1024 * 1024
RING = 16   # wrappers per kind: more than the forwards of one engine step (verify + k modules)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
_serial = itertools.count()


def paged_kv_plan_inputs(meta: ForwardMeta):
    """FlashInfer's ragged inputs for the valid tokens of `meta` (computed on CPU, int32 except
    pack_index):

    qo_indptr [R + 1]: packed query offsets of the R requests that have valid tokens;
    kv_indptr [R + 1], kv_indices [kv_indptr[-1]]: the first ceil(kv_len / block_size) block ids of
        each of those requests (CSR over meta.block_table rows);
    last_page_len [R]: kv_len - (pages - 1) * block_size, in 1 .. block_size;
    kv_lens [R]: last valid position + 1 of each request;
    pack_index [nnz] int64: flat index into the [B * T] grid of each packed token (row-major, so
        request b's tokens are rows qo_indptr[b] .. qo_indptr[b + 1] - 1 of the packed tensor).
    """
    if meta.block_table is None or meta.block_size <= 0:
        raise ValueError("the flashinfer attention backend needs a paged cache "
                         "(meta.block_table, meta.block_size)")
    valid = meta.valid.detach().cpu()
    positions = meta.positions.detach().cpu()
    table = meta.block_table.detach().cpu()
    S = int(meta.block_size)
    lens = valid.sum(1)
    keep = lens > 0
    qo_lens = lens[keep]
    kv_lens = positions[keep].gather(1, (qo_lens - 1)[:, None]).squeeze(1) + 1
    pages = (kv_lens + S - 1) // S
    if bool((pages > table.shape[1]).any()):
        raise ValueError(f"a request needs more blocks than the block table holds ({table.shape[1]})")
    zero = torch.zeros(1, dtype=torch.int64)
    qo_indptr = torch.cat([zero, qo_lens.cumsum(0)])
    kv_indptr = torch.cat([zero, pages.cumsum(0)])
    in_use = torch.arange(table.shape[1])[None, :] < pages[:, None]
    kv_indices = table[keep][in_use]
    last_page_len = kv_lens - (pages - 1) * S
    pack_index = valid.reshape(-1).nonzero().squeeze(1)
    i32 = lambda x: x.to(torch.int32)  # noqa: E731
    return (i32(qo_indptr), i32(kv_indptr), i32(kv_indices), i32(last_page_len), i32(kv_lens),
            pack_index)


@dataclass
class FlashInferPlan:
    """One forward's plan: which wrapper, FlashInfer's index tensors, and how to pack/unpack."""

    decode: bool
    qo_indptr: torch.Tensor        # [R + 1] int32, CPU
    kv_indptr: torch.Tensor        # [R + 1] int32, CPU
    kv_indices: torch.Tensor       # [pages] int32, on the backend's device
    last_page_len: torch.Tensor    # [R] int32, CPU
    kv_lens: torch.Tensor          # [R] int32, CPU
    pack_index: torch.Tensor       # [nnz] int64, on the backend's device
    grid: tuple[int, int]          # (B, T)
    page_size: int
    serial: int = field(default_factory=lambda: next(_serial))

    @property
    def nnz(self) -> int:
        return int(self.pack_index.numel())

    @property
    def wrapper_name(self) -> tuple[str, int]:
        """(kind, ring slot): the wrapper this plan runs on."""
        return ("decode" if self.decode else "prefill"), self.serial % RING


class FlashInferBackend:
    """mtpx.attention.backend interface on FlashInfer (module doc). `device`: where the workspace,
    the block indices and the packing indices live (CUDA in use; tests pass cpu with a fake
    flashinfer module)."""

    name = "flashinfer"

    def __init__(self, device, attention_shape: tuple | None = None):
        """attention_shape: (num_heads, num_kv_heads, head_dim, dtype) of every attention layer
        (the target's and the draft modules'), known from the model config: plan() then plans the
        wrapper at once (module doc); None: at the first forward of each plan."""
        try:
            import flashinfer  # noqa: F401
        except ImportError as err:  # the same hint as get_backend's (which imports this module only)
            raise ValueError(f"engine.attention_backend=flashinfer needs the flashinfer package ({err}): "
                             "pip install -e '.[gpu]', or use engine.attention_backend=torch") from None
        self.device = torch.device(device)
        self.attention_shape = attention_shape
        self._workspace = None
        self._wrappers: dict[tuple, object] = {}
        self._planned: dict[tuple, tuple] = {}   # (kind, slot) -> (plan serial, shape key)

    def plan(self, meta: ForwardMeta) -> FlashInferPlan:
        qo_indptr, kv_indptr, kv_indices, last_page_len, kv_lens, pack_index = paged_kv_plan_inputs(meta)
        qo_lens = qo_indptr[1:] - qo_indptr[:-1]
        decode = qo_lens.numel() > 0 and bool((qo_lens == 1).all())
        plan = FlashInferPlan(decode, qo_indptr, kv_indptr, kv_indices.to(self.device), last_page_len,
                              kv_lens, pack_index.to(self.device), tuple(meta.valid.shape),
                              int(meta.block_size))
        if self.attention_shape is not None and plan.nnz:
            H, Hkv, D, dtype = self.attention_shape
            self._ensure_planned(plan, H, Hkv, D, dtype, dtype)
        return plan

    def _wrapper(self, name: tuple[str, int]):
        import flashinfer
        if self._workspace is None:
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        if name not in self._wrappers:
            cls = (flashinfer.BatchDecodeWithPagedKVCacheWrapper if name[0] == "decode"
                   else flashinfer.BatchPrefillWithPagedKVCacheWrapper)
            self._wrappers[name] = cls(self._workspace, "NHD")
        return self._wrappers[name]

    def _ensure_planned(self, plan: FlashInferPlan, H: int, Hkv: int, D: int, q_dtype, kv_dtype):
        """Call the wrapper's plan() for `plan` unless it is the wrapper's current plan already."""
        for what, dtype in (("query", q_dtype), ("KV cache", kv_dtype)):
            if dtype not in SUPPORTED_DTYPES:
                raise ValueError(f"engine.attention_backend=flashinfer needs float16 or bfloat16 tensors "
                                 f"(the {what} is {dtype}): use model.dtype=bfloat16, "
                                 "or engine.attention_backend=torch")
        name = plan.wrapper_name
        key = (plan.serial, H, Hkv, D, q_dtype, kv_dtype)
        wrapper = self._wrapper(name)
        if self._planned.get(name) == key:
            return wrapper
        common = dict(q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=D ** -0.5)
        if plan.decode:
            wrapper.plan(plan.kv_indptr, plan.kv_indices, plan.last_page_len, H, Hkv, D,
                         plan.page_size, **common)
        else:
            wrapper.plan(plan.qo_indptr, plan.kv_indptr, plan.kv_indices, plan.last_page_len,
                         H, Hkv, D, plan.page_size, causal=True, **common)
        self._planned[name] = key
        return wrapper

    @torch.compiler.disable
    def forward(self, q, k, v, cache: KVCache, meta: ForwardMeta) -> torch.Tensor:
        """q [B, T, H, D], k, v [B, T, Hkv, D] -> [B, T, H, D] (padding queries: zeros)."""
        plan = meta.attn_plan
        if not isinstance(plan, FlashInferPlan):
            raise ValueError("FlashInferBackend.forward needs meta.attn_plan from FlashInferBackend.plan "
                             "(meta.planned(backend))")
        B, T, H, D = q.shape
        if (B, T) != plan.grid or cache.block_size != plan.page_size:
            raise ValueError(f"the plan was made for a {plan.grid} grid with page size {plan.page_size}, "
                             f"got {(B, T)} and a cache with block size {cache.block_size}")
        cache.write(meta.slot_mapping[meta.valid], k[meta.valid], v[meta.valid])
        out = q.new_zeros(B * T, H, D)
        if plan.nnz == 0:
            return out.view(B, T, H, D)
        wrapper = self._ensure_planned(plan, H, cache.k.shape[2], D, q.dtype, cache.k.dtype)
        packed = q.reshape(B * T, H, D).index_select(0, plan.pack_index).contiguous()
        o = wrapper.run(packed, (cache.k, cache.v))
        out.index_copy_(0, plan.pack_index, o.to(out.dtype))
        return out.view(B, T, H, D)
