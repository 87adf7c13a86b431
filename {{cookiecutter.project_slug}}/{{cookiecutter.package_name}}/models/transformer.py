"""A small causal (decoder-only, GPT-style) transformer over token ids, for language modelling.

Tokens (N, T) int64 -> next-token logits (N, T, vocab): token + learned position embeddings,
`depth` pre-LayerNorm blocks (causal self-attention, then an MLP, each added to the residual
stream), a final LayerNorm and a linear head that shares its weights with the token
embedding (tied: fewer parameters, and the same vectors read and write each token).
`generate` samples a continuation for prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class Options:
    width: int = 128  # embedding size (d_model); a multiple of heads
    depth: int = 4  # transformer blocks
    heads: int = 4  # attention heads per block
    dropout: float = 0.1  # on embeddings, attention weights and each block's outputs
    max_len: int = 256  # longest context (position embeddings); >= data.seq_len

    def checks(self):
        divides = self.heads >= 1 and self.width % self.heads == 0  # each head gets width/heads
        return [
            ("width", self.width >= 1, ">= 1"),
            ("depth", 1 <= self.depth <= 64, "between 1 and 64"),
            ("heads", divides, "a divisor of model.width"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"),
            ("max_len", self.max_len >= 1, ">= 1"),
        ]


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)): (N, T, W) -> (N, T, W)."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)  # queries, keys and values in one matmul
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.proj(self.attend(self.ln1(x))))
        return x + self.drop(self.mlp(self.ln2(x)))

    def attend(self, x: Tensor) -> Tensor:
        n, t, w = x.shape
        # (N, T, 3W) -> (3, N, heads, T, W / heads): one query, key and value per head.
        qkv = self.qkv(x).view(n, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # not tuple unpacking: a traced loop over a tensor warns
        # is_causal: position i attends to positions <= i only, so training on every position
        # at once never shows the model the token it is predicting.
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (N, heads, T, W / heads)
        return y.transpose(1, 2).reshape(n, t, w)  # heads side by side again: (N, T, W)


class Transformer(nn.Module):
    Options = Options

    @staticmethod
    def example_input(batch_size: int) -> Tensor:
        """Token ids (batch_size, 16) below 2: valid for any vocabulary of two or more."""
        return torch.randint(2, (batch_size, 16), generator=torch.Generator().manual_seed(0))

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(
                f"the transformer takes token ids (N, T); samples of shape {input_shape} are "
                "not sequences of tokens (use data.name=text)"  # feature: text
                "not sequences of tokens (use token ids: docs/data.md)"  # feature: !text
            )
        if input_shape[0] > opts.max_len:
            raise ValueError(
                f"windows of {input_shape[0]} tokens exceed model.max_len={opts.max_len}; "
                "raise model.max_len or lower data.seq_len"
            )
        self.max_len = opts.max_len
        self.tokens = nn.Embedding(num_outputs, opts.width)
        self.positions = nn.Embedding(opts.max_len, opts.width)
        self.drop = nn.Dropout(opts.dropout)
        # A ModuleList of identical blocks: the units of models.blocks().
        self.blocks = nn.ModuleList(
            Block(opts.width, opts.heads, opts.dropout) for _ in range(opts.depth)
        )
        self.norm = nn.LayerNorm(opts.width)
        self.head = nn.Linear(opts.width, num_outputs, bias=False)
        self.head.weight = self.tokens.weight  # tied: one (vocab, W) matrix
        self.apply(_init)
        # GPT-2: scale the layers that write into the residual stream by 1/sqrt(2 * depth),
        # so its variance does not grow with depth.
        for block in self.blocks:
            for layer in (block.proj, block.mlp[-1]):
                nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * opts.depth))

    def block_units(self) -> list[Block]:
        # models.blocks(): one unit per block, also when depth=1 (with one block, the search
        # for repeated modules would pick the two Linear layers inside its MLP).
        return list(self.blocks)

    def forward(self, x: Tensor) -> Tensor:
        if x.is_floating_point():
            raise ValueError("the transformer takes int64 token ids, not float features")
        t = x.shape[1]
        # Under torch.jit's tracer the check would be frozen into the graph (and warn): a
        # traced model states the positions it takes elsewhere.
        if not torch.jit.is_tracing() and t > self.max_len:
            raise ValueError(f"{t} tokens exceed model.max_len={self.max_len}")
        position = torch.arange(t, device=x.device)  # (T,)
        h = self.drop(self.tokens(x) + self.positions(position))  # (N, T, W)
        for block in self.blocks:
            h = block(h)  # (N, T, W)
        return self.head(self.norm(h))  # (N, T, vocab) next-token logits

    @torch.no_grad()
    def generate(
        self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0
    ) -> Tensor:
        """`idx` (N, T0) followed by `max_new_tokens` sampled tokens: (N, T0 + max_new_tokens).

        temperature 0 picks the most likely token; top_k > 0 samples among the k most likely
        only. Each step reruns the last max_len tokens (no KV cache: simple, and fast enough
        for a small model)."""
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.max_len :])[:, -1]  # (N, vocab): the next token's
            if temperature == 0:
                token = logits.argmax(-1, keepdim=True)  # (N, 1)
            else:
                logits = logits / temperature
                if top_k > 0:
                    kth = logits.topk(min(top_k, logits.shape[-1])).values[:, -1:]  # (N, 1)
                    logits = logits.masked_fill(logits < kth, -math.inf)
                token = torch.multinomial(logits.softmax(-1), 1)  # (N, 1)
            idx = torch.cat([idx, token], dim=1)
        self.train(was_training)
        return idx


def _init(module: nn.Module) -> None:
    # GPT-2's initialisation: small normal weights, zero biases (PyTorch's default uniform
    # init is tuned for ReLU nets, not for a residual stream of many added layers).
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
