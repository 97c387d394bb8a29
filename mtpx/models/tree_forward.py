"""The target over a tree of draft tokens (tree verification, mtpx/spec_decode/tree.py), and the
Gated DeltaNet state kept after the accepted path.

Window token t of request b is tree node t (node 0 the root, x_n); parents [B, T] (-1 at the root,
parents before children). Attention layers read the committed KV and their ancestors' keys
(mtpx.attention.tree_attention, meta.attn_backend). Gated DeltaNet steps each node from its
parent's state, as SGLang's tree verification for Qwen3-Next does: the short causal conv sums
the node's input and its K-1 nearest ancestors' (then the stored conv inputs before the root), and
the delta rule runs node after node from the parent's state (the recurrent form,
mtpx.models.gated_delta_rule). The states after every node are kept (`TreeStates`), and after
verification the one after the last accepted node is stored (`commit_tree_states`): invariant 3,
a state is selected, the model is never re-run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mtpx.attention.kv_cache import KVCache
from mtpx.attention.meta import ForwardMeta
from mtpx.attention.tree_attention import TreeAttention
from mtpx.cache.state import LayerStates, RecurrentState
from mtpx.models import gdn_tree_kernel
from mtpx.models.deltanet import GatedDeltaNet
from mtpx.models.gated_delta_rule import _prep
from mtpx.models.rope import rope_cos_sin


@dataclass
class TreeStates:
    """One Gated DeltaNet layer's states over a tree forward: ext [B, C, K-1+T], the stored conv
    inputs then each node's; taps [B, K, T] int64, the ext columns node t's conv sums (taps[:, K-1]
    the node itself, taps[:, 0] the oldest); ssm [B, T, H, Dk, Dv], the state after each node."""

    ext: torch.Tensor
    taps: torch.Tensor
    ssm: torch.Tensor

    def conv_after(self, batch_idx: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
        """The conv state after node[s] of request batch_idx[s] ([S] int64) -> [S, C, K-1]: the K-1
        inputs ending at that node, oldest first."""
        cols = self.taps[batch_idx, 1:, node]                                    # [S, K-1]
        ext = self.ext[batch_idx]
        return ext.gather(2, cols[:, None].expand(-1, ext.shape[1], -1))


def conv_taps(parents: torch.Tensor, kernel: int) -> torch.Tensor:
    """parents [B, T] -> taps [B, K, T] (TreeStates): ext column of node t is t + K-1; the column
    before a node's is its parent's (the root's: K-2, the last stored input), before a stored
    input the previous stored input."""
    B, T = parents.shape
    K1 = kernel - 1
    stored = torch.arange(K1, device=parents.device).sub(1).clamp(min=0).expand(B, K1)
    before = torch.cat([stored, parents + K1], 1)                             # [B, K-1+T]
    cur = torch.arange(T, device=parents.device).expand(B, T) + K1
    taps = [cur]
    for _ in range(K1):
        cur = before.gather(1, cur)
        taps.append(cur)
    return torch.stack(taps[::-1], 1)


def tree_delta_rule(q, k, v, g, beta, init: torch.Tensor, parents: torch.Tensor,
                    levels: list[tuple[int, int]]):
    """The gated delta rule over a tree: node t starts from its parent's state (init [B, H, Dk, Dv]
    for the root), the nodes of one level at once. q, k [B, T, H, Dk]; v [B, T, H, Dv]; g, beta
    [B, T, H]; parents [T] int64 (every row's tree has this shape) or [B, T] (each row's own);
    levels: [lo, hi) node ranges whose parents lie in earlier ones (each depth's), root first ->
    (o [B, T, H, Dv] in v's dtype, ssm [B, T, H, Dk, Dv], the state after each node). The
    recurrent form's ops (gated_delta_rule module doc)."""
    out_dtype = v.dtype
    q, k, v, g, beta = _prep(q, k, v, g, beta)
    # the levels' states and outputs concatenated, not written into slices, and products summed,
    # not batched matmuls: under torch.compile a slice write's broadcast check and the matmul's
    # reshapes each fixed the batch size (a graph per batch size)
    states, outs = init[:, None].to(q.dtype), []
    par = parents if parents.dim() == 2 else parents.expand(q.shape[0], -1)   # [B, T]: each row's parents
    for lo, hi in levels:
        idx = (par[:, lo:hi] + 1)[:, :, None, None, None].expand(-1, -1, *states.shape[2:])
        S = states.gather(1, idx) * g[:, lo:hi].exp()[..., None, None]               # [B, w, H, Dk, Dv]
        kv_mem = (k[:, lo:hi, :, :, None] * S).sum(-2)                             # [B, w, H, Dv]
        delta = (v[:, lo:hi] - kv_mem) * beta[:, lo:hi, :, None]
        S = S + k[:, lo:hi, :, :, None] * delta[..., None, :]
        outs.append((q[:, lo:hi, :, :, None] * S).sum(-2))
        states = torch.cat([states, S], 1)
    o = torch.cat(outs, 1)
    return o.to(out_dtype), states[:, 1:]


def gdn_tree(layer: GatedDeltaNet, x: torch.Tensor, state: RecurrentState, meta: ForwardMeta,
             parents: torch.Tensor, levels: list[tuple[int, int]],
             taps: torch.Tensor | None = None) -> tuple[torch.Tensor, TreeStates]:
    """A Gated DeltaNet layer over tree nodes (module doc): x [B, T, hidden] -> ([B, T, hidden],
    its TreeStates); parents [B, T], levels: tree_delta_rule's; taps: conv_taps(parents, kernel)
    (computed here when None); reads the rows' stored states, writes none. On the CPU in float32
    the recurrence is one C call (mtpx.models.gdn_tree_kernel)."""
    qkvz, ba = layer.in_proj_qkvz(x), layer.in_proj_ba(x)
    q, k, v, z, b, a = layer._split(qkvz, ba)
    mixed = torch.cat([q, k, v], dim=-1).transpose(1, 2)                    # [B, C, T]
    ext = torch.cat([state.conv[meta.rows].to(mixed.dtype), mixed], dim=-1)
    taps = conv_taps(parents, layer.kernel) if taps is None else taps
    w = layer.conv1d.weight[:, 0].to(ext.dtype)                               # [C, K]
    C, K = ext.shape[1], layer.kernel
    cols = ext.gather(2, taps.flatten(1)[:, None].expand(-1, C, -1)).unflatten(2, (K, -1))   # [B, C, K, T]
    out = (cols * w[None, :, :, None]).sum(2)
    q, k, v, beta, g = layer._rule_inputs(F.silu(out).transpose(1, 2), b, a)
    beta, g = beta * meta.valid[..., None], g * meta.valid[..., None]
    init = state.ssm[meta.rows]
    if gdn_tree_kernel.runs(q, init):
        o, ssm = gdn_tree_kernel.tree(q, k, v, g, beta, init, parents)
    else:
        o, ssm = tree_delta_rule(q, k, v, g, beta, init, parents, levels)
    return layer.out_proj(layer.norm(o, z).flatten(-2)), TreeStates(ext, taps, ssm)


def tree_forward(model, caches: list, ids: torch.Tensor, rope_positions: torch.Tensor, meta: ForwardMeta,
                 parents: torch.Tensor, levels: list[tuple[int, int]], regions: bool = False
                 ) -> tuple[torch.Tensor, list[TreeStates]]:
    """The target (an MTPForCausalLM's decoder) over tree nodes ids [B, T] at RoPE positions
    rope_positions [B, T] (x_n's position plus the node's depth), meta from
    mtpx.attention.tree_attention.node_meta, parents [B, T] (each row's tree) and levels
    (tree_delta_rule's), caches: the target's per-layer caches -> (final hidden
    states [B, T, hidden], the TreeStates of each Gated DeltaNet layer in layer order).
    regions: under torch.compile, each layer as a region compiled once per layer type
    (`tree_layer_region`; meta static, its attention backend a TreeAttention)."""
    dec, cfg = model.model, model.model.cfg
    x = dec.embed_tokens(ids)
    cos, sin = rope_cos_sin(rope_positions, cfg.rotary_dim, cfg.rope_theta, x.dtype, cfg.rope_scaling)
    kept, taps = [], {}
    regions = regions and torch.compiler.is_compiling()
    for layer, cache in zip(dec.layers, caches):
        linear = layer.layer_type == "linear_attention"
        if linear and layer.linear_attn.kernel not in taps:
            taps[layer.linear_attn.kernel] = conv_taps(parents, layer.linear_attn.kernel)
        tap = taps[layer.linear_attn.kernel] if linear else None
        if regions:
            att, m = meta.attn_backend, meta
            tensors = (cache.conv, cache.ssm) if linear else (cache.k, cache.v)
            out = tree_layer_region(layer, x, cos, sin, tensors,
                                    m.positions, m.valid, m.rows, m.block_table, m.slot_mapping, att.base,
                                    att.ancestors, parents, tap, m.block_size, m.gdn_backend, levels)
            x = out[0] if linear else out
            if linear:
                kept.append(TreeStates(out[1], tap, out[2]))
            continue
        h = layer.input_layernorm(x)
        if linear:
            h, states = gdn_tree(layer.linear_attn, h, cache, meta, parents, levels, tap)
            kept.append(states)
        else:
            h = layer.self_attn(h, cos, sin, cache, meta)
        x, h = layer.post_attention_layernorm.forward_add(x, h)
        x = x + layer.mlp(h)
    return dec.norm(x), kept


@torch.compiler.nested_compile_region(max_reuse_entries=32)
def tree_layer_region(layer, x, cos, sin, tensors: tuple, positions, valid, rows, block_table, slots, base,
                      ancestors, parents, taps, block_size: int, gdn_backend: str, levels: list):
    """One decoder layer of tree_forward from plain tensors, so that torch.compile compiles it
    once per layer type and shapes and every layer of the type calls that code (as
    mtpx.models.decoder.layer_region for chains). tensors: the layer's (conv, ssm) states or
    (k, v) cache; base, ancestors: its TreeAttention's -> x, or (x, ext, ssm) for Gated DeltaNet."""
    meta = ForwardMeta(positions, valid, rows, None, block_table, block_size, slots, gdn_backend=gdn_backend,
                       region=True)
    h = layer.input_layernorm(x)
    if layer.layer_type == "linear_attention":
        h, states = gdn_tree(layer.linear_attn, h, LayerStates(*tensors, None, None, None, None), meta,
                             parents, levels, taps)
    else:
        meta.attn_backend = TreeAttention(base, base, ancestors)
        h = layer.self_attn(h, cos, sin, KVCache(*tensors), meta)
    x, h = layer.post_attention_layernorm.forward_add(x, h)
    x = x + layer.mlp(h)
    return (x, states.ext, states.ssm) if layer.layer_type == "linear_attention" else x


def commit_tree_states(recurrent: list[RecurrentState], kept: list[TreeStates], rows: torch.Tensor,
                       last: torch.Tensor, save: tuple | None = None) -> None:
    """Store each row's state after node last[b] ([B] int64, the last accepted node) in its
    Gated DeltaNet layers (recurrent, in layer order, beside kept); save = (batch_idx, node,
    block_ids) [S]: first the boundary states after those nodes, with their blocks."""
    B = rows.shape[0]
    bi = torch.arange(B, device=rows.device)
    for state, tree in zip(recurrent, kept):
        if save is not None and save[0].numel():
            state.save_blocks(save[2], tree.conv_after(save[0], save[1]), tree.ssm[save[0], save[1]])
        state.ssm[rows] = tree.ssm[bi, last].to(state.ssm.dtype)
        state.conv[rows] = tree.conv_after(bi, last).to(state.conv.dtype)
