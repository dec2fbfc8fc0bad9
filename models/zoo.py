"""Test models for rannc.

Every model's forward takes the graph inputs and returns the scalar training
loss, because rannc treats the loss as part of the graph (its only output).

Constraints these definitions respect so that the ONNX export is usable by the
rannc importer and the equivalence tests:
  * no dropout, no BatchNorm (results must not depend on the micro-batch split);
  * no float buffers: every float initializer in the ONNX file other than
    BatchNorm running statistics is treated as a trainable parameter, so masks /
    positions are computed inside forward;
  * reshapes use the runtime batch size, so the exported graph keeps a
    symbolic batch axis (Shape -> Gather -> Concat -> Reshape chains).

The torchvision classifiers (resnet18, mobilenet_v3_small, vit_tiny) are the
exception: real-world graphs with BatchNorm (whose running statistics are
buffers, Note [buffers] in planner/ir/ir.h), so their losses match PyTorch's
only with the whole batch in one micro-batch on one replica.
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

    def __init__(self, vocab, hidden, heads, layers, seq_len, ffn, block, tie_embeddings=False):
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
        # The LM head's weight is its own parameter unless tied to the token
        # embedding (then it is one initializer that the first and the last
        # stage both read: Note [shared parameters] in executor/schedule/schedule.h).
        self.lm_head = nn.Linear(hidden, vocab)
        if tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
            # nn.Embedding's N(0, 1) would make the first logits ~N(0, hidden);
            # scale the shared table so they start near N(0, 1).
            nn.init.normal_(self.tok_emb.weight, std=hidden ** -0.5)

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

    def __init__(self, vocab=100, hidden=64, heads=4, layers=2, seq_len=16, ffn=None, tie_embeddings=False):
        super().__init__(vocab, hidden, heads, layers, seq_len, ffn, PreLNBlock, tie_embeddings)

    def final_norm(self, x):
        return self.ln_f(x)


class VisionClassifier(nn.Module):
    """A torchvision classifier + cross-entropy; inputs x [B, 3, S, S], y [B].

    Dropout is disabled (p=0) so rannc's losses can match PyTorch's exactly.
    """

    input_names = ("x", "y")
    in_channels = 3

    def __init__(self, net, image_size, num_classes):
        super().__init__()
        self.net = net
        self.image_size = image_size
        self.num_classes = num_classes
        for m in self.net.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def _torchvision():
    try:
        import torchvision
    except ImportError as e:
        raise SystemExit(f"zoo.py: the torchvision models need python3-torchvision ({e}); run tools/setup.sh")
    return torchvision.models


def ResNet18(num_classes=10, image_size=32):
    """torchvision's ResNet-18 (BatchNorm, residual adds) on small images."""
    return VisionClassifier(_torchvision().resnet18(num_classes=num_classes), image_size, num_classes)


def MobileNetV3Small(num_classes=10, image_size=32):
    """torchvision's MobileNetV3-Small (depthwise convs, BatchNorm, squeeze-excitation, hardswish)."""
    return VisionClassifier(_torchvision().mobilenet_v3_small(num_classes=num_classes), image_size, num_classes)


def VitTiny(num_classes=10, image_size=32):
    """A tiny torchvision VisionTransformer (patch conv, class token, nn.MultiheadAttention)."""
    vit = _torchvision().vision_transformer.VisionTransformer(
        image_size=image_size, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=num_classes)
    # torchvision zero-initializes the head, which would leave every other
    # gradient of the first step zero; random weights exercise the whole graph.
    nn.init.normal_(vit.heads.head.weight, std=0.1)
    return VisionClassifier(vit, image_size, num_classes)


MODELS = {"mlp": MLP, "bert": BERT, "gpt": GPT, "resnet18": ResNet18, "mobilenet_v3_small": MobileNetV3Small,
          "vit_tiny": VitTiny}
TOKEN_MODELS = ("bert", "gpt")
VISION_MODELS = ("resnet18", "mobilenet_v3_small", "vit_tiny")


def build(name, seed=0, **kwargs):
    """Construct model `name` with deterministic initial weights."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name](**kwargs)
