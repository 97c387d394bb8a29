"""Which slice of every parameter a rank holds, and the model turned into that shard.

Layout (Megatron-LM's; vLLM's for these layers), for rank r of N:

- Gated attention: query heads [r H/N, (r+1) H/N) (q_proj rows, with the output gate that
  Qwen3-Next interleaves per head); KV heads [r Hkv/N, ...) when Hkv >= N, else the one KV head
  those query heads read (replicated: N / Hkv ranks hold each); o_proj row-parallel. q_norm and
  k_norm act per head: replicated.
- Gated DeltaNet: key heads [r nk/N, ...) and their value heads (in_proj_qkvz / in_proj_ba rows
  are grouped per key head, so one run each), the conv channels of those q, k and v heads,
  dt_bias and A_log of the value heads, out_proj row-parallel; the gated norm (per value head
  dim) replicated. Each rank's conv window and delta-rule state hold its heads only.
- SwiGLU MLP: gate_proj / up_proj rows (column-parallel), down_proj row-parallel.
- MoE: routed experts split across ranks (whole experts, a contiguous run per rank: no expert's
  weight is cut and a token routed to an expert costs one rank that expert's two matmuls, as
  expert parallelism does; column / row sharding each expert would instead cut every small
  expert matmul N ways); the shared expert column / row sharded; router and shared-expert gate
  replicated. See layers.TPSparseMoE.
- Embedding and lm_head (and a DeepSeek-style MTP module's own head): vocabulary rows
  [r V/N, (r+1) V/N); logits are all-gathered.
- Replicated: every RMSNorm, the MTP modules' fc (2 hidden -> hidden) and pre-fc norms, router
  gates, biases of row-parallel layers (added once after the all-reduce).

The MTP modules' decoder layers are sharded like the target's. Head counts of the modules are
set to the rank's, so cache_spec() declares per-rank KV / recurrent-state sizes and ModelCache
allocates only the rank's heads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from mtpx.models.attention import GatedAttention
from mtpx.models.config import ModelConfig
from mtpx.models.deltanet import GatedDeltaNet
from mtpx.models.mlp import MLP, SparseMoE
from mtpx.parallel.group import TPGroup
from mtpx.parallel.layers import RowParallelLinear, TPSparseMoE, VocabParallelEmbedding, VocabParallelLMHead


@dataclass(frozen=True)
class Shard:
    """A rank's part of one parameter: the index ranges [(start, stop), ...] of dimension `dim`,
    concatenated in order (several runs: a conv weight's q, k and v channels)."""

    dim: int
    ranges: tuple[tuple[int, int], ...]

    def shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        out = list(full)
        out[self.dim] = sum(b - a for a, b in self.ranges)
        return tuple(out)

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """The shard of a full tensor, in memory of its own."""
        return torch.cat([t.narrow(self.dim, a, b - a) for a, b in self.ranges], self.dim)

    def read(self, tensor_slice) -> torch.Tensor:
        """The shard read from a safetensors slice (safe_open(...).get_slice(name)): only these
        bytes are read from the file."""
        index = (slice(None),) * self.dim
        parts = [tensor_slice[index + (slice(a, b),)] for a, b in self.ranges]
        return parts[0] if len(parts) == 1 else torch.cat(parts, self.dim)


def _run(rank: int, size: int, offset: int = 0) -> tuple[tuple[int, int], ...]:
    return ((offset + rank * size, offset + (rank + 1) * size),)


def check_shardable(cfg: ModelConfig, world_size: int) -> None:
    """Raises ValueError (one line naming the config key) when the model cannot be split over
    world_size ranks by shard_model's layout."""
    N = world_size
    if isinstance(N, bool) or not isinstance(N, int) or N < 1:
        raise ValueError(f"engine.tensor_parallel_size={N!r}: must be an integer >= 1")
    if N == 1:
        return
    where = f"with engine.tensor_parallel_size={N}"
    checks = [("vocab_size", cfg.vocab_size), ("num_attention_heads", cfg.num_attention_heads)]
    if any(t == "linear_attention" for t in cfg.layer_types):
        checks.append(("linear_num_key_heads", cfg.linear_num_key_heads))
    layers = list(range(cfg.num_hidden_layers)) + [
        (cfg.num_hidden_layers if cfg.mtp_style == "deepseek_v3" else 0) + k
        for k in range(cfg.num_nextn_predict_layers)]
    if any(not cfg.is_moe_layer(i) for i in layers):
        checks.append(("intermediate_size", cfg.intermediate_size))
    if any(cfg.is_moe_layer(i) for i in layers):
        checks.append(("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size))
        if cfg.num_experts < N:
            raise ValueError(f"model config num_experts={cfg.num_experts} is below {N} ranks {where}: "
                             "each rank needs at least one expert; lower engine.tensor_parallel_size")
    for key, value in checks:
        if value % N:
            raise ValueError(f"model config {key}={value} is not divisible by {N} {where}: choose a "
                             f"tensor_parallel_size that divides it")
    kv = cfg.num_key_value_heads
    if kv % N and N % kv:
        raise ValueError(f"model config num_key_value_heads={kv} {where}: KV heads are split when N divides "
                         "them and replicated when they divide N; choose such a tensor_parallel_size")


class _Sharder:
    def __init__(self, model: nn.Module, tp: TPGroup):
        self.tp, self.r, self.N = tp, tp.rank, tp.world_size
        self.all_names: dict[int, list[str]] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            self.all_names.setdefault(id(p), []).append(n)
        self.plan: dict[str, Shard] = {}
        self.memo: dict[int, nn.Parameter] = {}

    def set(self, module: nn.Module, leaf: str, shard: Shard) -> None:
        old = module._parameters.get(leaf)
        if old is None:
            return
        for n in self.all_names[id(old)]:
            self.plan[n] = shard
        if id(old) not in self.memo:       # tied parameters stay one parameter
            data = (torch.empty(shard.shape(tuple(old.shape)), dtype=old.dtype, device="meta") if old.is_meta
                    else shard.take(old.data))
            self.memo[id(old)] = nn.Parameter(data, requires_grad=old.requires_grad)
        module._parameters[leaf] = self.memo[id(old)]

    def rows(self, module: nn.Module, ranges, bias: bool = True) -> None:
        """Column-parallel (output rows) of a Linear, with its bias."""
        self.set(module, "weight", Shard(0, ranges))
        if bias:
            self.set(module, "bias", Shard(0, ranges))

    def row_parallel(self, lin: nn.Linear, ranges, reduce: bool = True) -> None:
        self.set(lin, "weight", Shard(1, ranges))
        lin.in_features = sum(b - a for a, b in ranges)
        if reduce:
            lin.__class__, lin.tp = RowParallelLinear, self.tp

    def attention(self, m: GatedAttention) -> None:
        r, N, D = self.r, self.N, m.head_dim
        h = m.num_heads // N
        w = D * (2 if m.gated else 1)
        self.rows(m.q_proj, _run(r, h * w))
        if m.num_kv_heads >= N:
            kvh = m.num_kv_heads // N
            kv = _run(r, kvh * D)
        else:                       # replicated KV head: the one the rank's query heads read
            kvh, group = 1, m.num_heads // m.num_kv_heads
            kv = _run((r * h) // group, D)
        self.rows(m.k_proj, kv)
        self.rows(m.v_proj, kv)
        self.row_parallel(m.o_proj, _run(r, h * D))
        m.num_heads, m.num_kv_heads = h, kvh
        for lin in (m.q_proj, m.k_proj, m.v_proj):
            lin.out_features = lin.weight.shape[0]

    def deltanet(self, m: GatedDeltaNet) -> None:
        r, N = self.r, self.N
        kh, vh, ratio = m.nk // N, m.nv // N, m.nv // m.nk
        self.rows(m.in_proj_qkvz, _run(r, kh * (2 * m.dk + 2 * ratio * m.dv)), bias=False)
        self.rows(m.in_proj_ba, _run(r, kh * 2 * ratio), bias=False)
        q, v = _run(r, kh * m.dk)[0], _run(r, vh * m.dv, 2 * m.key_dim)[0]
        k = (q[0] + m.key_dim, q[1] + m.key_dim)
        self.set(m.conv1d, "weight", Shard(0, (q, k, v)))
        self.set(m, "dt_bias", Shard(0, _run(r, vh)))
        self.set(m, "A_log", Shard(0, _run(r, vh)))
        self.row_parallel(m.out_proj, _run(r, vh * m.dv))
        m.nk, m.nv = kh, vh
        m.key_dim, m.value_dim = kh * m.dk, vh * m.dv
        m.conv_dim = 2 * m.key_dim + m.value_dim
        m.conv1d.in_channels = m.conv1d.out_channels = m.conv1d.groups = m.conv_dim
        for lin in (m.in_proj_qkvz, m.in_proj_ba):
            lin.out_features = lin.weight.shape[0]

    def mlp(self, m: MLP, reduce: bool = True) -> None:
        rows = _run(self.r, m.gate_proj.out_features // self.N)
        self.rows(m.gate_proj, rows)
        self.rows(m.up_proj, rows)
        self.row_parallel(m.down_proj, rows, reduce)
        m.gate_proj.out_features = m.up_proj.out_features = rows[0][1] - rows[0][0]

    def moe(self, m: SparseMoE) -> None:
        E = len(m.experts)
        first, last = self.r * E // self.N, (self.r + 1) * E // self.N
        m.experts = nn.ModuleList(list(m.experts)[first:last])
        self.mlp(m.shared_expert, reduce=False)
        m.__class__, m.tp, m.first_expert = TPSparseMoE, self.tp, first

    def vocab(self, m: nn.Module, embedding: bool) -> None:
        V = m.weight.shape[0]
        rows = _run(self.r, V // self.N)
        self.rows(m, rows, bias=True)
        if embedding:
            m.num_embeddings = rows[0][1] - rows[0][0]
            m.__class__, m.vocab_start = VocabParallelEmbedding, rows[0][0]
        else:
            m.out_features = rows[0][1] - rows[0][0]
            m.__class__ = VocabParallelLMHead
        m.tp = self.tp


@dataclass
class ShardPlan:
    """shards: {parameter name: its Shard} for every sharded parameter of the rank's model (the
    others are replicated); sources: {parameter name: the unsharded model's name} where they
    differ (a rank's experts are numbered from 0: experts.i is expert first_expert + i)."""

    shards: dict[str, Shard]
    sources: dict[str, str]

    def source(self, name: str) -> str:
        return self.sources.get(name, name)


def shard_model(model: nn.Module, tp: TPGroup) -> ShardPlan:
    """Turn `model` (an MTPForCausalLM, with weights or on the meta device) into rank tp.rank's
    shard in place (module doc) and return its ShardPlan, also kept as model.tp_plan (with
    model.tp: what gather.gather_state reads). world_size 1: nothing changes (an empty plan).
    Raises ValueError when the config cannot be split (check_shardable)."""
    check_shardable(model.cfg, tp.world_size)
    if tp.world_size == 1:
        return ShardPlan({}, {})
    s = _Sharder(model, tp)
    moe_mlps, sources = set(), {}
    for prefix, m in list(model.named_modules()):
        if isinstance(m, SparseMoE):
            moe_mlps.update(id(x) for x in list(m.experts) + [m.shared_expert])
            s.moe(m)
            for i in range(len(m.experts)):
                for n, _ in m.experts[i].named_parameters():
                    sources[f"{prefix}.experts.{i}.{n}"] = f"{prefix}.experts.{m.first_expert + i}.{n}"
    for m in list(model.modules()):
        if isinstance(m, GatedAttention):
            s.attention(m)
        elif isinstance(m, GatedDeltaNet):
            s.deltanet(m)
        elif isinstance(m, MLP) and id(m) not in moe_mlps:
            s.mlp(m)
    s.vocab(model.model.embed_tokens, embedding=True)
    s.vocab(model.lm_head, embedding=False)
    for m in model.mtp:
        if m.head is not None:
            s.vocab(m.head, embedding=False)
    model.tp, model.tp_plan = tp, ShardPlan(s.plan, sources)
    return model.tp_plan
