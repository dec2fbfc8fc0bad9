#!/usr/bin/env python3
"""Hostile inputs and faults (issue 27, docs/robustness.md): one --case per
failure a fault trial found, each now an error of one line, never a hang, a
signal, a read outside the model's folder or a silently changed run.

  fifo         a FIFO as --data's x.npy and as ONNX external data
  devzero      /dev/zero as a plan's model.path, as a checkpoint file and manifest
  directory    a folder where x.npy should be
  position     a checkpoint manifest with a huge samples_consumed (--shuffle on)
  truncated    the data file truncated during training
  overwritten  the data file rewritten during training, and a resume on other data
  escape       external data at ../../../../etc/passwd, and through a symlink
  outside      a plan whose model.path names a file outside (/etc/passwd), or a model outside the plan's folder
  plan-data-fifo  a FIFO as rannc-plan --data's x.npy and as --data itself (a TorchScript archive)
  full-disk    --log on a full disk (/dev/full)
  sigterm      SIGTERM mid-run: the step finishes, a checkpoint is written, exit non-zero
  tmp          a checkpoint write that fails (a file size limit) leaves no step-N.tmp
  utf8         a model whose names are not UTF-8: the written plan reads back, or is refused
  loss         a plan whose graph.loss is not a scalar
  optim-shape  optimizer state of the wrong shape in a checkpoint
  huge         huge dimensions and a huge batch: one line, no LibTorch trace

Uses the mlp fixture (models/make_model.py --model mlp), on one rank."""
import argparse
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time

TIMEOUT = 60  # a hang is a failure, not a wait


def run(cmd, timeout=TIMEOUT, **kw):
    print("+", " ".join(cmd), flush=True)
    try:
        return subprocess.run(cmd, text=True, capture_output=True, timeout=timeout, errors="replace", **kw)
    except subprocess.TimeoutExpired:
        sys.exit(f"HANG: {' '.join(cmd)} ran past {timeout} s")


def expect_error(p, needle, what):
    """Exit non-zero without a signal, `needle` in the message, no LibTorch trace."""
    out = p.stdout + p.stderr
    if p.returncode == 0:
        sys.exit(f"{what}: exit 0, expected an error\n{out[-3000:]}")
    if p.returncode < 0 or "signal" in out.lower() and "stopped by signal" not in out:
        sys.exit(f"{what}: killed by a signal (exit {p.returncode})\n{out[-3000:]}")
    if "frame #" in out:
        sys.exit(f"{what}: a LibTorch stack trace reached the user\n{out[-3000:]}")
    if needle not in out:
        sys.exit(f"{what}: expected '{needle}' in the message\n{out[-3000:]}")
    print(f"ok: {what}: {[l for l in out.splitlines() if needle in l][0].strip()}", flush=True)


def ok(p, what):
    if p.returncode != 0:
        sys.exit(f"{what} failed (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    return p


class Env:
    def __init__(self, args, case):
        self.args = args
        self.dir = os.path.join(args.work, case)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.copytree(os.path.join(args.models, "mlp"), os.path.join(self.dir, "m"),
                        ignore=shutil.ignore_patterns("reference_*"))
        self.model = os.path.join(self.dir, "m", "model.onnx")
        self.data = os.path.join(self.dir, "m", "data")
        self.plan_path = os.path.join(self.dir, "plan.json")

    def plan(self, model=None, out=None, extra=()):
        out = out or self.plan_path
        return run([self.args.plan_tool, model or self.model, "--gpus", "1", "--device-type", "cpu", "--batch-size",
                    "8", "--profile", "analytic", "-o", out] + list(extra))

    def exec_cmd(self, plan=None, extra=()):
        return [self.args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "1", self.args.exec_tool,
                plan or self.plan_path, "--data", self.data] + list(extra)

    def train(self, extra=(), plan=None, **kw):
        return run(self.exec_cmd(plan, extra), **kw)

    def edit_plan(self, edit, out):
        j = json.load(open(self.plan_path))
        edit(j)
        json.dump(j, open(out, "w"))
        return out


def rank_pids(exec_tool, plan):
    out = subprocess.run(["pgrep", "-f", f"^{exec_tool} {plan}"], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def long_run(env, extra, act, wait_log_lines=3):
    """Starts a long run with --log, waits until it logged a few steps, calls act(), returns the result."""
    log = os.path.join(env.dir, "run.jsonl")
    p = subprocess.Popen(env.exec_cmd(extra=["--steps", "100000000", "--log", log] + list(extra)), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, errors="replace")
    t0 = time.time()
    while time.time() - t0 < TIMEOUT:
        if os.path.exists(log) and sum(1 for _ in open(log)) >= wait_log_lines:
            break
        if p.poll() is not None:
            sys.exit(f"the run ended early:\n{p.stderr.read()[-3000:]}")
        time.sleep(0.1)
    act()
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        sys.exit("HANG: the run did not stop")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def npy_bytes(path):
    return open(path, "rb").read()


def data_replaced(env, make, needle, what):
    """x.npy replaced by what make(path) puts there: the run must refuse it at once."""
    ok(env.plan(), "rannc-plan")
    x = os.path.join(env.data, "x.npy")
    os.remove(x)
    make(x)
    expect_error(env.train(["--steps", "1"]), needle, what)


def case_fifo(env):
    data_replaced(env, os.mkfifo, "a FIFO, not a regular file", "a FIFO as --data's x.npy")
    # External data that is a FIFO: the model's weights moved out, the file replaced.
    ext = external_model(env, "w.bin")
    os.remove(os.path.join(env.dir, "m", "w.bin"))
    os.mkfifo(os.path.join(env.dir, "m", "w.bin"))
    expect_error(env.plan(ext, os.path.join(env.dir, "ext.json")), "a FIFO, not a regular file",
                 "a FIFO as external data (rannc-plan)")


def case_devzero(env):
    ok(env.plan(), "rannc-plan")
    zero = env.edit_plan(lambda j: j["model"].update(path="/dev/zero"), os.path.join(env.dir, "zero.json"))
    expect_error(run([env.args.plan_tool, "check", zero]), "does not name a model file", "model.path /dev/zero (check)")
    expect_error(env.train(["--steps", "1"], plan=zero), "does not name a model file", "model.path /dev/zero (exec)")
    link = os.path.join(env.dir, "zero.onnx")
    os.symlink("/dev/zero", link)
    lz = env.edit_plan(lambda j: j["model"].update(path=link), os.path.join(env.dir, "zlink.json"))
    expect_error(run([env.args.plan_tool, "check", lz]), "not a model file", "model.path a symlink to /dev/zero")
    # /dev/zero as a checkpoint's files, for --resume and export.
    ck = os.path.join(env.dir, "ck")
    ok(env.train(["--steps", "2", "--checkpoint-dir", ck, "--optimizer", "adam"]), "a run with a checkpoint")
    step = os.path.join(ck, "step-2")
    optim = os.path.join(step, "stage-0.optim.safetensors")
    os.remove(optim)
    os.symlink("/dev/zero", optim)
    expect_error(env.train(["--steps", "3", "--checkpoint-dir", ck, "--resume", "--optimizer", "adam"]),
                 "not a regular file", "/dev/zero as stage-0.optim.safetensors (--resume)")
    manifest = os.path.join(step, "manifest.json")
    os.remove(manifest)
    os.symlink("/dev/zero", manifest)
    expect_error(run([env.args.exec_tool, "export", step, "-o", os.path.join(env.dir, "out.onnx")]),
                 "not a regular file", "/dev/zero as manifest.json (export)")
    os.remove(manifest)
    os.mkfifo(manifest)
    expect_error(env.train(["--steps", "3", "--checkpoint-dir", ck, "--resume", "--optimizer", "adam"]),
                 "a FIFO, not a regular file", "a FIFO as manifest.json (--resume)")


def case_directory(env):
    data_replaced(env, os.mkdir, "is a folder, not a regular file", "a folder as x.npy")


def case_position(env):
    ok(env.plan(), "rannc-plan")
    ck = os.path.join(env.dir, "ck")
    ok(env.train(["--steps", "2", "--checkpoint-dir", ck, "--shuffle", "on"]), "a run with a checkpoint")
    path = os.path.join(ck, "step-2", "manifest.json")
    m = json.load(open(path))
    m["samples_consumed"] = 2**62
    m["epoch"] = m["samples_consumed"] // m["dataset_samples"]
    json.dump(m, open(path, "w"))
    expect_error(env.train(["--steps", "3", "--checkpoint-dir", ck, "--resume", "--shuffle", "on"]),
                 "implausible", "a huge samples_consumed (--shuffle on)")


def case_truncated(env):
    ok(env.plan(), "rannc-plan")
    x = os.path.join(env.data, "x.npy")
    p = long_run(env, [], lambda: os.truncate(x, 200))
    expect_error(p, x, "x.npy truncated during training")


def case_overwritten(env):
    ok(env.plan(), "rannc-plan")
    x = os.path.join(env.data, "x.npy")
    data = bytearray(npy_bytes(x))

    def rewrite():
        time.sleep(0.05)  # a later modification time than the opening's, on coarse clocks too
        changed = bytearray(data)
        changed[-1] ^= 0x40
        with open(x, "r+b") as f:  # in place: same file, same size
            f.write(changed)

    expect_error(long_run(env, [], rewrite), "was modified while in use", "x.npy overwritten during training")
    # A resume checks the data is the data the checkpoint was trained on.
    open(x, "wb").write(data)
    ck = os.path.join(env.dir, "ck")
    ok(env.train(["--steps", "2", "--checkpoint-dir", ck]), "a run with a checkpoint")
    changed = bytearray(data)
    changed[-1] ^= 0x40
    open(x, "wb").write(changed)
    expect_error(env.train(["--steps", "3", "--checkpoint-dir", ck, "--resume"]), "checkpoint was trained on other data",
                 "a resume on other data")
    ok(env.train(["--steps", "3", "--checkpoint-dir", ck, "--resume", "--resume-other-data"]),
       "a resume on other data with --resume-other-data")


def external_model(env, location):
    """The model with its weights in w.bin, its locations then edited to `location` in the bytes only:
    onnx.save writes external data to the locations it names, never let it see a hostile one."""
    import onnx
    m = onnx.load(env.model)
    onnx.external_data_helper.convert_model_to_external_data(m, all_tensors_to_one_file=True, location="w.bin",
                                                             size_threshold=0)
    path = os.path.join(env.dir, "m", "evil.onnx")
    onnx.save(m, os.path.join(env.dir, "m", "ext.onnx"))
    m = onnx.load(os.path.join(env.dir, "m", "ext.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for kv in t.external_data:
            if kv.key == "location":
                kv.value = location
    open(path, "wb").write(m.SerializeToString())
    return path


def case_escape(env):
    evil = external_model(env, "../../../../../../../../etc/passwd")
    expect_error(env.plan(evil, os.path.join(env.dir, "evil.json")), "leaves", "external data at ../../etc/passwd")
    os.symlink("/etc", os.path.join(env.dir, "m", "etc"))
    evil = external_model(env, "etc/passwd")
    expect_error(env.plan(evil, os.path.join(env.dir, "evil2.json")), "through a symlink",
                 "external data through a symlink out of the folder")
    evil = external_model(env, "/etc/passwd")
    expect_error(env.plan(evil, os.path.join(env.dir, "evil3.json")), "must be relative", "an absolute location")


def case_outside(env):
    ok(env.plan(), "rannc-plan")
    bad = env.edit_plan(lambda j: j["model"].update(path="/etc/passwd"), os.path.join(env.dir, "outside.json"))
    p = run([env.args.plan_tool, "check", bad])
    expect_error(p, "does not name a model file", "a plan naming /etc/passwd")
    import hashlib
    sha = hashlib.sha256(open("/etc/passwd", "rb").read()).hexdigest()
    if sha[:12] in p.stdout + p.stderr:
        sys.exit("check printed a hash of /etc/passwd")
    # Note [plan model path]: the path is relative to the plan, so the plan
    # runs from any folder ...
    if json.load(open(env.plan_path))["model"]["path"] != "m/model.onnx":
        sys.exit("the plan does not record its model relative to the plan's folder")
    p = run([env.args.plan_tool, "check", env.plan_path], cwd="/")
    if p.returncode != 0 or "matches model.sha256" not in p.stdout:
        sys.exit(f"check from another folder did not find the plan's model:\n{p.stdout}{p.stderr}")
    print("ok: the plan's model is found from another working folder")
    # ... and a plan outside the model's folder names a model outside its own:
    # refused (the hash of a model file elsewhere is read) unless the user trusts it.
    sub = os.path.join(env.dir, "sub", "plan.json")
    os.makedirs(os.path.dirname(sub))
    ok(env.plan(out=sub), "rannc-plan -o sub/plan.json")
    if json.load(open(sub))["model"]["path"] != "../m/model.onnx":
        sys.exit("the plan in sub/ does not record ../m/model.onnx")
    want = "leaves"
    expect_error(run([env.args.plan_tool, "check", sub]), want, "check of a plan naming ../m/model.onnx")
    expect_error(env.train(["--steps", "1"], plan=sub), "--allow-model-outside-plan",
                 "rannc-exec of a plan naming ../m/model.onnx")
    ok(run([env.args.plan_tool, "check", sub, "--allow-model-outside-plan"]), "check --allow-model-outside-plan")
    ok(env.train(["--steps", "1", "--allow-model-outside-plan"], plan=sub), "rannc-exec --allow-model-outside-plan")
    ok(env.train(["--steps", "1", "--model", env.model], plan=sub), "rannc-exec --model")


def case_plan_data_fifo(env):
    """rannc-plan MODEL.pt --data DIR reads DIR/<input>.npy for a TorchScript
    archive that does not describe its inputs: a FIFO there, or as DIR, is
    refused at once."""
    import numpy as np
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.fc(x), y)

    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    model = os.path.join(env.dir, "net.pt")
    torch.jit.trace(Net(), (x, y)).save(model)  # torch.jit.save's default: no input description
    data = os.path.join(env.dir, "data")
    os.makedirs(data)
    np.save(os.path.join(data, "y.npy"), y.numpy())
    np.save(os.path.join(data, "x.npy"), x.numpy())
    plan = os.path.join(env.dir, "net.json")
    ok(env.plan(model, plan, ["--data", data]), "rannc-plan net.pt --data DIR")
    os.remove(os.path.join(data, "x.npy"))
    os.mkfifo(os.path.join(data, "x.npy"))
    expect_error(env.plan(model, plan, ["--data", data]), "a FIFO, not a regular file",
                 "a FIFO as --data's x.npy (rannc-plan)")
    fifo = os.path.join(env.dir, "fifo")
    os.mkfifo(fifo)
    expect_error(env.plan(model, plan, ["--data", fifo]), "Not a directory", "a FIFO as --data (rannc-plan)")


def case_full_disk(env):
    ok(env.plan(), "rannc-plan")
    expect_error(env.train(["--steps", "3", "--log", "/dev/full"]), "cannot write the log", "--log on a full disk")


def case_sigterm(env):
    ok(env.plan(), "rannc-plan")
    ck = os.path.join(env.dir, "ck")

    def term():
        pids = rank_pids(env.args.exec_tool, env.plan_path)
        if not pids:
            sys.exit("no rank to signal")
        for pid in pids:
            os.kill(pid, signal.SIGTERM)

    p = long_run(env, ["--checkpoint-dir", ck], term)
    expect_error(p, "stopped by signal 15 after step", "SIGTERM mid-run")
    steps = [d for d in os.listdir(ck) if d.startswith("step-")]
    if len(steps) != 1 or steps[0].endswith(".tmp") or not os.path.exists(os.path.join(ck, steps[0], "manifest.json")):
        sys.exit(f"SIGTERM: expected one complete checkpoint, found {steps}")
    n = int(steps[0].split("-")[1])
    logged = sum(1 for _ in open(os.path.join(env.dir, "run.jsonl")))
    if n != logged:
        sys.exit(f"SIGTERM: checkpoint of step {n}, but {logged} steps were logged")
    print(f"ok: SIGTERM: checkpoint of step {n} = the steps logged")


def case_tmp(env):
    ok(env.plan(), "rannc-plan")
    ck = os.path.join(env.dir, "ck")
    # The rank alone may write no file above 4 KiB (EFBIG; SIGXFSZ ignored): mpirun's own files stay unlimited.
    cmd = env.exec_cmd(extra=["--steps", "2", "--checkpoint-dir", ck, "--optimizer", "adam"])
    at = cmd.index(env.args.exec_tool)
    p = run(cmd[:at] + ["bash", "-c", "ulimit -f 4; trap '' XFSZ; exec " + shlex.join(cmd[at:])])
    expect_error(p, "cannot write the checkpoint of step 2", "a checkpoint write that fails")
    left = os.listdir(ck)
    if left:
        sys.exit(f"a failed checkpoint write left {left} in {ck}")
    print("ok: no step-N.tmp left")


def case_utf8(env):
    raw = open(env.model, "rb").read()
    import onnx
    m = onnx.load(env.model)
    name = m.graph.initializer[0].name
    bad = name[:-1].encode() + b"\xff"
    patched = raw.replace(name.encode(), bad)
    path = os.path.join(env.dir, "m", "latin.onnx")
    open(path, "wb").write(patched)
    for ext in ("pb", "pbtxt", "json"):
        out = os.path.join(env.dir, f"latin.{ext}")
        p = env.plan(path, out)
        if p.returncode == 0:  # written: then it must read back
            ok(run([env.args.plan_tool, "check", out, "--model", path]), f"check of the {ext} plan rannc-plan wrote")
            print(f"ok: the .{ext} plan of a non-UTF-8 model reads back")
        else:
            expect_error(p, "not valid UTF-8", f"a non-UTF-8 name (.{ext})")


def case_loss(env):
    ok(env.plan(), "rannc-plan")
    j = json.load(open(env.plan_path))
    # The input of the loss's last op: a tensor, not a scalar.
    last = j["graph"]["ops"][-1]
    tensor = last["inputs"][0]
    bad = env.edit_plan(lambda j: j["graph"].update(loss=tensor), os.path.join(env.dir, "loss.json"))
    expect_error(run([env.args.plan_tool, "check", bad]), "the loss must be a scalar float", "a non-scalar loss (check)")
    expect_error(env.train(["--steps", "1"], plan=bad), "the loss must be a scalar float", "a non-scalar loss (exec)")


def case_optim_shape(env):
    ok(env.plan(), "rannc-plan")
    ck = os.path.join(env.dir, "ck")
    ok(env.train(["--steps", "2", "--checkpoint-dir", ck, "--optimizer", "adam"]), "a run with a checkpoint")
    step = os.path.join(ck, "step-2")
    path = os.path.join(step, "stage-0.optim.safetensors")
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    shapes = json.load(open(os.path.join(step, "manifest.json")))
    # Two parameters' states swapped: each a valid state of another shape.
    ws = json.loads(blob[8:8 + n])
    import onnx
    dims = {t.name: list(t.dims) for t in onnx.load(env.model).graph.initializer}
    a = names[0]
    b = next(k for k in names if dims.get(k) != dims.get(a))
    header[a], header[b] = ws[b], ws[a]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text)) if len(text) <= n else b""
    if len(text) != n:
        sys.exit("cannot keep the header's length")
    out = blob[:8] + text + blob[8 + n:]
    open(path, "wb").write(out)
    import hashlib
    for f in shapes["files"]:
        if f["name"] == "stage-0.optim.safetensors":
            f["sha256"] = hashlib.sha256(out).hexdigest()
            f["bytes"] = len(out)
    json.dump(shapes, open(os.path.join(step, "manifest.json"), "w"))
    expect_error(env.train(["--steps", "3", "--checkpoint-dir", ck, "--resume", "--optimizer", "adam"]),
                 "holds a tensor of", "optimizer state of the wrong shape")


def case_huge(env):
    ok(env.plan(), "rannc-plan")
    big = env.edit_plan(lambda j: j.update(global_batch_size=str(2**40)), os.path.join(env.dir, "big.json"))
    p = env.train(["--steps", "1"], plan=big)
    if p.returncode == 0 or "frame #" in p.stdout + p.stderr:
        sys.exit(f"a huge batch: exit {p.returncode}, expected one line\n{p.stderr[-3000:]}")
    errors = [l for l in (p.stdout + p.stderr).splitlines() if "error:" in l]
    if not errors:
        sys.exit(f"a huge batch: no error line\n{p.stderr[-3000:]}")
    print("ok: a huge batch:", errors[0][:200])
    import onnx
    m = onnx.load(env.model)
    m.graph.input[0].type.tensor_type.shape.dim[-1].dim_value = 2**40
    path = os.path.join(env.dir, "m", "huge.onnx")
    onnx.save(m, path)
    p = env.plan(path, os.path.join(env.dir, "huge.json"))
    if p.returncode < 0 or "frame #" in p.stdout + p.stderr:
        sys.exit(f"huge dimensions: exit {p.returncode}\n{p.stderr[-3000:]}")
    print("ok: huge dimensions:", p.returncode, (p.stderr.strip().splitlines() or [""])[-1][:200])


CASES = {name[5:].replace("_", "-"): f for name, f in globals().items() if name.startswith("case_")}


def main(doc=__doc__, cases=CASES, env=Env, name="hostile_check"):
    """Runs the --case(s) given, each in an `env` of its own (cli_check.py's too)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", choices=sorted(cases), action="append", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    for case in args.case:
        cases[case](env(args, case))
    print(f"{name}: all cases passed")


if __name__ == "__main__":
    main()
