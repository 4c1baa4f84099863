"""A small decoder-only language model, defined here so demos and tests download nothing.

It is a real transformer (causal self-attention, MLP, tied embeddings) trained with real
gradient steps on a synthetic task, so its weights change from version to version the way a
policy's do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TinyLMConfig:
    vocab: int = 2048
    dim: int = 256
    layers: int = 4
    heads: int = 4
    context: int = 64


class Block(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = nn.MultiheadAttention(cfg.dim, cfg.heads, batch_first=True)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyLM(nn.Module):
    def __init__(self, cfg: TinyLMConfig = TinyLMConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Parameter(torch.zeros(cfg.context, cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as in most LMs
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        nn.init.normal_(self.embed.weight, std=0.02)  # small: the head shares it

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        x = self.embed(tokens) + self.pos[:n]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))  # type: ignore[no-any-return]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, steps: int) -> torch.Tensor:
        out = prompt
        for _ in range(steps):
            logits = self(out[:, -self.cfg.context :])
            out = torch.cat([out, logits[:, -1:].argmax(-1)], dim=1)
        return out


def synthetic_batch(cfg: TinyLMConfig, g: torch.Generator, batch: int = 8) -> torch.Tensor:
    """Sequences that count upward mod vocab from a random start: learnable in a few steps."""
    start = torch.randint(0, cfg.vocab, (batch, 1), generator=g)
    return (start + torch.arange(cfg.context + 1)) % cfg.vocab


def train_step(model: TinyLM, opt: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
    )
    opt.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    model.get_buffer("step").add_(1)
    return loss.item()


def rollout_weights(model: TinyLM) -> dict[str, torch.Tensor]:
    """What the trainer publishes: matrices in bf16 (the rollout layout), norms and biases in
    fp32, the step counter as int64; the tied head stays tied (sent once)."""
    out: dict[str, torch.Tensor] = {}
    converted: dict[int, torch.Tensor] = {}
    for name, param in model.state_dict(keep_vars=False).items():
        t = param.detach()
        if t.ndim == 2 and t.is_floating_point():
            key = t.untyped_storage().data_ptr()
            out[name] = converted.setdefault(key, t.to(torch.bfloat16))
        else:
            out[name] = t.clone()
    return out


def load_rollout_weights(model: TinyLM, weights: dict[str, torch.Tensor]) -> None:
    model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in weights.items()})
