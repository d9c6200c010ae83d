"""kvlm's network: a tiny decoder-only transformer over characters (GPT, pre-LayerNorm), in PyTorch.

The shape is the one the issue-48 spec fixes for both backends (``generate_kv`` in Python,
``generate_kv_paged``/``generate_kv_contiguous`` in C++): width 64, 4 heads of 16, 2 blocks, a context of
256 positions, learned position embeddings, an MLP of 256, exact GELU, LayerNorm eps 1e-5, no bias on
the output ``head``. The parameter names are the spec's too: the backends read them by name from the
TorchScript file (``named_parameters()``), never by position.

:meth:`KVLM.forward` is the *no-cache* pass: every position attends to every earlier one, recomputed
from scratch. A KV cache exists because, when decoding, the keys and values of the earlier positions
do not change from one step to the next (causal attention: position p reads only positions <= p), so
a backend can keep them and run only the newest token through the network. The backends' arithmetic
is this module's, split at that seam.

torch is imported at the top: only training, the export and the in-process reference import this module.
"""


import torch
from torch import nn

WIDTH, HEADS, LAYERS, CONTEXT, HIDDEN = 64, 4, 2, 256, 256
HEAD_DIM = WIDTH // HEADS


class Block(nn.Module):
    """One transformer block: x + attention(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.heads, self.head_dim = HEADS, HEAD_DIM  # attributes: TorchScript reads no module globals
        self.ln1 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)  # rows 0-63 q, 64-127 k, 128-191 v; head h = rows h*16..h*16+15
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, 64] -> [B, T, 64], causal: position t reads positions 0..t."""
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, 16]
        k = k.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        # softmax(q k^T / sqrt(16)) v over positions <= t: torch's fused kernel for exactly that sum
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        attended = attended.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        x = x + self.proj(attended)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class KVLM(nn.Module):
    """tokens [B, T] (T <= 256) -> logits [B, T, V]; ``vocabulary`` and ``context`` travel in the TorchScript file."""

    vocabulary: str
    context: int

    def __init__(self, vocabulary: str) -> None:
        super().__init__()
        self.vocabulary = vocabulary
        self.context = CONTEXT
        self.tok = nn.Embedding(len(vocabulary), WIDTH)
        self.pos = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(WIDTH, eps=1e-5)
        self.head = nn.Linear(WIDTH, len(vocabulary), bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def encode(vocabulary: str, text: str) -> list[int]:
    """Token ids of ``text``: a character outside the vocabulary becomes the space's index (the spec's rule)."""
    index = {c: i for i, c in enumerate(vocabulary)}
    return [index.get(c, index[" "]) for c in text]
