#!/usr/bin/env python3
"""Export a test model to ONNX, write its training data and PyTorch reference losses.

Usage:
  .venv/bin/python models/make_model.py --model {mlp,bert,gpt,nanogpt,hf_encoder,hf_gpt2,hf_bert,hf_llama,
                                                 hf_qwen2,hf_mistral,hf_t5,hf_gpt_neox,hf_opt,hf_phi3,hf_gemma,hf_roberta,
                                                 resnet18,mobilenet_v3_small,vit_tiny,convnext_tiny,swin_tiny} --out DIR
      [--batch-size 8] [--samples 64] [--steps 10] [--lr-sgd 0.1]
      [--lr-adam 0.001] [--opset 17] [--seed 0]
      [--layers L --hidden H --heads A --seq-len S --vocab V]   (bert, gpt, hf_*)
      [--tie-embeddings]                                        (gpt)
      [--image-size S]                                          (torchvision models)
      [--torchscript [--torchscript-bare]] [--dynamo-onnx] [--torch-export] [--precisions bf16,fp16]
      [--no-legacy-onnx] [--no-variants]

Writes:
  DIR/model.onnx             graph whose single output "loss" is the scalar loss
  DIR/data/<input>.npy       one array per graph input, first dim = samples
  DIR/reference_sgd.json     losses of plain PyTorch training with SGD
  DIR/reference_adam.json    ... and with Adam
  DIR/reference_{sgd,adam}_{bf16,fp16}.json  with --precisions: trained under torch.autocast("cpu", dtype=...)
                             (fp16 with torch.amp.GradScaler)
  DIR/reference_{sgd,adam}_cuda.json  with --reference-device cuda (and nothing else): the same
                             training on this machine's GPU, TF32 off
  DIR/reference_{sgd,adam}_params.npz  PyTorch's parameters after those steps
  DIR/reference_{sgd,adam}_buffers.npz BatchNorm running statistics after them, as
                             ONNX updates them (models with BatchNorm only)
  DIR/reference_<variant>.json  ... with each optimizer variant in VARIANTS
                             (momentum, AdamW, schedules, clipping,
                             accumulation): losses, gradient norms, learning
                             rates, and the rannc-exec flags that ask for it

Reference step k uses samples (k*B + i) % N, i in [0, B), i.e. rannc-exec's
`--shuffle off` order, so rannc's logged losses can be compared one to one.
Runs with the project's .venv/bin/python (tools/setup.sh): the PyTorch the build links.
"""

import argparse
import contextlib
import copy
import itertools
import json
import math
import os
import sys

try:
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper
except ImportError as e:  # the usual cause: a python3 other than the project's .venv
    sys.exit(f"make_model.py: error: {e}; run it with .venv/bin/python (tools/setup.sh makes it)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

HF_MODELS = ("hf_gpt2", "hf_bert", "hf_llama", "hf_qwen2", "sdpa_llama", "hf_mistral", "hf_t5", "hf_roberta") + \
    zoo.CAUSAL_LMS  # zoo's transformers-style models
MIN_OPSET, MAX_OPSET = 13, 17  # the range rannc supports; 17 is also torch 1.13's newest


# --------------------------------------------------------------------------- data

def make_data(name, model, n, seed, ignored_labels=False):
    """Learnable synthetic data, so the loss visibly falls within a few steps.
    ignored_labels: label -100 where Hugging Face's collators put it (hf_bert:
    every position but the masked ones; causal LMs: right padding), so each
    micro-batch's loss is a mean over a different count of tokens."""
    rng = np.random.RandomState(seed + 1234)  # independent of the weight seed's stream
    if name == "mlp":
        x = rng.standard_normal((n, model.in_features)).astype(np.float32)
        # Labels from a fixed random linear "teacher": a linearly separable task.
        teacher = rng.standard_normal((model.in_features, model.num_classes))
        y = np.argmax(x @ teacher, axis=1).astype(np.int64)
        return {"x": x, "y": y}
    if name in zoo.VISION_MODELS:
        s = model.image_size
        x = rng.standard_normal((n, model.in_channels, s, s)).astype(np.float32)
        # A random linear teacher over the pixels, as for the MLP.
        teacher = rng.standard_normal((model.in_channels * s * s, model.num_classes))
        y = np.argmax(x.reshape(n, -1) @ teacher, axis=1).astype(np.int64)
        return {"x": x, "y": y}

    vocab, seq = model.vocab, model.seq_len
    # Token 0 is reserved (BERT's [MASK]); rule: arithmetic progressions over
    # tokens 1..vocab-1 with a small stride, so the next token is predictable.
    start = rng.randint(0, vocab - 1, size=(n, 1))
    stride = rng.randint(1, 4, size=(n, 1))
    t = np.arange(seq + 1)[None, :]
    full = 1 + (start + stride * t) % (vocab - 1)
    if name == "hf_encoder":
        # Masked-LM with padding: each sample has 8..seq real tokens, the rest
        # padding (attention_mask 0, label -100 so the loss ignores them).
        tokens = full[:, :seq]
        lengths = rng.randint(min(8, seq), seq + 1, size=(n, 1))
        attention_mask = (np.arange(seq)[None, :] < lengths).astype(np.int64)
        masked = (rng.random_sample(tokens.shape) < 0.15) & (attention_mask == 1)
        input_ids = np.where(masked, 0, tokens) * attention_mask
        labels = np.where(attention_mask == 1, tokens, -100)
        return {"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask,
                "labels": labels.astype(np.int64)}
    if name in ("hf_gpt2", "hf_llama", "hf_qwen2", "sdpa_llama", "hf_mistral", "hf_t5") + zoo.CAUSAL_LMS:
        # Hugging Face's causal-LM convention: labels = input_ids, the model
        # shifts them itself (the last position predicts nothing); 10% noise.
        noise = rng.random_sample(full.shape) < 0.10
        full = np.where(noise, rng.randint(1, vocab, size=full.shape), full)
        input_ids = full[:, :seq].astype(np.int64)
        labels = input_ids.copy()
        if ignored_labels:  # right padding: 2..seq real tokens, then token 1 with label -100
            lengths = rng.randint(2, seq + 1, size=(n, 1))
            pad = np.arange(seq)[None, :] >= lengths
            input_ids = np.where(pad, 1, input_ids)
            labels = np.where(pad, -100, input_ids)
        return {"input_ids": input_ids, "labels": labels}
    if name in ("hf_bert", "hf_roberta"):
        # As "bert", but token 0 is BertConfig's pad_token_id (RoBERTa's here) (the embedding's
        # padding_idx, whose row PyTorch never trains; an ONNX Gather does not
        # know it), so it never occurs: [MASK] is 1, the tokens are 2..vocab-1.
        tokens = 2 + (start + stride * t[:, :seq]) % (vocab - 2)
        mask = rng.random_sample(tokens.shape) < 0.15
        labels = np.where(mask, tokens, -100) if ignored_labels else tokens  # DataCollatorForLanguageModeling's
        return {"input_ids": np.where(mask, 1, tokens).astype(np.int64), "labels": labels.astype(np.int64)}
    if name == "bert":
        # Masked-LM flavour: 15% of inputs replaced by [MASK]; labels = clean tokens.
        tokens = full[:, :seq]
        mask = rng.random_sample(tokens.shape) < 0.15
        input_ids = np.where(mask, 0, tokens)
        labels = tokens
    else:  # gpt, nanogpt
        # 10% noise tokens; labels are the (noisy) sequence shifted by one, the
        # last label being the sequence's own continuation.
        noise = rng.random_sample(full.shape) < 0.10
        full = np.where(noise, rng.randint(1, vocab, size=full.shape), full)
        input_ids = full[:, :seq]
        labels = full[:, 1:]
    if name == "nanogpt":
        return {"idx": input_ids.astype(np.int64), "targets": labels.astype(np.int64)}
    return {"input_ids": input_ids.astype(np.int64), "labels": labels.astype(np.int64)}


def batch(data, names, k, bsz):
    n = len(data[names[0]])
    idx = (k * bsz + np.arange(bsz)) % n
    return [torch.from_numpy(data[nm][idx]) for nm in names]


# --------------------------------------------------------------------------- export

def dynamic_shapes(model, names):
    """The dimensions a user declares dynamic, the same for both default
    exports: the batch of every input, and for token models the sequence too,
    as Hugging Face exports them (with a fixed sequence the ONNX optimizer
    folds the position embedding's lookup into a constant, which rannc
    refuses), from 2 or the model's `min_seq_len` (the exporter's suggested
    fix where the model's guards need more) to its seq_len."""
    batch_dim = torch.export.Dim("batch", min=2)
    if not hasattr(model, "seq_len"):
        return {nm: {0: batch_dim} for nm in names}
    seq_dim = torch.export.Dim("seq", min=getattr(model, "min_seq_len", 2), max=model.seq_len)
    return {nm: {0: batch_dim, 1: seq_dim} for nm in names}


def export_dynamo(model, example, names, path):
    """torch.onnx.export as PyTorch's docs show it: the dynamo exporter with
    every default (optimize=True, its default opset, the weights in
    path + ".data"), a dynamic batch dimension (and sequence, for token models). What the exporter's optimizer
    folds, merges and unties, rannc's importer restores or refuses (Note
    [export signature] in planner/import/onnx_signature.cpp). A tied
    parameter is named in the file by its last alias (GPT-2's lm_head.weight):
    aliases.json maps each alias to named_parameters()' name, for comparing
    trained weights by PyTorch's names."""
    torch.onnx.export(model, tuple(example), path, input_names=list(names), output_names=["loss"],
                      dynamic_shapes=dynamic_shapes(model, names))
    first = {}
    for nm, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), nm)
    write_json(os.path.join(os.path.dirname(path), "aliases.json"),
               {nm: first[id(p)] for nm, p in model.named_parameters(remove_duplicate=False) if nm != first[id(p)]})


def export_torch_program(model, example, names, path):
    """torch.export.export + torch.export.save as PyTorch's docs show them
    (strict=False, everything else default), with the same dynamic
    dimensions as export_dynamo. A Hugging Face model is called as its users
    call it, without an attention_mask."""
    program = torch.export.export(model, tuple(example), dynamic_shapes=dynamic_shapes(model, names), strict=False)
    torch.export.save(program, path)


@contextlib.contextmanager
def legacy_mask(model):
    """The all-ones attention_mask the legacy exporter needs on transformers'
    causal LMs (zoo._HFModel), on while the legacy export runs (a trace
    records aten::diff, which rannc runs: it takes the model as users call it)."""
    model.ones_mask = getattr(model, "legacy_needs_mask", False)
    try:
        yield
    finally:
        model.ones_mask = False


def export(model, example, names, path, opset):
    tmp = path + ".tmp"
    # Exporting in training mode runs a forward, which moves BatchNorm running
    # statistics; the file must hold the ones training starts from.
    buffers = {nm: b.detach().clone() for nm, b in model.named_buffers()}
    torch.onnx.export(
        model, tuple(example), tmp,
        export_params=True,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        opset_version=opset,
        input_names=list(names),
        output_names=["loss"],
        dynamic_axes={nm: {0: "batch"} for nm in names},
        # The TorchScript-based exporter: it exports training mode (BatchNorm
        # updating its statistics) at the opsets 13-17 these tests pin.
        # models/export_check.py covers the default (dynamo) exporter.
        dynamo=False,
    )
    m = onnx.load(tmp)
    onnx.checker.check_model(m)
    inits = [i.name for i in m.graph.initializer]
    # Parameters (tied ones once) and BatchNorm running statistics, which
    # rannc imports as buffers; num_batches_tracked is not part of the graph.
    params = [nm for nm, _ in model.named_parameters()]
    bn = {nm for nm, mod in model.named_modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)}
    stats = [nm for nm, _ in model.named_buffers() if nm.rpartition(".")[0] in bn]
    params += [nm for nm in stats if not nm.endswith("num_batches_tracked")]
    # Other buffers (BERT's integer position_ids, Llama's rotary inv_freq)
    # may be inlined as constants; as initializers the integer ones are
    # rannc's `const`, but a floating-point one would be trained.
    others = {nm: b for nm, b in model.named_buffers() if nm not in stats}
    trained = sorted(nm for nm in inits if nm in others and others[nm].is_floating_point())
    if trained:
        raise RuntimeError(f"floating-point buffers {trained} are initializers: rannc would train them")
    inits = [nm for nm in inits if nm not in others]
    if sorted(inits) != sorted(params):
        raise RuntimeError(
            f"initializers {sorted(set(inits) ^ set(params))} differ from the parameters and buffers")
    if len(m.graph.output) != 1:
        raise RuntimeError(f"expected 1 graph output, got {len(m.graph.output)}")
    if any(i.name in buffers for i in m.graph.initializer):
        for i in m.graph.initializer:
            if i.name in buffers:
                i.CopyFrom(numpy_helper.from_array(buffers[i.name].numpy(), i.name))
        onnx.save(m, tmp)
    os.replace(tmp, path)  # never leave a half-written model.onnx behind


# --------------------------------------------------------------------------- reference

def track_onnx_running_stats(model):
    """BatchNorm running statistics as ONNX (and rannc) update them, keyed by
    initializer name: the mean is PyTorch's own, but ONNX updates the variance
    with the biased batch variance where PyTorch uses the unbiased one (Note
    [BatchNormalization in training] in
    executor/runtime/kernels/normalization.cpp), so the variance is followed
    here by a hook on every BatchNorm's input."""
    stats = {}

    def hook(prefix, bn):
        stats[prefix + "running_var"] = bn.running_var.detach().clone()
        stats[prefix + "running_mean"] = bn.running_mean  # PyTorch updates it in place

        def update(_, inputs, __):
            x = inputs[0].detach()
            var = x.var([d for d in range(x.dim()) if d != 1], unbiased=False)
            m = 1.0 - bn.momentum  # ONNX's momentum is the kept fraction
            stats[prefix + "running_var"] = stats[prefix + "running_var"] * m + var * (1.0 - m)
        bn.register_forward_hook(update)

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.track_running_stats:
            hook(name + ".", mod)
    return stats


def buffers_read(model, example):
    """Names of the buffers that forward reads (as an argument of a torch
    function or a Tensor method), on a copy of the model: the state_dict
    (persistent) ones always, the non-persistent ones only if read (Llama's
    rotary embedding reads inv_freq, not original_inv_freq)."""
    model = copy.deepcopy(model)
    seen = set()

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            for a in list(args) + list((kwargs or {}).values()):
                if isinstance(a, torch.Tensor):
                    seen.add(id(a))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Record():
        model(*example)
    persistent = set(model.state_dict())
    return {nm for nm, b in model.named_buffers() if nm in persistent or id(b) in seen}


def train_reference(model, data, names, steps, bsz, make_opt, params_out=None, buffers_out=None, autocast=None,
                    init_scale=2.0 ** 16, skipped=None, device="cpu"):
    """Losses of `steps` steps; with params_out, also writes the trained
    parameters there (.npz keyed by parameter = ONNX initializer name); with
    buffers_out, the BatchNorm running statistics (track_onnx_running_stats).
    With autocast (torch.bfloat16 or torch.float16), each forward runs under
    torch.autocast('cpu', dtype=autocast): mixed precision as PyTorch users
    write it, fp32 weights and optimizer state (rannc-plan --precision); fp16
    with torch.amp.GradScaler(init_scale=init_scale), the steps it skips
    appended to the list `skipped`. device="cuda": the model and each batch on
    this machine's GPU (fp32 only; cuda_references)."""
    model = copy.deepcopy(model).to(device)  # every optimizer starts from the exported weights
    model.train()
    read = buffers_read(model, batch(data, names, 0, bsz)) if buffers_out else set()
    stats = track_onnx_running_stats(model) if buffers_out else {}
    opt = make_opt(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if autocast == torch.float16 else None
    losses = []
    # Parameters whose gradient is rounding noise at every step (below 1e-6 of
    # the step's largest gradient entry): mathematically zero, such as an
    # attention key bias (softmax ignores a per-query shift). Adam divides by
    # the gradient's own scale, so their trained values are amplified noise
    # that no other implementation can reproduce; train_check.py names and
    # skips them when comparing trained parameters.
    noise = {nm for nm, _ in model.named_parameters()} if steps > 0 else set()
    for k in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = model(*[t.to(device) for t in batch(data, names, k, bsz)])
        losses.append(float(loss.item()))  # loss of the forward before the update
        if scaler:  # fp16: GradScaler's dynamic loss scaling, its defaults
            scaler.scale(loss).backward()
            scaler.step(opt)
            before = scaler.get_scale()
            scaler.update()
            if skipped is not None and scaler.get_scale() < before:  # inf/nan gradients: the step was skipped
                skipped.append(k)
            continue
        loss.backward()
        peak = {nm: float(p.grad.abs().max()) for nm, p in model.named_parameters() if p.grad is not None}
        top = max(peak.values(), default=0.0)
        noise -= {nm for nm, v in peak.items() if v > 1e-6 * top}
        opt.step()
    if params_out:
        tmp = params_out + ".tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **{nm: p.detach().numpy() for nm, p in model.named_parameters()})
        os.replace(tmp, params_out)
        write_json(params_out.replace("_params.npz", "_noise.json"), sorted(noise))
    if buffers_out and stats:
        tmp = buffers_out + ".tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **{nm: t.detach().numpy() for nm, t in stats.items()})
        os.replace(tmp, buffers_out)
    if buffers_out and read:
        # PyTorch's own buffers (unbiased running_var, num_batches_tracked;
        # Hugging Face's non-persistent position_ids, inv_freq, unchanged):
        # what a TorchScript model, which runs aten::batch_norm itself, has
        # after training: the buffers its forward reads.
        torch_out = buffers_out.replace("_buffers.npz", "_torch_buffers.npz")
        with open(torch_out + ".tmp", "wb") as f:
            np.savez(f, **{nm: t.detach().numpy() for nm, t in model.named_buffers() if nm in read})
        os.replace(torch_out + ".tmp", torch_out)
    return losses


# Optimizer variants: PyTorch trains each here (torch.optim, LambdaLR,
# clip_grad_norm_, accumulation by loss / K) and the tests run rannc-exec with
# exec_args(variant), so flags and reference come from this one description.
# Keys are rannc-exec's flag names with '_' for '-'.
VARIANTS = {
    "sgd_nesterov": dict(optimizer="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adamw": dict(optimizer="adamw", lr=0.002, betas=(0.85, 0.95), eps=1e-6, weight_decay=0.1),
    "adam_cosine": dict(optimizer="adam", lr=0.003, lr_schedule="cosine", warmup_steps=3, min_lr=0.0003),
    # Unclipped norms of bert and gpt are 0.75-1.1: every step clips.
    "sgd_clip": dict(optimizer="sgd", lr=0.1, momentum=0.9, clip_grad_norm=0.5),
    # 2 batches per step, 3 epochs: ceil(3 * samples / (2 * B)) steps.
    "sgd_accum2": dict(optimizer="sgd", lr=0.1, momentum=0.5, accumulation_steps=2, epochs=3,
                       lr_schedule="linear", warmup_steps=2),
}


def variant_steps(v, steps, samples, bsz):
    """Optimizer steps of a variant: --epochs E means ceil(E * N / (B * K))."""
    if "epochs" in v:
        per_step = bsz * v.get("accumulation_steps", 1)
        return -(-v["epochs"] * samples // per_step)
    return steps


def exec_args(v, steps):
    """The rannc-exec flags that train variant v."""
    args = []
    for key, val in v.items():
        flag = "--" + key.replace("_", "-")
        if val is True:
            args.append(flag)
        elif isinstance(val, tuple):
            args += [flag, ",".join(repr(x) for x in val)]
        else:
            args += [flag, str(val) if isinstance(val, (int, str)) else repr(val)]
    if "epochs" not in v:
        args += ["--steps", str(steps)]
    return args


def lr_factor(v, k, total):
    """LambdaLR factor of step k (docs/training.md): linear warm-up from 0,
    then constant, or linear/cosine decay to min_lr at step `total`."""
    w = v.get("warmup_steps", 0)
    if k < w:
        return k / w
    kind = v.get("lr_schedule", "constant")
    if kind == "constant":
        return 1.0
    r = v.get("min_lr", 0.0) / v["lr"]
    span = max(1, total - w)
    if kind == "linear":
        return r + (1 - r) * max(0.0, (total - k) / span)
    return r + (1 - r) * 0.5 * (1.0 + math.cos(math.pi * (k - w) / span))


def make_optimizer(v, params):
    kw = {"lr": v["lr"]}
    if "weight_decay" in v:
        kw["weight_decay"] = v["weight_decay"]
    if v["optimizer"] == "sgd":
        for key in ("momentum", "dampening", "nesterov"):
            if key in v:
                kw[key] = v[key]
        return torch.optim.SGD(params, **kw)
    for key in ("betas", "eps"):
        if key in v:
            kw[key] = v[key]
    return (torch.optim.AdamW if v["optimizer"] == "adamw" else torch.optim.Adam)(params, **kw)


def train_variant(model, data, names, steps, bsz, v):
    """Real PyTorch training of variant v: K batches' (loss / K).backward(),
    clip_grad_norm_ over all parameters, optimizer step, LambdaLR step."""
    model = copy.deepcopy(model)
    model.train()
    params = list(model.parameters())
    opt = make_optimizer(v, params)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(v, k, steps))
    accum = v.get("accumulation_steps", 1)
    out = {"losses": [], "batch_losses": [], "grad_norms": [], "lrs": []}
    for k in range(steps):
        opt.zero_grad()
        losses = []
        for j in range(accum):
            loss = model(*batch(data, names, k * accum + j, bsz))
            losses.append(float(loss.item()))
            (loss / accum).backward()
        # max_norm inf: the total norm, gradients multiplied by exactly 1.
        norm = torch.nn.utils.clip_grad_norm_(params, v.get("clip_grad_norm", math.inf))
        out["losses"].append(sum(losses) / accum)
        out["batch_losses"].append(losses)
        out["grad_norms"].append(float(norm))
        out["lrs"].append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, choices=sorted(zoo.MODELS))
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--batch-size", type=int, default=8, help="global batch size B")
    p.add_argument("--samples", type=int, default=64, help="number of samples N in data/")
    p.add_argument("--steps", type=int, default=10, help="reference training steps")
    p.add_argument("--precisions", default="", help="also write autocast references, e.g. bf16,fp16 "
                   "(reference_<opt>_<precision>.json; rannc-plan --precision)")
    p.add_argument("--lr-sgd", type=float, default=0.1)
    p.add_argument("--lr-adam", type=float, default=0.001)
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torchscript", action="store_true",
                   help="also write DIR/model.pt, the same model traced with torch.jit, with the input "
                        "description rannc-plan needs")
    p.add_argument("--no-legacy-onnx", action="store_true",
                   help="do not write DIR/model.onnx with the legacy exporter (a model it cannot export, e.g. "
                        "transformers' causal LMs without an attention mask: aten::diff)")
    p.add_argument("--dynamo-onnx", action="store_true",
                   help="also write DIR/model_dynamo.onnx with torch.onnx.export's default (dynamo) exporter, "
                        "its default opset, the batch (and a token model's sequence) dynamic (torch.export.Dim)")
    p.add_argument("--torch-export", action="store_true",
                   help="also write DIR/model.pt2: torch.export.export with the dynamic dimensions of "
                        "--dynamo-onnx, saved by torch.export.save")
    p.add_argument("--no-variants", action="store_true",
                   help="write only the sgd and adam references, not the optimizer variants' (faster)")
    p.add_argument("--torchscript-bare", action="store_true",
                   help="with --torchscript: save the archive as torch.jit.save does by default, without the "
                        "input description (rannc-plan then needs --data DIR)")
    p.add_argument("--ignored-labels", action="store_true",
                   help="hf_bert, hf_gpt2, hf_llama: label -100 on unmasked (BERT) or padded (causal LMs) "
                        "positions, as Hugging Face's collators write them")
    sizes = p.add_argument_group("transformer sizes (bert, gpt, hf_*; defaults are the models' own)")
    for flag in ("--layers", "--hidden", "--heads", "--seq-len", "--vocab"):
        sizes.add_argument(flag, type=int)
    p.add_argument("--tie-embeddings", action="store_true",
                   help="gpt: the LM head's weight is the token embedding's (one shared initializer)")
    p.add_argument("--image-size", type=int, help="torchvision models: input images are S x S (default 32)")
    p.add_argument("--reference-device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: only train the sgd and adam references of the model already in --out (made with "
                        "the same flags) on this machine's GPU, as reference_<opt>_cuda.json; exit 77 without one")
    a = p.parse_args(argv)
    a.sizes = {k: v for k, v in (("layers", a.layers), ("hidden", a.hidden), ("heads", a.heads),
                                 ("seq_len", a.seq_len), ("vocab", a.vocab)) if v is not None}
    if a.sizes and a.model not in ("bert", "gpt") + HF_MODELS:
        p.error("transformer size flags apply to bert, gpt and the hf_* models only")
    if a.tie_embeddings:
        if a.model != "gpt":
            p.error("--tie-embeddings applies to gpt only")
        a.sizes["tie_embeddings"] = True
    if a.image_size is not None:
        if a.model not in zoo.VISION_MODELS:
            p.error("--image-size applies to the torchvision models only")
        if a.image_size < 8:
            p.error(f"--image-size must be >= 8, got {a.image_size}")
        a.sizes["image_size"] = a.image_size
    for k, v in a.sizes.items():
        if v < 1:
            p.error(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    if a.hidden is not None and a.hidden % (a.heads or 4) != 0:
        p.error(f"--hidden {a.hidden} must be divisible by the number of heads ({a.heads or 4})")
    for flag, v in (("--batch-size", a.batch_size), ("--samples", a.samples)):
        if v < 1:
            p.error(f"{flag} must be >= 1, got {v}")
    if a.steps < 0:
        p.error(f"--steps must be >= 0, got {a.steps}")
    for flag, v in (("--lr-sgd", a.lr_sgd), ("--lr-adam", a.lr_adam)):
        if not v > 0:
            p.error(f"{flag} must be > 0, got {v}")
    if not MIN_OPSET <= a.opset <= MAX_OPSET:
        p.error(f"--opset must be in [{MIN_OPSET}, {MAX_OPSET}], got {a.opset}")
    if a.seed < 0:
        p.error(f"--seed must be >= 0, got {a.seed}")
    if set(filter(None, a.precisions.split(","))) - {"bf16", "fp16"}:
        p.error(f"--precisions: {a.precisions!r} is not a list of bf16, fp16")
    if a.ignored_labels and a.model not in HF_MODELS:
        p.error("--ignored-labels applies to the hf_* models only")
    if a.torchscript_bare and not a.torchscript:
        p.error("--torchscript-bare needs --torchscript")
    return a


def cuda_references(a):
    """--reference-device cuda: the SGD and Adam references of a model this
    script made before (same flags), trained on this machine's GPU, written as
    reference_<opt>_cuda.json beside the cpu ones (train_check.py --device
    cuda). TF32 is off, as in rannc-exec: fp32 matrix products then differ
    from the cpu run only in cuBLAS's reduction order. Exits 77 without a GPU."""
    if not torch.cuda.is_available():
        print("make_model.py: no GPU visible: the cuda references cannot be made here", file=sys.stderr)
        sys.exit(77)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = zoo.build(a.model, seed=a.seed, **a.sizes)
    names = list(model.input_names)
    data = make_data(a.model, model, a.samples, a.seed, a.ignored_labels)
    for nm in names:  # the same model and data as on disk, or the comparison means nothing
        path = os.path.join(a.out, "data", nm + ".npy")
        if not os.path.exists(path) or not np.array_equal(np.load(path), data[nm]):
            sys.exit(f"make_model.py: error: {path} is not this model's data: make {a.out} first with the same flags")
    for opt_name, lr, make_opt in (
        ("sgd", a.lr_sgd, lambda ps: torch.optim.SGD(ps, lr=a.lr_sgd)),
        ("adam", a.lr_adam, lambda ps: torch.optim.Adam(ps, lr=a.lr_adam)),
    ):
        losses = train_reference(model, data, names, a.steps, a.batch_size, make_opt, device="cuda")
        write_json(os.path.join(a.out, f"reference_{opt_name}_cuda.json"), {
            "model": a.model, "optimizer": opt_name, "lr": lr, "batch_size": a.batch_size, "steps": a.steps,
            "losses": losses, "device": torch.cuda.get_device_name(),
        })
        print(f"make_model.py: {opt_name} on {torch.cuda.get_device_name()}: {losses[0]:.4f}->{losses[-1]:.4f}")


def main(argv=None):
    a = parse_args(argv)
    if a.reference_device == "cuda":
        return cuda_references(a)
    # One thread: CPU reductions then give bit-identical losses on every re-run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    model = zoo.build(a.model, seed=a.seed, **a.sizes)
    names = list(model.input_names)
    data = make_data(a.model, model, a.samples, a.seed, a.ignored_labels)

    try:
        os.makedirs(os.path.join(a.out, "data"), exist_ok=True)
    except OSError as e:
        sys.exit(f"make_model.py: error: cannot create {a.out}: {e}")

    initial = copy.deepcopy(model.state_dict())
    if not a.no_legacy_onnx:
        with legacy_mask(model):
            export(model, batch(data, names, 0, a.batch_size), names, os.path.join(a.out, "model.onnx"), a.opset)
        model.load_state_dict(initial)  # paranoia: export must not have touched the weights
    if a.torch_export:
        export_torch_program(model, batch(data, names, 0, a.batch_size), names, os.path.join(a.out, "model.pt2"))
        model.load_state_dict(initial)
    if a.dynamo_onnx:
        export_dynamo(model, batch(data, names, 0, a.batch_size), names, os.path.join(a.out, "model_dynamo.onnx"))
        model.load_state_dict(initial)
    if a.torchscript:
        traced = torch.jit.trace(model, tuple(batch(data, names, 0, a.batch_size)), check_trace=False)
        # Tracing ran forward in training mode: BatchNorm statistics moved.
        # A traced module keeps non-persistent buffers (BERT's position_ids,
        # Llama's inv_freq) in its state_dict; tracing did not change them.
        missing, unexpected = traced.load_state_dict(initial, strict=False)
        nonpersistent = {nm for nm, _ in model.named_buffers()} - set(initial)
        if unexpected or set(missing) - nonpersistent:
            raise RuntimeError(f"traced state_dict differs: missing {missing}, unexpected {unexpected}")
        # rannc-plan needs forward's inputs: dtype and per-sample shape of each.
        inputs = {nm: {"dtype": str(data[nm].dtype), "shape": list(data[nm].shape[1:])} for nm in names}
        extra = {} if a.torchscript_bare else {"rannc_inputs.json": json.dumps(inputs)}
        traced.save(os.path.join(a.out, "model.pt"), _extra_files=extra)
        model.load_state_dict(initial)

    for nm in names:
        np.save(os.path.join(a.out, "data", nm + ".npy"), data[nm])

    summary = []
    for opt_name, lr, make_opt in (
        ("sgd", a.lr_sgd, lambda ps: torch.optim.SGD(ps, lr=a.lr_sgd)),
        ("adam", a.lr_adam, lambda ps: torch.optim.Adam(ps, lr=a.lr_adam)),
    ):
        losses = train_reference(model, data, names, a.steps, a.batch_size, make_opt,
                                 params_out=os.path.join(a.out, f"reference_{opt_name}_params.npz"),
                                 buffers_out=os.path.join(a.out, f"reference_{opt_name}_buffers.npz"))
        write_json(os.path.join(a.out, f"reference_{opt_name}.json"), {
            "model": a.model, "optimizer": opt_name, "lr": lr,
            "batch_size": a.batch_size, "steps": a.steps, "losses": losses,
        })
        if losses:
            summary.append(f"{opt_name} {losses[0]:.4f}->{losses[-1]:.4f}")

    # Mixed precision: PyTorch's own autocast training of the same model
    # (rannc-plan --precision bf16|fp16 trains under LibTorch's autocast too);
    # fp16 with torch.amp.GradScaler.
    for (opt_name, lr, make_opt), (prec, dtype) in itertools.product((
        ("sgd", a.lr_sgd, lambda ps: torch.optim.SGD(ps, lr=a.lr_sgd)),
        ("adam", a.lr_adam, lambda ps: torch.optim.Adam(ps, lr=a.lr_adam)),
    ), [(pr, {"bf16": torch.bfloat16, "fp16": torch.float16}[pr]) for pr in a.precisions.split(",") if pr]):
        try:
            losses = train_reference(model, data, names, a.steps, a.batch_size, make_opt, autocast=dtype)
        except RuntimeError as e:  # e.g. GPT's -1e9 attention mask does not fit fp16
            print(f"make_model: {a.model}: no {prec} reference: PyTorch itself fails: {e}", file=sys.stderr)
            continue
        write_json(os.path.join(a.out, f"reference_{opt_name}_{prec}.json"), {
            "model": a.model, "optimizer": opt_name, "lr": lr, "precision": prec,
            "batch_size": a.batch_size, "steps": a.steps, "losses": losses,
        })
        if prec == "fp16" and opt_name == "adam":
            # A loss scale far too large: GradScaler skips steps until it has
            # backed off enough (rannc-exec --loss-scale must skip the same).
            skipped = []
            losses = train_reference(model, data, names, a.steps, a.batch_size, make_opt, autocast=dtype,
                                     init_scale=2.0 ** 24, skipped=skipped)
            write_json(os.path.join(a.out, f"reference_{opt_name}_{prec}_overflow.json"), {
                "model": a.model, "optimizer": opt_name, "lr": lr, "precision": prec, "loss_scale": 2.0 ** 24,
                "skipped_steps": skipped, "batch_size": a.batch_size, "steps": a.steps, "losses": losses,
            })

    for vname, v in ({} if a.no_variants else VARIANTS).items():
        steps = variant_steps(v, a.steps, a.samples, a.batch_size)
        ref = train_variant(model, data, names, steps, a.batch_size, v)
        write_json(os.path.join(a.out, f"reference_{vname}.json"), {
            "model": a.model, "variant": vname, "optimizer": v["optimizer"], "lr": v["lr"],
            "batch_size": a.batch_size, "steps": steps, "exec_args": exec_args(v, steps),
            "clip_grad_norm": v.get("clip_grad_norm", 0), **ref,
        })

    nparams = sum(p.numel() for p in model.parameters())
    print(f"make_model: {a.model} opset {a.opset} params {nparams} samples {a.samples} "
          f"batch {a.batch_size} -> {a.out} ({', '.join(summary) or 'no steps'})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
