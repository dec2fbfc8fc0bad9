"""Small models whose ONNX exports hold every pattern rannc's import fusion
rewrites (Note [pattern fusion] in planner/import/fuse.cpp), exported the ways
users export: the legacy exporter (dynamo=False) at opsets 14 and 17, and the
dynamo exporter with its defaults (optimize=True) and with optimize=False.

tests/planner/import/fusion_test.cpp imports each file, fuses a copy and
checks that the fused graph computes the loss and every gradient the
unfused one does. Writes OUT/<model>_<exporter>.onnx (plus .data files).

    python models/fusion_models.py --out DIR
"""

import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, written out as it is there."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim) * 0.1 + 1)
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps)).to(dtype)


def gelu_new(x):
    """GPT-2's tanh GELU, written out as Hugging Face writes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Block(nn.Module):
    """Every pattern once: LayerNorm, causal SDPA (scale default), RMSNorm,
    SwiGLU (SiLU), GELU (erf), GELU (tanh, by hand), and the bias of a Linear."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.rms = RMSNorm(d)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        h = self.rms(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        x = x + gelu_new(F.gelu(self.fc(x)))
        return (x * x).mean()


class Masks(nn.Module):
    """Attention with an additive float mask and an explicit scale, grouped-query
    heads (Hugging Face's repeat_kv), and attention written by hand: q @ k^T / sqrt(d)
    plus a mask, softmax, @ v; and with a masked fill (Megatron's -10000)."""

    def __init__(self, d=16, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d // heads * kv_heads)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        q = self.q(x).reshape(b, s, self.heads, hd).transpose(1, 2)
        k, v = self.kv(x).split(hd * self.kv_heads, dim=-1)
        k, v = (t.reshape(b, s, self.kv_heads, hd).transpose(1, 2) for t in (k, v))
        rep = self.heads // self.kv_heads
        k, v = (t[:, :, None].expand(b, self.kv_heads, rep, s, hd).reshape(b, self.heads, s, hd) for t in (k, v))
        i = torch.arange(s, device=x.device)
        bias = torch.where(i[:, None] >= i[None, :], 0.0, float("-inf")).to(x.dtype)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + bias
        m = torch.softmax(scores, dim=-1) @ v
        future = i[:, None] < i[None, :]
        filled = torch.softmax(((q * 0.5) @ k.transpose(-1, -2) * 0.5).masked_fill(future, -10000.0), dim=-1) @ v
        y = self.out((a + m + filled).transpose(1, 2).reshape(b, s, d))
        return (y * y).mean()


MODELS = {"block": Block, "masks": Masks}
EXPORTERS = {"legacy14": ("legacy", 14), "legacy17": ("legacy", 17), "dynamo": ("dynamo", True),
             "dynamo_noopt": ("dynamo", False)}


def export(model, x, path, how, arg):
    if how == "legacy":
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["loss"],
                          dynamic_axes={"x": {0: "batch"}}, opset_version=arg, dynamo=False,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    else:
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["loss"],
                          dynamic_shapes={"x": {0: torch.export.Dim("batch", min=2)}}, optimize=arg)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, cls in MODELS.items():
        torch.manual_seed(0)
        model = cls()
        x = torch.randn(3, 8, 16)
        for ex, (how, arg) in EXPORTERS.items():
            path = os.path.join(a.out, f"{name}_{ex}.onnx")
            export(model, x, path, how, arg)
            print("wrote", path)


if __name__ == "__main__":
    main()
