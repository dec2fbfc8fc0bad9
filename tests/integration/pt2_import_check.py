#!/usr/bin/env python3
"""What the .pt2 importer makes of torch.export's constructs (issue 26),
checked on `rannc-plan import`'s printed graph and audit, for small modules
exported with the defaults PyTorch's docs show:
  * a torch.no_grad() region (wrap_with_set_grad_enabled) is inlined and its
    results detached, so the weight used only inside it gets no gradient;
  * a disabled torch.autocast region is inlined; an enabled one is refused;
  * buffers, floating or integer, persistent or not, are buffers, never
    parameters; BatchNorm's num_batches_tracked is one;
  * a functionalized program (run_decompositions()) writes its buffer
    mutations back with aten::copy_;
  * op names carry the module path;
  * a non-finite float argument (a mask's -inf, which the archive's JSON
    holds as the string "-Infinity") is read as the number;
  * a planned program's plan passes `rannc-plan check` (it reads back);
  * ops that draw random numbers in training (dropout with p > 0) are a
    warning of the audit; dropout with p = 0 is not."""
import argparse
import os
import re
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)
        self.register_buffer("offset", torch.arange(4))

    def forward(self, x):
        with torch.no_grad():
            gate = torch.sigmoid(self.frozen(x)) * self.scale
        with torch.autocast("cpu", enabled=False):
            h = self.bn(self.inner(x))
        return h * gate + self.offset.to(h.dtype)


class Model(nn.Module):
    def __init__(self, autocast=False):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(4, 3)
        self.autocast = autocast

    def forward(self, x, y):
        if self.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.cross_entropy(self.head(self.block(x)).float(), y)
        return F.cross_entropy(self.head(self.block(x)), y)


class Masked(nn.Module):
    """Scores past the second column filled with -inf, as a causal mask fills them."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, y):
        s = self.lin(x)
        return F.cross_entropy(s.masked_fill(torch.arange(4) > 1, float("-inf")), y)


class Noisy(nn.Module):
    """Dropout as a module calls it in training, p > 0 or 0."""

    def __init__(self, p):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.p = p

    def forward(self, x, y):
        return F.cross_entropy(F.dropout(self.lin(x), p=self.p, training=self.training), y)


def export(model, path, decompose=False):
    batch = torch.export.Dim("batch", min=2)
    example = (torch.randn(4, 4), torch.randint(0, 3, (4,)))
    program = torch.export.export(model, example, dynamic_shapes={"x": {0: batch}, "y": {0: batch}}, strict=False)
    if decompose:
        program = program.run_decompositions()
    torch.export.save(program, path)


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, capture_output=True, timeout=300)


def expect(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}")


def declared(text, kind):
    return set(re.findall(rf"^{kind} %(\S+) :", text, re.M))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.manual_seed(0)

    path = os.path.join(a.work, "block.pt2")
    export(Model().train(), path)
    p = run([a.plan_tool, "import", path])
    expect(p.returncode == 0, f"the default export imports ({p.stderr.strip()[-300:]})")
    text = p.stdout
    params, buffers = declared(text, "param"), declared(text, "buffer")
    expect("block.frozen.weight" in params and "block.inner.weight" in params, "weights are parameters")
    for b in ("block.scale", "block.offset", "block.bn.running_mean", "block.bn.num_batches_tracked"):
        expect(b in buffers and b not in params, f"{b} is a buffer, not a parameter")
    # The no_grad region's results are detached; nothing outside it reads frozen.
    detached = re.findall(r"^  %(\S+):\S+ = aten\.aten::detach\(%(\S+)\)", text, re.M)
    expect(detached, "the no_grad region ends in aten::detach")
    expect(re.search(r"# block\.inner/linear", text) and re.search(r"# block\.bn/batch_norm", text),
           "op names carry the module path")
    expect("audit: fixed: no_grad region" in text, "the audit names the no_grad region")
    expect("wrap_with_autocast" not in text and "higher_order" not in text, "regions are inlined")
    expect("random numbers" not in text, "a model without random ops has no random-numbers warning")

    # Gradients stop at the region: what the frozen layer computes reaches
    # the rest of the graph only through a detach.
    nodes = [(re.findall(r"%([^:,\s]+):", outs), op, re.findall(r"%(\S+?)[,)]", ins), name)
             for outs, op, ins, name in re.findall(r"^  (.*?) = aten\.(\S+?)(\(.*?\)).*# (\S+)$", text, re.M)]
    tainted = {o for outs, _, _, name in nodes if name.startswith("block.frozen/") for o in outs}
    stops = 0
    for outs, op, ins, _ in nodes:  # in graph order
        if tainted & set(ins):
            if op == "aten::detach":
                stops += 1
            else:
                tainted |= set(outs)
    loss = re.search(r"^loss %(\S+)$", text, re.M).group(1)
    expect(stops > 0 and loss not in tainted, "the loss depends on the frozen layer only through a detach")

    plan = os.path.join(a.work, "block.pbtxt")
    p = run([a.plan_tool, path, "--gpus", "2", "--device-type", "cpu", "--batch-size", "8", "--microbatches", "2",
             "--stages", "2", "--replicas", "1", "-o", plan])
    expect(p.returncode == 0, f"it plans on 2 stages ({p.stderr.strip()[-300:]})")
    p = run([a.plan_tool, "check", plan, "--allow-model-outside-plan"])
    expect(p.returncode == 0, f"check accepts the plan rannc-plan wrote ({p.stdout.strip()[-300:]})")

    path = os.path.join(a.work, "functional.pt2")
    export(Model().train(), path, decompose=True)
    p = run([a.plan_tool, "import", path])
    expect(p.returncode == 0, f"a functionalized program imports ({p.stderr.strip()[-300:]})")
    for b in ("block.bn.running_mean", "block.bn.running_var", "block.bn.num_batches_tracked"):
        expect(re.search(rf"= aten\.aten::copy_\(%{re.escape(b)}, ", p.stdout), f"{b}'s mutation is written back")
    expect("audit: fixed: buffer mutation" in p.stdout, "the audit names the buffer mutations")

    path = os.path.join(a.work, "masked.pt2")
    export(Masked().train(), path)
    import zipfile
    with zipfile.ZipFile(path) as z:
        archived = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("models/model.json"))
    expect('"-Infinity"' in archived, "the archive holds the mask's -inf as a string")
    p = run([a.plan_tool, "import", path])
    expect(p.returncode == 0, f"a program with a -inf argument imports ({p.stderr.strip()[-300:]})")
    expect(re.search(r"masked_fill.*-inf", p.stdout), "masked_fill reads -inf")

    for p_drop, warned in ((0.1, True), (0.0, False)):
        path = os.path.join(a.work, f"noisy_{p_drop}.pt2")
        export(Noisy(p_drop).train(), path)
        p = run([a.plan_tool, "import", path])
        expect(p.returncode == 0, f"dropout {p_drop} imports ({p.stderr.strip()[-300:]})")
        found = re.search(r"audit: warning: random numbers \(1\):.*dropout", p.stdout) is not None
        expect(found == warned, f"dropout {p_drop}: the audit {'warns' if warned else 'does not warn'} of random "
               f"numbers ({[l for l in p.stdout.splitlines() if l.startswith('audit')]})")

    path = os.path.join(a.work, "autocast.pt2")
    export(Model(autocast=True).train(), path)
    p = run([a.plan_tool, "import", path])
    expect(p.returncode != 0 and "autocast" in p.stderr, f"an enabled autocast region is refused ({p.stderr.strip()})")
    print("pt2_import_check: all passed")


if __name__ == "__main__":
    main()
