# Lab skeleton generated from solutions/09-custom-ops/block.py by `./course labs` [lab-hash a016090a6c94].
# Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lab 09, part 5: one decoder block written once, run on PyTorch's ops or on the course's.

    block = DecoderBlock(BlockConfig(hidden=2048, heads=16, kv_heads=4), dtype=torch.bfloat16, device="cuda")
    y_torch = block(x, TorchOps())            # F.rms_norm, SDPA (GQA, causal), F.gelu(x + b)
    y_ours = block(x, CourseOps(lab_ops))     # torch.ops.<ns>.rms_norm, .flash_attention, .bias_gelu

The parameters belong to the block, the ops to the call: the same weights run both ways, so the
outputs and gradients can be compared directly, and both compile with torch.compile(fullgraph=True).

    x -> RMSNorm -> q, k, v projections -> causal attention (GQA) -> output projection -> + x = h
    h -> RMSNorm -> fc1 (no bias) -> bias + GELU (fused) -> fc2 -> + h
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BlockConfig:
    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 4  # grouped-query attention: heads / kv_heads query heads share a key/value head
    mlp_ratio: int = 4
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class TorchOps:
    """PyTorch's own ops: the baseline, and the block's reference."""

    def rms_norm(self, x, weight, eps):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def attention(self, q, k, v):
        # q (B, S, Hq, D), k and v (B, S, Hkv, D): SDPA wants heads before the sequence.
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        return o.transpose(1, 2)

    def bias_gelu(self, x, bias):
        return F.gelu(x + bias)


class CourseOps:
    """The course's registered ops: `ops` is torch.ops.<namespace> after ops.register(namespace)."""

    def __init__(self, ops):
        self.ops = ops

    # TODO(lab09.5): rms_norm, attention and bias_gelu on self.ops, with TorchOps's meaning: the ops'
    #   first output where they return two (rstd, lse); attention causal, on q, k, v as they come (B, S, H, D)


class DecoderBlock(nn.Module):
    def __init__(self, config: BlockConfig, *, dtype=torch.bfloat16, device="cuda"):
        super().__init__()
        self.config = c = config
        factory = {"dtype": dtype, "device": device}
        mlp = c.mlp_ratio * c.hidden
        self.norm1 = nn.Parameter(torch.ones(c.hidden, **factory))
        self.wq = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False, **factory)
        self.wkv = nn.Linear(c.hidden, 2 * c.kv_heads * c.head_dim, bias=False, **factory)
        self.wo = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False, **factory)
        self.norm2 = nn.Parameter(torch.ones(c.hidden, **factory))
        self.fc1 = nn.Linear(c.hidden, mlp, bias=False, **factory)
        self.fc1_bias = nn.Parameter(torch.zeros(mlp, **factory))  # applied by the fused bias + GELU
        self.fc2 = nn.Linear(mlp, c.hidden, **factory)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0) -> None:
        """Random weights of a trained-looking scale (norm weights near 1, a small bias), from `seed`."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                values = torch.randn(p.shape, generator=generator, dtype=torch.float32) / math.sqrt(fan_in)
                if p is self.norm1 or p is self.norm2:
                    values = 1 + 0.1 * values
                elif p.dim() == 1:
                    values = 0.1 * values
                p.copy_(values)

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        c = self.config
        batch, seqlen, _ = x.shape
        h = ops.rms_norm(x, self.norm1, c.eps)
        q = self.wq(h).view(batch, seqlen, c.heads, c.head_dim)  # (B, S, Hq, D)
        k, v = self.wkv(h).view(batch, seqlen, 2, c.kv_heads, c.head_dim).unbind(2)  # 2 x (B, S, Hkv, D), strided
        attn = ops.attention(q, k, v).reshape(batch, seqlen, c.heads * c.head_dim)
        x = x + self.wo(attn)
        h = ops.rms_norm(x, self.norm2, c.eps)
        return x + self.fc2(ops.bias_gelu(self.fc1(h), self.fc1_bias))
