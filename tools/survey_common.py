"""What tools/hf_survey.py and tools/torchvision_survey.py share: PyTorch's own
SGD run of a model (the reference), the two default exports, and rannc's
plan-and-train of an exported file against that reference.

The exports are what PyTorch's documentation shows, with the defaults:
  onnx  torch.onnx.export(model, args, path, dynamic_shapes=...) (the dynamo
        exporter, optimize=True);
  pt2   torch.export.export(model, args, dynamic_shapes=..., strict=False),
        then torch.export.save.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np

FORMATS = ("onnx", "pt2")
EXT = {"onnx": ".onnx", "pt2": ".pt2"}


def first_line(text):
    """The line of a tool's stderr that says what went wrong (the last one naming an error)."""
    lines = [l for l in text.strip().splitlines() if l.strip()]
    for l in reversed(lines):
        if "rror" in l or "refus" in l:
            return l.strip()[:200]
    return (lines[-1].strip()[:200]) if lines else ""


def batch(data, names, k, bsz):
    """Batch k of `bsz` samples in rannc-exec's --shuffle off order (SPEC)."""
    import torch
    n = len(data[names[0]])
    idx = (k * bsz + np.arange(bsz)) % n
    return [torch.from_numpy(data[nm][idx]) for nm in names]


def train_reference(model, data, names, steps, bsz, lr):
    """PyTorch's own SGD losses over `steps` batches (one thread: repeatable)."""
    import torch
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for k in range(steps):
        opt.zero_grad()
        loss = model(*batch(data, names, k, bsz))
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def export(model, example, names, fmt, path, seq=None):
    """The default export of `model` in format `fmt`, the batch dimension
    dynamic, and with `seq` = (min, max) the sequence (dimension 1) too, as
    Hugging Face exports a token model (models/make_model.py's
    dynamic_shapes declares the same)."""
    import torch
    batch_dim = torch.export.Dim("batch")
    shapes = {nm: {0: batch_dim} for nm in names}
    if seq:
        seq_dim = torch.export.Dim("seq", min=seq[0], max=seq[1])
        shapes = {nm: {0: batch_dim, 1: seq_dim} for nm in names}
    if fmt == "onnx":
        torch.onnx.export(model, tuple(example), path, dynamic_shapes=shapes)
    else:
        program = torch.export.export(model, tuple(example), dynamic_shapes=shapes, strict=False)
        torch.export.save(program, path)


def export_all(model, initial, example, names, folder, seq=None):
    """Both default exports of `model` from the weights `initial` into folder/model.*
    (export's dynamic dimensions): {format: "ok" or the exporter's refusal}."""
    exported = {}
    for fmt in FORMATS:
        model.load_state_dict(initial)
        try:
            export(model, example, names, fmt, os.path.join(folder, "model" + EXT[fmt]), seq)
            exported[fmt] = "ok"
        except Exception as e:  # the exporter's own refusal is a result
            exported[fmt] = f"export: {type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0][:160]
    return exported


def save_case(folder, data, names, losses, lr, bsz, exported):
    """Writes the data (one .npy per input) and reference.json into `folder`."""
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    for nm in names:
        np.save(os.path.join(folder, "data", nm + ".npy"), data[nm])
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"losses": losses, "lr": lr, "batch_size": bsz, "exported": exported}, f)


def _run(cmd, timeout):
    """The finished process, or None when it ran past `timeout` seconds."""
    try:
        return subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def rannc_train(build, folder, fmt, stages=2, microbatches=2, plan_args=(), mpirun="mpirun", timeout=600, replicas=1,
                tolerance=1e-4):
    """Plans folder/model.<fmt> on `stages` x `replicas` CPU ranks in
    `microbatches` micro-batches (None: the planner chooses), trains it as the
    reference did and compares the losses (exact: every step's relative
    difference within `tolerance`). Returns {plan_ok, max_loss_diff, reason}."""
    ref = json.load(open(os.path.join(folder, "reference.json")))
    model = os.path.join(folder, "model" + EXT[fmt])
    plan = os.path.join(folder, f"plan_{fmt}.pb")
    row = {"plan_ok": False, "max_loss_diff": None, "reason": ""}
    ranks = stages * replicas
    pinned = ["--microbatches", str(microbatches)] if microbatches else []
    p = _run([os.path.join(build, "tools", "rannc-plan"), model, "--gpus", str(ranks), "--device-type", "cpu",
              "--stages", str(stages), "--replicas", str(replicas)] + pinned +
             ["--batch-size", str(ref["batch_size"]), "--profile", "analytic", "-o", plan] + list(plan_args), timeout)
    if p is None or p.returncode != 0:
        row["reason"] = "plan timed out" if p is None else "plan: " + first_line(p.stderr)
        return row
    row["plan_ok"] = True
    # Note [random ops in training] (planner/import/model_format.cpp): such a model cannot match step for step.
    random_ops = re.search(r"warning: random numbers \((\d+)\)", p.stderr)
    log = os.path.join(folder, f"log_{fmt}.jsonl")
    steps = len(ref["losses"])
    p = _run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
              os.path.join(build, "tools", "rannc-exec"), plan, "--data", os.path.join(folder, "data"),
              "--shuffle", "off", "--steps", str(steps), "--optimizer", "sgd", "--lr", repr(ref["lr"]), "--log", log],
             timeout)
    if p is None or p.returncode != 0:
        row["reason"] = "training timed out" if p is None else "train: " + first_line(p.stderr)
        return row
    got = [json.loads(l)["loss"] for l in open(log) if l.strip()]
    if len(got) != steps:
        row["reason"] = f"train: logged {len(got)} of {steps} steps"
        return row
    diffs = [abs(g - w) / max(abs(w), 1e-12) if g is not None else float("inf") for g, w in zip(got, ref["losses"])]
    row["max_loss_diff"] = max(diffs)
    if not row["max_loss_diff"] <= tolerance:
        worst = max(range(steps), key=lambda i: diffs[i])
        row["reason"] = f"loss off from step {next(i for i in range(steps) if not diffs[i] <= tolerance)} " \
                        f"(worst step {worst}: {got[worst]:.6g} vs PyTorch {ref['losses'][worst]:.6g})"
        if random_ops:
            row["reason"] += f"; the model draws random numbers in training ({random_ops.group(1)} ops, the " \
                             "import audit's warning)"
    return row


def case_rows(key, name, folder, child_cmd, build, mpirun="mpirun", timeout=600, rows_file=None, **layout):
    """Runs `child_cmd` (the reference run and the exports into `folder`), then
    plans and trains each exported format (rannc_train, `layout` its keyword
    arguments): one row per format, printed to stderr as it comes and, with
    `rows_file`, appended to it (RowsFile)."""
    p = _run(child_cmd, timeout)
    failed = None if p is not None and p.returncode == 0 else \
        "reference run or export timed out" if p is None else "PyTorch run: " + first_line(p.stderr)
    rows = []
    for fmt in FORMATS:
        row = {key: name, "format": fmt}
        exported = None if failed else json.load(open(os.path.join(folder, "reference.json")))["exported"][fmt]
        if failed or exported != "ok":
            row.update(plan_ok=False, reason=failed or exported)
        else:
            row.update(rannc_train(build, folder, fmt, mpirun=mpirun, timeout=timeout, **layout))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if rows_file:
            rows_file.append(row)
    return rows


class RowsFile:
    """A survey's rows kept in a JSON-lines file, so that a run of hours can be
    stopped and resumed (`--rows FILE`): each row is appended as it comes,
    stamped with the checkout's commit (build it before running) and the
    date, and a model with rows in the file is not run again. Delete its
    lines to re-run it."""

    def __init__(self, path, key):
        self.path, self.key = path, key
        self.rows = []
        if path and os.path.exists(path):
            self.rows = [json.loads(l) for l in open(path) if l.strip()]
        self.done = {r[key] for r in self.rows}
        self.stamp = {"rannc": _commit(), "date": _today()}

    def append(self, row):
        row = dict(row, **self.stamp)
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def ordered(self, names):
        """The file's rows of `names`, in their order."""
        rank = {n: i for i, n in enumerate(names)}
        return sorted((r for r in self.rows if r[self.key] in rank), key=lambda r: rank[r[self.key]])


def _commit():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], text=True, capture_output=True)
    return p.stdout.strip() or "unknown"


def _today():
    import datetime
    return datetime.date.today().isoformat()


def print_table(rows, key, count, noun, steps, layout="2 stages, 2 micro-batches", tolerance=1e-4):
    """The Markdown table and the coverage line: the rows cover some of `count` `noun`."""
    print(f"| {key} | format | plan ok | max loss diff | reason for a failure |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[key]} | {r['format']} | {'yes' if r['plan_ok'] else 'no'} | {cell(r)} | {r['reason']} |")
    exact = {f: sum(r["format"] == f and not r["reason"] for r in rows) for f in FORMATS}
    covered = len({r[key] for r in rows})
    of = f"{covered} of {count} {noun}" if covered != count else f"{count} {noun}"
    commits = sorted({r["rannc"] for r in rows if "rannc" in r})
    measured = f"; rannc {', '.join(commits)}" if commits else ""
    print(f"\n{of}: {exact['onnx']} train exactly from ONNX, {exact['pt2']} from .pt2 "
          f"({layout}, {steps} steps, rel {tolerance:.0e}{measured})".replace("e-0", "e-"))
    kinds = {}
    for r in rows:
        if r["reason"]:
            kinds.setdefault(failure_kind(r["reason"]), []).append(r)
    if kinds:
        print("failures: " + "; ".join(f"{k} {len(v)} file{'s' if len(v) != 1 else ''} "
                                       f"({len({r[key] for r in v})} of the {noun})"
                                       for k, v in sorted(kinds.items(), key=lambda kv: -len(kv[1]))))


def failure_kind(reason):
    """A failure's kind, for the coverage line's counts."""
    if reason.startswith("export:"):
        return "the exporter's own"
    if reason.startswith("PyTorch run:"):
        return "the harness's small config"
    if "timed out" in reason:
        return "timed out"
    if "BatchNorm fused into its convolution" in reason or "training-mode BatchNorm" in reason:
        return "training BatchNorm folded by the exporter"  # Note [fused training BatchNorm]
    if "torch.onnx.export's optimizer" in reason:  # Note [export signature]: what it folded, refused
        return "folded parameters"
    if reason.startswith("loss off"):
        return "loss off"
    return "refused by rannc" if reason.startswith(("plan:", "train:")) else "other"


def cell(row):
    """The table's 'max loss diff' cell."""
    d = row.get("max_loss_diff")
    return "" if d is None else f"{d:.1e}"


def expect_exact(rows, key, formats, tool):
    """Exits 1 unless every row of `formats` (comma-separated: onnx, pt2) trained exactly (a ctest's assertion)."""
    want = set(filter(None, formats.split(",")))
    bad = [r for r in rows if r["format"] in want and (r["reason"] or r.get("max_loss_diff") is None)]
    if bad:
        sys.exit(f"{tool}: not exact: " + "; ".join(f"{r[key]} {r['format']}: {r['reason']}" for r in bad))
