#!/usr/bin/env python3
"""A seeded fuzz corpus of every input kind rannc reads (issue 27,
docs/robustness.md): mutations of small fixtures, each run through the verbs
that read it, counting crashes (a signal), hangs (a time limit) and LibTorch
stack traces ("frame #") in any message; all three must be 0.

Fixtures: the mlp model (models/make_model.py --model mlp) as ONNX, its plan
in .pb, .pbtxt and .json (rannc-plan), docs/clusters/*.yaml, its x.npy, a
checkpoint of 2 steps (rannc-exec), and a tiny torch.export program (.pt2).
Mutations: byte flips, truncation, insertion and deletion of byte runs; on
the structured forms also edits of fields to extreme, negative, wrong-typed,
non-UTF-8 and path-escaping values; and the special files of the fault trial
(a FIFO, /dev/zero, a folder) in place of each file.

Most inputs go through tests/integration/fuzz_driver (the verbs' library
functions in process, a fork per input: cheap); a sample of each kind, and
every .pt2, goes through the command-line tools themselves (rannc-plan, its
check verb, rannc-exec export) in parallel, each under --timeout.

  .venv/bin/python tests/integration/fuzz_inputs.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --driver build/tests/fuzz_driver --models build/models \\
      --work /tmp/fuzz --seed 1 --inputs 1000
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import time

CLUSTERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "clusters")


def run(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return p.returncode, (p.stdout + p.stderr).decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return "hang", ""


def ok(cmd, what):
    code, out = run(cmd, 300)
    if code != 0:
        sys.exit(f"fuzz_inputs: {what} failed ({code}):\n{out[-3000:]}")


# ---- mutations -------------------------------------------------------------

def mutate_bytes(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if not data:
            break
        i = rng.randrange(len(data))
        if op < 0.45:
            data[i] ^= 1 << rng.randrange(8)
        elif op < 0.6:
            data[i] = rng.choice([0, 0xff, 0x7f, 0x80])
        elif op < 0.75:
            del data[i:i + rng.randint(1, 64)]
        elif op < 0.9:
            data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            del data[rng.randrange(len(data)):]
    return bytes(data)


EXTREMES = [0, -1, 1, 2**31, -2**31, 2**62, 2**63 - 1, -2**63, 1e308, -1e308, 3.5, "", "x", None, [], {},
            "../../../../etc/passwd", "/dev/zero", "\udcff\udcfe", "a" * 5000, True]


def mutate_json(rng, obj):
    """Replaces, deletes or duplicates a random leaf or subtree."""
    obj = json.loads(json.dumps(obj))
    paths = []

    def walk(o, path):
        paths.append(path)
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, path + [k])
        elif isinstance(o, list):
            for i, v in enumerate(o[:50]):
                walk(v, path + [i])

    walk(obj, [])
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths[1:]) if len(paths) > 1 else []
        if not path:
            continue
        parent = obj
        try:
            for k in path[:-1]:
                parent = parent[k]
            key = path[-1]
            op = rng.random()
            if op < 0.6:
                parent[key] = rng.choice(EXTREMES)
            elif op < 0.8 and isinstance(parent, dict):
                del parent[key]
            elif isinstance(parent, list):
                parent.append(parent[key])
            else:
                parent[key] = rng.choice(EXTREMES)
        except (KeyError, IndexError, TypeError):
            pass
    return obj


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogateescape")


def mutate_text(rng, data):
    lines = data.decode("utf-8", "replace").splitlines()
    for _ in range(rng.randint(1, 3)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.random()
        if op < 0.3:
            del lines[i]
        elif op < 0.6:
            words = lines[i].split(" ")
            j = rng.randrange(len(words))
            words[j] = str(rng.choice([v for v in EXTREMES if isinstance(v, (int, float, str))]))
            lines[i] = " ".join(words)
        elif op < 0.8:
            lines.insert(i, lines[rng.randrange(len(lines))])
        else:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def special(path, kind):
    """Puts a FIFO, /dev/zero (a symlink to it) or a folder where `path` was."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    else:
        os.mkdir(path)


# ---- fixtures --------------------------------------------------------------

def fixtures(args, work):
    fx = os.path.join(work, "fixtures")
    shutil.rmtree(fx, ignore_errors=True)
    os.makedirs(fx)
    model = os.path.join(fx, "model.onnx")
    shutil.copy(os.path.join(args.models, "mlp", "model.onnx"), model)
    shutil.copytree(os.path.join(args.models, "mlp", "data"), os.path.join(fx, "data"))
    for ext in ("json", "pbtxt", "pb"):
        ok([args.plan_tool, model, "--gpus", "2", "--device-type", "cpu", "--batch-size", "8", "--profile", "analytic",
            "--stages", "2", "--replicas", "1", "-o", os.path.join(fx, f"plan.{ext}")], f"rannc-plan -o plan.{ext}")
    ck = os.path.join(fx, "ck")
    ok([args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", args.exec_tool, os.path.join(fx, "plan.json"),
        "--allow-model-outside-plan",
        "--data", os.path.join(fx, "data"), "--steps", "2", "--optimizer", "adam", "--checkpoint-dir", ck],
       "a 2-step run with a checkpoint")
    pt2 = os.path.join(fx, "model.pt2")
    ok([args.python, "-c", PT2_SCRIPT, pt2], "torch.export of a tiny model")
    return fx


PT2_SCRIPT = """
import sys, torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x):
        return (self.fc(x) ** 2).mean()
torch.export.save(torch.export.export(M(), (torch.randn(2, 4),)), sys.argv[1])
"""


def corpus(rng, fx, work, n):
    """Writes the mutated inputs; returns [(kind, path)]."""
    out = []
    root = os.path.join(work, "corpus")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    model = open(os.path.join(fx, "model.onnx"), "rb").read()
    npy = open(os.path.join(fx, "data", sorted(os.listdir(os.path.join(fx, "data")))[0]), "rb").read()
    plans = {ext: open(os.path.join(fx, f"plan.{ext}"), "rb").read() for ext in ("json", "pbtxt", "pb")}
    plan_json = json.loads(plans["json"])
    clusters = [open(os.path.join(CLUSTERS, f), "rb").read() for f in sorted(os.listdir(CLUSTERS))]
    step = os.path.join(fx, "ck", "step-2")
    manifest = json.load(open(os.path.join(step, "manifest.json")))
    shares = [("onnx", 0.2), ("plan.json", 0.12), ("plan.pbtxt", 0.1), ("plan.pb", 0.08), ("cluster", 0.15),
              ("npy", 0.15), ("checkpoint", 0.2)]
    specials = ["fifo", "zero", "dir"]
    for kind, share in shares:
        for i in range(max(3, int(n * share))):
            name = os.path.join(root, f"{kind.replace('.', '-')}-{i}")
            sp = specials[i] if i < 3 else None  # the fault trial's files, first
            if kind == "onnx":
                path = name + ".onnx"
                if sp:
                    special(path, sp)
                else:
                    open(path, "wb").write(mutate_bytes(rng, model))
                out.append(("onnx", path))
            elif kind.startswith("plan"):
                ext = kind.split(".")[1]
                path = f"{name}.{ext}"
                if sp:
                    special(path, sp)
                elif ext == "json":
                    data = dumps(mutate_json(rng, plan_json)) if rng.random() < 0.7 else mutate_bytes(rng, plans[ext])
                    open(path, "wb").write(data)
                elif ext == "pbtxt":
                    open(path, "wb").write(mutate_text(rng, plans[ext]))
                else:
                    open(path, "wb").write(mutate_bytes(rng, plans[ext]))
                out.append(("plan", path))
            elif kind == "cluster":
                path = name + ".yaml"
                if sp:
                    special(path, sp)
                else:
                    base = rng.choice(clusters)
                    open(path, "wb").write(mutate_text(rng, base) if rng.random() < 0.7 else mutate_bytes(rng, base))
                out.append(("cluster", path))
            elif kind == "npy":
                path = name + ".npy"
                if sp:
                    special(path, sp)
                elif rng.random() < 0.5:  # the header, where the sizes are
                    header_end = npy.index(b"\n") + 1
                    open(path, "wb").write(mutate_text(rng, npy[:header_end]).rstrip(b"\n") + b"\n" + npy[header_end:])
                else:
                    open(path, "wb").write(mutate_bytes(rng, npy))
                out.append(("npy", path))
            else:
                d = name + "-step-2"
                shutil.copytree(step, d, symlinks=True)
                files = sorted(os.listdir(d))
                target = os.path.join(d, rng.choice(files))
                if sp:
                    special(target, sp)
                elif target.endswith("manifest.json") or rng.random() < 0.3:
                    target = os.path.join(d, "manifest.json")
                    m = mutate_json(rng, manifest)
                    open(target, "wb").write(dumps(m))
                else:
                    open(target, "wb").write(mutate_bytes(rng, open(target, "rb").read()))
                out.append(("checkpoint", d))
    return out


def cli_cmds(args, fx, kind, path, work):
    """The command-line verbs that read an input of `kind`."""
    out = os.path.join(work, "cli-out")
    if kind == "onnx" or kind == "pt2":
        return [[args.plan_tool, path, "--gpus", "2", "--device-type", "cpu", "--batch-size", "8", "--profile",
                 "analytic", "-o", out + ".json"]]
    if kind == "plan":
        return [[args.plan_tool, "check", path], [args.plan_tool, "show", path]]
    if kind == "cluster":
        return [[args.plan_tool, os.path.join(fx, "model.onnx"), "--cluster", path, "--batch-size", "8", "--profile",
                 "analytic", "-o", out + ".json"]]
    if kind == "checkpoint":
        return [[args.exec_tool, "export", path, "--model", os.path.join(fx, "model.onnx"), "-o", out + ".onnx"]]
    return []  # npy: the driver reads it as rannc-exec does


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--inputs", type=int, default=1000, help="mutated inputs through the driver")
    ap.add_argument("--cli-per-kind", type=int, default=2, help="of them, through the command-line tools")
    ap.add_argument("--pt2", type=int, default=4, help="mutated .pt2 programs (command line only)")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per input before it counts as a hang")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    t0 = time.time()
    rng = random.Random(args.seed)
    os.makedirs(args.work, exist_ok=True)
    fx = fixtures(args, args.work)
    inputs = corpus(rng, fx, args.work, args.inputs)

    # In process: the list split over --jobs drivers.
    lists = []
    for j in range(args.jobs):
        path = os.path.join(args.work, f"list-{j}.txt")
        with open(path, "w") as f:
            for kind, p in inputs[j::args.jobs]:
                f.write(f"{kind} {p}\n")
        lists.append(path)
    procs = [subprocess.Popen([args.driver, l, os.path.join(fx, "model.onnx"), str(args.timeout)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, errors="replace") for l in lists]
    bad = []
    counts = {"crashes": 0, "hangs": 0, "traces": 0}
    for p in procs:
        out, _ = p.communicate()
        for line in out.splitlines():
            if line.startswith(("CRASH", "HANG", "TRACE")):
                bad.append(line)
                counts[{"C": "crashes", "H": "hangs", "T": "traces"}[line[0]]] += 1
            if line.startswith("fuzz_driver:"):
                print(line, flush=True)

    # The command line: a sample of each kind, and the .pt2 mutants.
    pt2 = open(os.path.join(fx, "model.pt2"), "rb").read()
    cli = []
    by_kind = {}
    for kind, p in inputs:
        by_kind.setdefault(kind, []).append(p)
    for kind, paths in sorted(by_kind.items()):
        for p in paths[:3] + rng.sample(paths[3:], min(args.cli_per_kind, len(paths) - 3)):
            cli += [(kind, p, c) for c in cli_cmds(args, fx, kind, p, os.path.join(args.work, f"o{len(cli)}"))]
    for i in range(args.pt2):
        p = os.path.join(args.work, "corpus", f"pt2-{i}.pt2")
        open(p, "wb").write(mutate_bytes(rng, pt2))
        cli += [("pt2", p, c) for c in cli_cmds(args, fx, "pt2", p, os.path.join(args.work, f"p{i}"))]

    def one(item):
        kind, p, cmd = item
        code, out = run(cmd, args.timeout)
        if code == "hang":
            return "HANG", item
        if code < 0:
            return f"CRASH (signal {-code})", item
        if "frame #" in out or "terminate called" in out:
            return "TRACE", item
        return None, item

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for verdict, (kind, p, cmd) in pool.map(one, cli):
            if verdict:
                bad.append(f"{verdict} {' '.join(cmd)}")
                counts[{"C": "crashes", "H": "hangs", "T": "traces"}[verdict[0]]] += 1
    total = len(inputs) + args.pt2
    print(f"fuzz_inputs: seed {args.seed}: {total} mutated inputs ({len(inputs)} in process, {len(cli)} command-line "
          f"runs incl. {args.pt2} .pt2): {counts['crashes']} crashes, {counts['hangs']} hangs, "
          f"{counts['traces']} stack traces, in {time.time() - t0:.0f} s")
    for line in bad[:40]:
        print(line)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
