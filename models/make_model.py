#!/usr/bin/python3
"""Export a test model to ONNX, write its training data and PyTorch reference losses.

Usage:
  /usr/bin/python3 models/make_model.py --model {mlp,bert,gpt} --out DIR
      [--batch-size 8] [--samples 64] [--steps 10] [--lr-sgd 0.1]
      [--lr-adam 0.001] [--opset 17] [--seed 0]
      [--layers L --hidden H --heads A --seq-len S --vocab V]   (bert, gpt)

Writes:
  DIR/model.onnx             graph whose single output "loss" is the scalar loss
  DIR/data/<input>.npy       one array per graph input, first dim = samples
  DIR/reference_sgd.json     losses of plain PyTorch training with SGD
  DIR/reference_adam.json    ... and with Adam

Reference step k uses samples (k*B + i) % N, i in [0, B), i.e. rannc-exec's
`--shuffle off` order, so rannc's logged losses can be compared one to one.
Must run with Debian's /usr/bin/python3 (torch 1.13, onnx 1.12).
"""

import argparse
import copy
import json
import os
import sys

try:
    import numpy as np
    import onnx
    import torch
except ImportError as e:  # the usual cause: a python3 without Debian's torch
    sys.exit(f"make_model.py: error: {e}; run it with /usr/bin/python3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

MIN_OPSET, MAX_OPSET = 13, 17  # the range rannc supports; 17 is also torch 1.13's newest


# --------------------------------------------------------------------------- data

def make_data(name, model, n, seed):
    """Learnable synthetic data, so the loss visibly falls within a few steps."""
    rng = np.random.RandomState(seed + 1234)  # independent of the weight seed's stream
    if name == "mlp":
        x = rng.standard_normal((n, model.in_features)).astype(np.float32)
        # Labels from a fixed random linear "teacher": a linearly separable task.
        teacher = rng.standard_normal((model.in_features, model.num_classes))
        y = np.argmax(x @ teacher, axis=1).astype(np.int64)
        return {"x": x, "y": y}

    vocab, seq = model.vocab, model.seq_len
    # Token 0 is reserved (BERT's [MASK]); rule: arithmetic progressions over
    # tokens 1..vocab-1 with a small stride, so the next token is predictable.
    start = rng.randint(0, vocab - 1, size=(n, 1))
    stride = rng.randint(1, 4, size=(n, 1))
    t = np.arange(seq + 1)[None, :]
    full = 1 + (start + stride * t) % (vocab - 1)
    if name == "bert":
        # Masked-LM flavour: 15% of inputs replaced by [MASK]; labels = clean tokens.
        tokens = full[:, :seq]
        mask = rng.random_sample(tokens.shape) < 0.15
        input_ids = np.where(mask, 0, tokens)
        labels = tokens
    else:  # gpt
        # 10% noise tokens; labels are the (noisy) sequence shifted by one, the
        # last label being the sequence's own continuation.
        noise = rng.random_sample(full.shape) < 0.10
        full = np.where(noise, rng.randint(1, vocab, size=full.shape), full)
        input_ids = full[:, :seq]
        labels = full[:, 1:]
    return {"input_ids": input_ids.astype(np.int64), "labels": labels.astype(np.int64)}


def batch(data, names, k, bsz):
    n = len(data[names[0]])
    idx = (k * bsz + np.arange(bsz)) % n
    return [torch.from_numpy(data[nm][idx]) for nm in names]


# --------------------------------------------------------------------------- export

def export(model, example, names, path, opset):
    tmp = path + ".tmp"
    torch.onnx.export(
        model, tuple(example), tmp,
        export_params=True,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        opset_version=opset,
        input_names=list(names),
        output_names=["loss"],
        dynamic_axes={nm: {0: "batch"} for nm in names},
    )
    m = onnx.load(tmp)
    onnx.checker.check_model(m)
    inits = [i.name for i in m.graph.initializer]
    params = [nm for nm, _ in model.named_parameters()]
    if sorted(inits) != sorted(params):
        raise RuntimeError(
            f"initializers {sorted(set(inits) ^ set(params))} differ from the parameters")
    if len(m.graph.output) != 1:
        raise RuntimeError(f"expected 1 graph output, got {len(m.graph.output)}")
    os.replace(tmp, path)  # never leave a half-written model.onnx behind


# --------------------------------------------------------------------------- reference

def train_reference(model, data, names, steps, bsz, make_opt):
    model = copy.deepcopy(model)  # every optimizer starts from the exported weights
    model.train()
    opt = make_opt(model.parameters())
    losses = []
    for k in range(steps):
        opt.zero_grad()
        loss = model(*batch(data, names, k, bsz))
        losses.append(float(loss.item()))  # loss of the forward before the update
        loss.backward()
        opt.step()
    return losses


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
    p.add_argument("--lr-sgd", type=float, default=0.1)
    p.add_argument("--lr-adam", type=float, default=0.001)
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torchscript", action="store_true",
                   help="also write DIR/model.pt, the same model traced with torch.jit (for benchmarks)")
    sizes = p.add_argument_group("transformer sizes (bert, gpt; defaults are the models' own)")
    for flag in ("--layers", "--hidden", "--heads", "--seq-len", "--vocab"):
        sizes.add_argument(flag, type=int)
    a = p.parse_args(argv)
    a.sizes = {k: v for k, v in (("layers", a.layers), ("hidden", a.hidden), ("heads", a.heads),
                                 ("seq_len", a.seq_len), ("vocab", a.vocab)) if v is not None}
    if a.sizes and a.model == "mlp":
        p.error("transformer size flags apply to bert and gpt only")
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
    return a


def main(argv=None):
    a = parse_args(argv)
    # One thread: CPU reductions then give bit-identical losses on every re-run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    model = zoo.build(a.model, seed=a.seed, **a.sizes)
    names = list(model.input_names)
    data = make_data(a.model, model, a.samples, a.seed)

    try:
        os.makedirs(os.path.join(a.out, "data"), exist_ok=True)
    except OSError as e:
        sys.exit(f"make_model.py: error: cannot create {a.out}: {e}")

    initial = copy.deepcopy(model.state_dict())
    export(model, batch(data, names, 0, a.batch_size), names,
           os.path.join(a.out, "model.onnx"), a.opset)
    model.load_state_dict(initial)  # paranoia: export must not have touched the weights
    if a.torchscript:
        traced = torch.jit.trace(model, tuple(batch(data, names, 0, a.batch_size)), check_trace=False)
        traced.save(os.path.join(a.out, "model.pt"))
        model.load_state_dict(initial)

    for nm in names:
        np.save(os.path.join(a.out, "data", nm + ".npy"), data[nm])

    summary = []
    for opt_name, lr, make_opt in (
        ("sgd", a.lr_sgd, lambda ps: torch.optim.SGD(ps, lr=a.lr_sgd)),
        ("adam", a.lr_adam, lambda ps: torch.optim.Adam(ps, lr=a.lr_adam)),
    ):
        losses = train_reference(model, data, names, a.steps, a.batch_size, make_opt)
        write_json(os.path.join(a.out, f"reference_{opt_name}.json"), {
            "model": a.model, "optimizer": opt_name, "lr": lr,
            "batch_size": a.batch_size, "steps": a.steps, "losses": losses,
        })
        if losses:
            summary.append(f"{opt_name} {losses[0]:.4f}->{losses[-1]:.4f}")

    nparams = sum(p.numel() for p in model.parameters())
    print(f"make_model: {a.model} opset {a.opset} params {nparams} samples {a.samples} "
          f"batch {a.batch_size} -> {a.out} ({', '.join(summary) or 'no steps'})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
