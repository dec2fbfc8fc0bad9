"""Test models for rannc.

Every model's forward takes the graph inputs and returns the scalar training
loss, because rannc treats the loss as part of the graph (its only output).

Constraints these definitions respect so that the ONNX export is usable by the
rannc importer and the equivalence tests:
  * no dropout, no BatchNorm (results must not depend on the micro-batch split);
  * no float buffers: every float initializer in the ONNX file is treated as a
    trainable parameter, so masks / positions are computed inside forward;
  * reshapes use the runtime batch size, so the exported graph keeps a
    symbolic batch axis (Shape -> Gather -> Concat -> Reshape chains).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Three Linear layers (ReLU, GELU) + cross-entropy; inputs x [B, in], y [B]."""

    input_names = ("x", "y")

    def __init__(self, in_features=32, hidden=64, num_classes=10):
        super().__init__()
        self.in_features = in_features
        self.num_classes = num_classes
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x, y):
        h = F.relu(self.fc1(x))
        h = F.gelu(self.fc2(h))
        logits = self.fc3(h)
        return F.cross_entropy(logits, y)


class SelfAttention(nn.Module):
    """Multi-head self-attention with the softmax written out (no fused SDPA)."""

    def __init__(self, hidden, heads):
        super().__init__()
        assert hidden % heads == 0, "hidden must be divisible by heads"
        self.heads = heads
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def _split(self, t):
        # Runtime sizes (not Python constants) keep the batch axis dynamic in ONNX.
        return t.view(t.size(0), t.size(1), self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, causal=False):
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        if causal:
            # Built from Range/comparison rather than triu so it also exports at
            # opset 13 (Trilu needs opset 14), and stays a bool, never a float buffer.
            seq = x.size(1)
            pos = torch.arange(seq, device=x.device)
            future = pos.unsqueeze(0) > pos.unsqueeze(1)  # [S, S], True above the diagonal
            # Large finite negative instead of -inf: avoids inf*0 = NaN in backward.
            scores = scores.masked_fill(future, -1e9)
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2)
        ctx = ctx.reshape(ctx.size(0), ctx.size(1), self.heads * self.head_dim)
        return self.out(ctx)


class FeedForward(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class PostLNBlock(nn.Module):
    """BERT encoder layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.attn = SelfAttention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden)
        self.ffn = FeedForward(hidden, ffn)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ffn(x))


class PreLNBlock(nn.Module):
    """GPT decoder layer: x = x + Attn(LN(x)) (causal); x = x + FFN(LN(x))."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.ffn = FeedForward(hidden, ffn)

    def forward(self, x):
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.ffn(self.ln2(x))


class _TokenModel(nn.Module):
    """Shared embedding / LM-head / loss plumbing for the BERT and GPT models."""

    input_names = ("input_ids", "labels")

    def __init__(self, vocab, hidden, heads, layers, seq_len, ffn, block):
        super().__init__()
        self.vocab = vocab
        self.seq_len = seq_len
        ffn = ffn or 4 * hidden
        self.tok_emb = nn.Embedding(vocab, hidden)
        # Learned positions as a parameter table indexed by arange in forward
        # (a precomputed position buffer would be a non-parameter initializer).
        self.pos_emb = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList([block(hidden, heads, ffn) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)
        # Separate LM head (no weight tying: tied weights would be one
        # initializer used by two stages).
        self.lm_head = nn.Linear(hidden, vocab)

    # Hooks so BERT and GPT differ only in where the extra LayerNorm sits.
    def embed_norm(self, x):
        return x

    def final_norm(self, x):
        return x

    def forward(self, input_ids, labels):
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)
        x = self.embed_norm(x)
        for blk in self.blocks:
            x = blk(x)
        x = self.final_norm(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1))


class BERT(_TokenModel):
    """BERT-style post-LN encoder; loss = token-level CE on every position."""

    def __init__(self, vocab=100, hidden=64, heads=4, layers=2, seq_len=16, ffn=None):
        super().__init__(vocab, hidden, heads, layers, seq_len, ffn, PostLNBlock)

    def embed_norm(self, x):
        # BERT normalises the embedding sum; reuse ln_f's slot for that.
        return self.ln_f(x)


class GPT(_TokenModel):
    """GPT-style pre-LN decoder with a causal mask; labels are pre-shifted."""

    def __init__(self, vocab=100, hidden=64, heads=4, layers=2, seq_len=16, ffn=None):
        super().__init__(vocab, hidden, heads, layers, seq_len, ffn, PreLNBlock)

    def final_norm(self, x):
        return self.ln_f(x)


MODELS = {"mlp": MLP, "bert": BERT, "gpt": GPT}


def build(name, seed=0, **kwargs):
    """Construct model `name` with deterministic initial weights."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name](**kwargs)
