#!/usr/bin/env python3
"""Checkpoints, exact resume and ONNX export of rannc-exec (docs/training.md).

--case resume: a 2-stage run killed with SIGKILL mid-run and resumed logs
    exactly the losses of an uninterrupted run (Adam, so the optimizer state
    matters; --shuffle on, so the data position matters); --keep holds; a
    crash mid-write (a .tmp folder, a step folder without manifest) is ignored.
--case cross-plan: a checkpoint of a 2-stage plan resumed on 1 rank, on 2
    stages x 2 replicas and on 3 stages gives PyTorch's losses for the
    remaining steps; the exported ONNX (--export-onnx and `rannc-exec export`)
    holds PyTorch's trained parameters (and BatchNorm statistics, if any).
--case cross-plan --zero: a checkpoint written with sharded optimizer state
    (--zero 1) resumed unsharded, and one written unsharded resumed sharded.
--case cross-plan --tensor-parallel: a checkpoint written under TP 2 resumed
    on 1 rank and on 2 stages, and one of 2 stages resumed under TP 2 (one
    stage, and 2 stages x TP 2): whole tensors in checkpoints and exports.
--case fp16-scale: an fp16 run (--precision fp16, dynamic loss scaling) from
    a loss scale so large that the first steps overflow, stopped after its
    checkpoint and resumed, logs the uninterrupted run's losses and skips the
    same steps at the same scales (the checkpoint carries the scaler); so
    does a resume on 1 rank; an fp32 plan resuming it ignores the scale, and
    an fp16 plan resuming an fp32 checkpoint starts at its --loss-scale.
--case errors: a missing checkpoint folder, a corrupt manifest, a damaged
    file, a checkpoint of another model, another optimizer, ... each stop
    every rank with one clear line and a non-zero exit, before any step.
References come from models/make_model.py (reference_<opt>.json,
reference_<opt>_params.npz and reference_<opt>_fp16_overflow.json), never from numbers typed in here."""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from train_check import edit_tensor_parallel

REL_TOL = 1e-4       # a different plan: floating-point reassociation only (SPEC)
LOWP_REL_TOL = 1e-2  # a different plan in fp16 (train_check.py's tolerance against autocast)
RESUME_REL_TOL = 1e-6  # the same plan resumed: should be bit-identical


def run(cmd, timeout=300):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)


def mpirun(args, ranks):
    return [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]


def ok(p, what):
    if p.returncode != 0:
        sys.exit(f"{what} failed (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-4000:]}")
    return p


# Two pipeline stages in one micro-batch: the layout where BatchNorm's batch
# statistics are one device's (SPEC), whatever the cost model would choose.
PP2 = "--stages 2 --replicas 1 --microbatches 1"
# Interleaved 1F1B: 2 chunks on each of 2 ranks (stages 0 and 2 on rank 0).
IL2 = "--stages 2 --replicas 1 --microbatches 4 --schedule interleaved-1f1b --virtual-stages 2"


def plan(args, ranks, layout, out, precision=None):
    precision = ["--precision", precision] if precision else []
    # "--edit-tensor-parallel N": every stage of the written plan gets degree N by hand.
    edit = re.search(r"--edit-tensor-parallel (\d+)", layout)
    if edit:
        layout = layout.replace(edit.group(0), "")
        out = os.path.splitext(out)[0] + ".pbtxt"
    ok(run([args.plan_tool, os.path.join(args.model_dir, "model.onnx"), "--gpus", str(ranks), "--device-type",
            "cpu", "--batch-size", str(args.ref["batch_size"]), "--profile", "analytic", "-o", out]
           + layout.split() + precision),
       "rannc-plan")
    if edit:
        edit_tensor_parallel(out, int(edit.group(1)))
    return out


def train(args, plan_path, ranks, extra, timeout=300):
    return run(mpirun(args, ranks) + [args.exec_tool, plan_path,
                                      "--allow-model-outside-plan", "--data", os.path.join(args.model_dir, "data"),
                                      "--optimizer", args.optimizer, "--lr", repr(args.ref["lr"])] + extra,
               timeout=timeout)


def read_log(path):
    return [json.loads(line) for line in open(path)]


def compare_losses(got, want, tol, what):
    """got: log records; want: {step: loss}. Returns the worst relative difference."""
    if [r["step"] for r in got] != sorted(want):
        sys.exit(f"{what}: logged steps {[r['step'] for r in got]}, expected {sorted(want)}")
    worst, identical = 0.0, 0
    for r in got:
        rel = abs(r["loss"] - want[r["step"]]) / abs(want[r["step"]])
        worst = max(worst, rel)
        identical += r["loss"] == want[r["step"]]
        print(f"  step {r['step']}: {r['loss']:.9f}  expected {want[r['step']]:.9f}  rel {rel:.2e}")
    print(f"{what}: max relative difference {worst:.3e} (tolerance {tol}), {identical}/{len(got)} bit-identical")
    if worst > tol:
        sys.exit(f"{what}: losses differ")
    return worst


def resumed_from(stderr):
    m = re.search(r"resuming from (\S+): step (\d+)", stderr)
    return int(m.group(2)) if m else None


def complete_checkpoints(d):
    return sorted(int(n[5:]) for n in os.listdir(d)
                  if re.fullmatch(r"step-\d+", n) and os.path.exists(os.path.join(d, n, "manifest.json")))


def rank_pids(args, plan_path):
    out = subprocess.run(["pgrep", "-f", f"^{args.exec_tool} {plan_path}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


# --------------------------------------------------------------------------- resume after SIGKILL

def check_resume(args):
    work = args.work
    pp2 = plan(args, 2, PP2, os.path.join(work, "pp2.pb"))
    flags = ["--shuffle", "on", "--seed", "7"]
    # Compared with rannc's own uninterrupted run, so it may be longer than
    # PyTorch's reference: 40 steps leave the kill (polled every 10 ms, steps
    # of a few ms) a wide window even on a loaded machine.
    steps = max(args.ref["steps"], 40)

    full_log = os.path.join(work, "full.jsonl")
    ok(train(args, pp2, 2, flags + ["--steps", str(steps), "--log", full_log]), "uninterrupted run")
    full = {r["step"]: r["loss"] for r in read_log(full_log)}

    # The killed run would go on for ever: it ends only by SIGKILL, once the
    # log shows step 5 (checkpoints at 3, 6, ...; the last one is before it).
    ckpt = os.path.join(work, "ckpt")
    log = os.path.join(work, "resumed.jsonl")
    shutil.rmtree(ckpt, ignore_errors=True)
    if os.path.exists(log):
        os.remove(log)
    ckpt_flags = ["--checkpoint-dir", ckpt, "--checkpoint-every", "3", "--keep", "2", "--log", log]
    cmd = mpirun(args, 2) + [args.exec_tool, pp2, "--allow-model-outside-plan",
                             "--data", os.path.join(args.model_dir, "data"), "--optimizer", args.optimizer,
                             "--lr", repr(args.ref["lr"])] + flags + ckpt_flags + ["--steps", "1000000"]
    print("+", " ".join(cmd), flush=True)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 120
    logged = []
    while time.time() < deadline and job.poll() is None:
        try:
            logged = [json.loads(line) for line in open(log)]
        except (OSError, ValueError):
            logged = []
        if logged and logged[-1]["step"] >= 5:
            break
        time.sleep(0.01)
    pids = rank_pids(args, pp2)
    for pid in pids:  # the whole job at once, as a node failure would
        os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out, _ = job.communicate(timeout=60)
    if len(pids) != 2:
        sys.exit(f"expected 2 rank processes to kill, found {pids}:\n{out[-3000:]}")
    killed_at = max(r["step"] for r in read_log(log)) if os.path.getsize(log) else -1
    complete = complete_checkpoints(ckpt)
    print(f"killed the job after step {killed_at}; complete checkpoints: {complete}")
    if killed_at < 5 or killed_at >= steps - 1:
        sys.exit(f"the kill landed after step {killed_at}, outside the steps this test needs")

    p = ok(train(args, pp2, 2, flags + ckpt_flags + ["--steps", str(steps), "--resume"]), "resumed run")
    print(p.stderr[-2000:])
    start = resumed_from(p.stderr)
    # The newest checkpoint complete at the kill: a rank can publish one just
    # before rank 0 logs its step, so it may be one past the last logged step.
    if start is None or not complete or start != max(complete) or not 0 < start <= killed_at + 1:
        sys.exit(f"resumed from step {start}; expected the newest checkpoint complete at the kill "
                 f"({max(complete) if complete else None}, last logged step {killed_at})")
    if start % 3 != 0:
        sys.exit(f"resumed from step {start}, which is no multiple of --checkpoint-every 3")
    compare_losses(read_log(log), full, RESUME_REL_TOL, f"killed after step {killed_at}, resumed at step {start}")

    kept = complete_checkpoints(ckpt)
    print(f"complete checkpoints after the resumed run: {kept}")
    if len(kept) != 2 or kept[-1] != steps:
        sys.exit(f"--keep 2: expected the newest 2 checkpoints ending with step {steps}, found {kept}")

    # A crash mid-write: a .tmp folder with a partial file and no manifest, and
    # a step folder without manifest; --resume must skip both.
    crash = os.path.join(work, "crash")
    shutil.rmtree(crash, ignore_errors=True)
    os.makedirs(crash)
    older = kept[0]
    shutil.copytree(os.path.join(ckpt, f"step-{older}"), os.path.join(crash, f"step-{older}"))
    partial = os.path.join(crash, f"step-{older + 1}.tmp")
    shutil.copytree(os.path.join(ckpt, f"step-{steps}"), partial)
    os.remove(os.path.join(partial, "manifest.json"))
    with open(os.path.join(partial, "stage-0.safetensors"), "r+b") as f:
        f.truncate(100)
    no_manifest = os.path.join(crash, f"step-{older + 2}")
    shutil.copytree(partial, no_manifest)
    crash_log = os.path.join(work, "crash.jsonl")
    shutil.copyfile(full_log, crash_log)
    p = ok(train(args, pp2, 2, flags + ["--checkpoint-dir", crash, "--steps", str(steps), "--resume", "--log",
                                        crash_log]), "resume beside a crashed write")
    print(p.stderr[-1500:])
    if resumed_from(p.stderr) != older:
        sys.exit(f"expected to resume from step {older}, the newest complete checkpoint")
    if f"ignoring {no_manifest}" not in p.stderr:
        sys.exit("the step folder without a manifest was not reported as ignored")
    compare_losses(read_log(crash_log), full, RESUME_REL_TOL, f"resumed at step {older} beside a crashed write")


# --------------------------------------------------------------------------- another plan, export

def onnx_weights(path):
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    onnx.checker.check_model(m)
    return m, {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def check_export(args, path, optimizer, what):
    """The exported model is the original one with PyTorch's trained weights."""
    model, got = onnx_weights(path)
    original, start = onnx_weights(os.path.join(args.model_dir, "model.onnx"))
    if model.graph.node != original.graph.node or model.graph.input != original.graph.input or \
            model.graph.output != original.graph.output or model.opset_import != original.opset_import:
        sys.exit(f"{what}: the exported graph differs from the original's")
    want = np.load(os.path.join(args.model_dir, f"reference_{optimizer}_params.npz"))
    buffers_path = os.path.join(args.model_dir, f"reference_{optimizer}_buffers.npz")
    buffers = np.load(buffers_path) if os.path.exists(buffers_path) else {}
    if sorted(list(want.files) + list(buffers)) != sorted(got):
        sys.exit(f"{what}: initializers {sorted(got)} differ from PyTorch's parameters and buffers")
    # Buffers (BatchNorm running statistics, as ONNX updates them): each tensor.
    for name in buffers:
        a, b = got[name], buffers[name]
        rel = float(np.abs(a - b).max() / np.abs(b).max())
        if a.shape != b.shape or rel > REL_TOL:
            sys.exit(f"{what}: buffer '{name}' differs from PyTorch's (max-abs rel {rel:.3e})")
    if len(buffers):
        print(f"{what}: {len(buffers)} buffers match PyTorch's running statistics (rel {REL_TOL})")
    diff2 = ref2 = moved2 = 0.0
    worst_name, worst = "", 0.0
    for name in want.files:
        a, b = got[name], want[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            sys.exit(f"{what}: '{name}' is {a.dtype}{a.shape}, PyTorch's {b.dtype}{b.shape}")
        diff2 += float(np.sum((a.astype(np.float64) - b) ** 2))
        ref2 += float(np.sum(b.astype(np.float64) ** 2))
        moved2 += float(np.sum((b.astype(np.float64) - start[name]) ** 2))
        rel = float(np.abs(a - b).max() / np.abs(b).max())
        if rel > worst:
            worst_name, worst = name, rel
    rel = (diff2 / ref2) ** 0.5
    moved = (moved2 / ref2) ** 0.5
    print(f"{what}: |exported - pytorch| / |pytorch| = {rel:.3e} over all parameters (training moved them "
          f"{moved:.3e}); worst tensor {worst_name} max-abs rel {worst:.3e}")
    # SGD: every tensor to 1e-4. Adam divides each gradient by its own running
    # RMS, so an element whose true gradient is 0 (the attention key bias:
    # softmax ignores a shift shared by all keys) moves by +-lr on rounding
    # noise in PyTorch and rannc alike; there only the whole model compares.
    if rel > REL_TOL or (optimizer == "sgd" and worst > REL_TOL):
        sys.exit(f"{what}: exported weights differ from PyTorch's")
    if moved < 10 * REL_TOL:
        sys.exit(f"{what}: training moved the weights too little for this comparison to mean anything")


def check_cross_plan(args):
    if args.zero:
        # Sharded optimizer state (Note [sharded optimizer state]): written
        # sharded, resumed unsharded; written unsharded, resumed sharded.
        resume_elsewhere(args, ("dp2-zero", 2, "--stages 1 --replicas 2 --microbatches 1 --zero 1"),
                         [("1rank", 1, ""), ("2x2", 4, "--stages 2 --replicas 2 --microbatches 2 --zero 0")])
        resume_elsewhere(args, ("pp2", 2, PP2), [("2x2-zero", 4, "--stages 2 --replicas 2 --microbatches 2 --zero 1")])
        return
    if args.interleaved and args.tensor_parallel:
        # Tensor-parallel chunks (a rank's chunks share its groups): whole
        # tensors written from every chunk, resumed on one rank and under
        # 1F1B; and a 1F1B checkpoint resumed in 2-way chunks.
        one_f_one_b = PP2 + " --schedule 1f1b"
        il_tp2 = IL2 + " --tensor-parallel 2"
        resume_elsewhere(args, ("il2-tp2", 4, il_tp2), [("1rank", 1, ""), ("pp2-1f1b", 2, one_f_one_b)])
        resume_elsewhere(args, ("pp2-1f1b", 2, one_f_one_b), [("il2-tp2", 4, il_tp2)])
        return
    if args.interleaved:
        # Interleaved ranks hold several non-adjacent stages (Note [interleaved
        # checkpoints]); the folder is the same by name: written under
        # interleaving, resumed on one rank and on 1F1B; and back, with replicas.
        one_f_one_b = PP2 + " --schedule 1f1b"
        il2x2 = IL2.replace("--replicas 1", "--replicas 2")
        resume_elsewhere(args, ("il2", 2, IL2), [("1rank", 1, ""), ("pp2-1f1b", 2, one_f_one_b)])
        resume_elsewhere(args, ("pp2-1f1b", 2, one_f_one_b), [("il2x2", 4, il2x2), ("il2x2-zero", 4, il2x2 + " --zero 1")])
        # Sharded state of every chunk gathered for the write.
        resume_elsewhere(args, ("il2x2-zero-src", 4, il2x2 + " --zero 1"), [("1rank", 1, "")])
        return
    if args.tensor_parallel:
        # Tensor-parallel stages (Note [tensor parallel ranks]) write whole
        # tensors: written under TP 2, resumed without it; and back.
        tp2 = "--stages 1 --replicas 1 --tensor-parallel 2 --microbatches 2"
        resume_elsewhere(args, ("tp2", 2, tp2), [("1rank", 1, ""), ("pp2", 2, PP2)])
        # The last plan's degrees are set by hand in its .pbtxt (a plan made without TP).
        resume_elsewhere(args, ("pp2", 2, PP2), [("tp2", 2, tp2),
                                                 ("2x2-tp2", 4, "--stages 2 --replicas 2,2 --microbatches 2 "
                                                                "--schedule 1f1b --edit-tensor-parallel 2")])
        return
    layouts = [("1rank", 1, ""), ("2x2", 4, "--stages 2 --replicas 2 --microbatches 2"),
               ("3stages", 4, "--stages 3 --replicas 2,1,1 --microbatches 4")]
    pp2 = resume_elsewhere(args, ("pp2", 2, PP2), layouts[:1] if args.quick else layouts)
    # The 2-stage run trained to the end, exported straight from its stages.
    full = os.path.join(args.work, "pp2-full.onnx")
    ok(train(args, pp2, 2, ["--shuffle", "off", "--steps", str(args.ref["steps"]), "--export-onnx", full]),
       "2 stages with --export-onnx")
    check_export(args, full, args.optimizer, "2 stages: --export-onnx")


def resume_elsewhere(args, source_layout, layouts):
    """Trains half the steps on the source layout with checkpoints, resumes
    each of `layouts` from them, and compares losses and exports with
    PyTorch's. Returns the source plan."""
    work = args.work
    steps, half = args.ref["steps"], args.ref["steps"] // 2
    want = {k: loss for k, loss in enumerate(args.ref["losses"])}
    flags = ["--shuffle", "off"]  # PyTorch's reference order
    source_name, source_ranks, source_flags = source_layout
    source_plan = plan(args, source_ranks, source_flags, os.path.join(work, f"{source_name}.pb"))
    source = os.path.join(work, f"source-{source_name}")
    shutil.rmtree(source, ignore_errors=True)
    source_log = os.path.join(work, f"source-{source_name}.jsonl")
    ok(train(args, source_plan, source_ranks, flags + ["--steps", str(half), "--checkpoint-dir", source, "--log",
                                                       source_log]), f"{half} steps on {source_name}")
    compare_losses(read_log(source_log), {k: want[k] for k in range(half)}, REL_TOL,
                   f"{source_name}, before the checkpoint")

    for name, ranks, layout in layouts:
        p = plan(args, ranks, layout, os.path.join(work, f"{name}.pb"))
        ckpt = os.path.join(work, f"ckpt-{source_name}-{name}")
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.copytree(source, ckpt)
        log = os.path.join(work, f"{source_name}-{name}.jsonl")
        shutil.copyfile(source_log, log)
        exported = os.path.join(work, f"{source_name}-{name}.onnx")
        r = ok(train(args, p, ranks, flags + ["--steps", str(steps), "--checkpoint-dir", ckpt, "--resume", "--log",
                                              log, "--export-onnx", exported]), f"resume on {name}")
        print(r.stderr[-1500:])
        if resumed_from(r.stderr) != half:
            sys.exit(f"{name}: expected to resume from step {half}")
        compare_losses(read_log(log), want, REL_TOL, f"saved on {source_name}, resumed on {name}")
        check_export(args, exported, args.optimizer, f"{name}: --export-onnx")
        # The same weights from the checkpoint the run wrote last, without mpirun.
        from_ckpt = os.path.join(work, f"{source_name}-{name}-from-checkpoint.onnx")
        e = ok(run([args.exec_tool, "export", ckpt, "-o", from_ckpt]), "rannc-exec export")
        print(e.stderr.strip())
        if open(from_ckpt, "rb").read() != open(exported, "rb").read():
            sys.exit(f"{name}: `rannc-exec export` of the last checkpoint differs from --export-onnx")
    return source_plan


# --------------------------------------------------------------------------- fp16 loss scale

OVERFLOW_LINE = re.compile(r"step (\d+): fp16 gradients overflowed at loss scale (\S+); step skipped, scale now (\S+)")


def overflows(stderr):
    """{step: (scale before, scale after)} of each skipped step rannc-exec logged."""
    return {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in OVERFLOW_LINE.finditer(stderr)}


def compare_skips(got_log, got_overflows, want_log, want_overflows, what, from_step=0):
    """The same steps skipped, and each logged overflow from `from_step` on at the same scales."""
    got = [r["step"] for r in got_log if r.get("skipped")]
    want = [r["step"] for r in want_log if r.get("skipped")]
    print(f"{what}: skipped steps {got}, uninterrupted {want}; logged overflows {got_overflows}")
    if got != want:
        sys.exit(f"{what}: skipped steps {got}, the uninterrupted run skipped {want}")
    if got_overflows != {k: v for k, v in want_overflows.items() if k >= from_step}:
        sys.exit(f"{what}: overflow scales {got_overflows} differ from the uninterrupted run's {want_overflows}")


def check_fp16_scale(args):
    """Note [loss scaling]: the scaler's state is part of the checkpoint."""
    work = args.work
    steps, half = args.ref["steps"], args.ref["steps"] // 2
    pp2 = plan(args, 2, PP2, os.path.join(work, "pp2-fp16.pb"), "fp16")
    flags = ["--shuffle", "off", "--loss-scale", repr(args.ref["loss_scale"])]

    full_log = os.path.join(work, "full.jsonl")
    p = ok(train(args, pp2, 2, flags + ["--steps", str(steps), "--log", full_log]), "uninterrupted fp16 run")
    full, full_overflows = read_log(full_log), overflows(p.stderr)
    skipped = [r["step"] for r in full if r.get("skipped")]
    if skipped != args.ref["skipped_steps"]:
        sys.exit(f"uninterrupted run skipped {skipped}, PyTorch's GradScaler {args.ref['skipped_steps']}")
    if not any(k < half for k in skipped) or not any(k >= half for k in skipped):
        sys.exit(f"skipped steps {skipped}: this test needs overflows both before and after step {half}")

    ckpt = os.path.join(work, "ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    log = os.path.join(work, "resumed.jsonl")
    ckpt_flags = ["--checkpoint-dir", ckpt, "--log", log]
    p = ok(train(args, pp2, 2, flags + ckpt_flags + ["--steps", str(half)]), f"{half} fp16 steps")
    first_overflows = overflows(p.stderr)
    pristine = os.path.join(work, "ckpt-half")  # the checkpoint of step `half` only, for the other resumes
    shutil.rmtree(pristine, ignore_errors=True)
    shutil.copytree(ckpt, pristine)
    saved = json.load(open(os.path.join(ckpt, f"step-{half}", "manifest.json"))).get("loss_scale")
    # The log prints 6 significant digits; the manifest the exact scale.
    want_scale = full_overflows[max(k for k in full_overflows if k < half)][1]
    print(f"step-{half}/manifest.json: loss_scale {saved}; the uninterrupted run's scale then: {want_scale}")
    if not saved or abs(saved["scale"] - want_scale) > 1e-5 * want_scale or saved["scale"] == args.ref["loss_scale"]:
        sys.exit(f"the checkpoint's loss scale {saved} is not the run's {want_scale} (initial {args.ref['loss_scale']})")
    p = ok(train(args, pp2, 2, flags + ckpt_flags + ["--steps", str(steps), "--resume"]), "resumed fp16 run")
    print(p.stderr[-1500:])
    if resumed_from(p.stderr) != half or f"fp16 loss scale {saved['scale']:g} restored" not in p.stderr:
        sys.exit(f"expected a resume from step {half} that restores the loss scale {saved['scale']:g}")
    resumed = read_log(log)
    compare_losses(resumed, {r["step"]: r["loss"] for r in full}, RESUME_REL_TOL, f"fp16, resumed at step {half}")
    compare_skips(resumed, {**first_overflows, **overflows(p.stderr)}, full, full_overflows,
                  f"fp16, resumed at step {half}")

    # Another plan: the checkpoint's scale on 1 rank.
    one = plan(args, 1, "", os.path.join(work, "1rank-fp16.pb"), "fp16")
    other = os.path.join(work, "ckpt-1rank")
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(pristine, other)
    log1 = os.path.join(work, "1rank.jsonl")
    shutil.copyfile(full_log, log1)
    p = ok(train(args, one, 1, flags + ["--checkpoint-dir", other, "--log", log1, "--steps", str(steps), "--resume"]),
           "fp16 resumed on 1 rank")
    if resumed_from(p.stderr) != half:
        sys.exit(f"1 rank: expected to resume from step {half}")
    on_one = read_log(log1)
    compare_losses(on_one, {r["step"]: r["loss"] for r in full}, LOWP_REL_TOL, f"fp16, resumed at step {half} on 1 rank")
    compare_skips(on_one, overflows(p.stderr), full, full_overflows, f"fp16, resumed at step {half} on 1 rank",
                  from_step=half)

    # An fp32 plan ignores the fp16 checkpoint's scale; an fp16 plan resuming
    # an fp32 checkpoint starts at its --loss-scale.
    pp2_fp32 = plan(args, 2, PP2, os.path.join(work, "pp2-fp32.pb"))
    fp32 = os.path.join(work, "ckpt-fp32")
    shutil.rmtree(fp32, ignore_errors=True)
    shutil.copytree(pristine, fp32)
    p = ok(train(args, pp2_fp32, 2, ["--shuffle", "off", "--checkpoint-dir", fp32, "--steps", str(half + 1),
                                     "--resume"]), "an fp32 plan resuming the fp16 checkpoint")
    if "the checkpoint's fp16 loss scale is not used: this plan's precision is fp32" not in p.stderr:
        sys.exit(f"the fp32 run did not say it ignores the fp16 loss scale:\n{p.stderr[-1500:]}")
    p = ok(train(args, pp2, 2, flags + ["--checkpoint-dir", fp32, "--steps", str(half + 2), "--resume"]),
           "an fp16 plan resuming the fp32 checkpoint")
    if f"holds no fp16 loss scale (an fp32/bf16 run's or an older one): starting at {args.ref['loss_scale']:g}" \
            not in p.stderr:
        sys.exit(f"the fp16 run did not start from --loss-scale:\n{p.stderr[-1500:]}")
    print("fp32 <-> fp16 resumes: the scale is ignored and defaulted, as documented")


# --------------------------------------------------------------------------- errors

def expect_failure(p, needle, what, error_prefix=True):
    out = p.stdout + p.stderr
    if p.returncode == 0:
        sys.exit(f"{what}: expected a non-zero exit, got 0")
    if needle not in out:
        sys.exit(f"{what}: expected a message containing '{needle}', got:\n{out[-3000:]}")
    if "Segmentation fault" in out or "core dumped" in out or "Traceback" in out:
        sys.exit(f"{what}: crashed:\n{out}")
    errors = [line for line in out.splitlines() if "error:" in line or (not error_prefix and needle in line)]
    if len(errors) != 1:
        sys.exit(f"{what}: expected one error line, got {len(errors)}:\n" + "\n".join(errors))
    if re.search(r"^step \d+/", out, re.M):
        sys.exit(f"{what}: training ran before the error:\n{out[-2000:]}")
    print(f"ok: {what}: {errors[0].strip()}")


def check_errors(args):
    work = args.work
    pp2 = plan(args, 2, PP2, os.path.join(work, "pp2.pb"))
    good = os.path.join(work, "good")
    shutil.rmtree(good, ignore_errors=True)
    ok(train(args, pp2, 2, ["--steps", "2", "--checkpoint-dir", good]), "a run that checkpoints")

    def resume_from(d, extra=()):
        return train(args, pp2, 2, ["--steps", "3", "--checkpoint-dir", d, "--resume"] + list(extra), timeout=120)

    def damaged(name, change):
        d = os.path.join(work, name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        change(os.path.join(d, "step-2"))
        return d

    expect_failure(resume_from(os.path.join(work, "no-such-folder")), "no such checkpoint folder", "missing folder")

    def truncate(path, size):
        with open(path, "r+b") as f:
            f.truncate(size)
    d = damaged("corrupt-manifest", lambda s: truncate(os.path.join(s, "manifest.json"), 200))
    expect_failure(resume_from(d), "corrupt manifest", "truncated manifest.json")

    def flip(path):
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 10)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
    d = damaged("damaged-file", lambda s: flip(os.path.join(s, "stage-1.safetensors")))
    expect_failure(resume_from(d), "SHA-256 differs from the manifest's (damaged checkpoint)", "a flipped byte")
    d = damaged("missing-file", lambda s: os.remove(os.path.join(s, "stage-0.optim.safetensors")))
    expect_failure(resume_from(d), "a file of the checkpoint is missing", "a deleted file")

    # Another model of the same architecture (one weight changed): its own plan,
    # the first model's checkpoint.
    import onnx
    from onnx import numpy_helper
    m = onnx.load(os.path.join(args.model_dir, "model.onnx"))
    w = m.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 2, w.name))
    other_model = os.path.join(work, "other.onnx")
    onnx.save(m, other_model)
    other_plan = os.path.join(work, "other.pb")
    ok(run([args.plan_tool, other_model, "--gpus", "2", "--device-type", "cpu", "--batch-size",
            str(args.ref["batch_size"]), "--stages", "2", "--profile", "analytic", "-o", other_plan]), "rannc-plan")
    d = damaged("other-model", lambda s: None)
    p = train(args, other_plan, 2, ["--steps", "3", "--checkpoint-dir", d, "--resume"], timeout=120)
    expect_failure(p, "checkpoint of another model", "a checkpoint of another model")
    p = run([args.exec_tool, "export", good, "--model", other_model, "-o", os.path.join(work, "x.onnx")])
    expect_failure(p, "not the model this checkpoint was trained from", "export with another model")
    if os.path.exists(os.path.join(work, "x.onnx")):
        sys.exit("a failed export left a file behind")

    other_opt = "sgd" if args.optimizer != "sgd" else "adam"
    p = run(mpirun(args, 2) + [args.exec_tool, pp2, "--allow-model-outside-plan",
                               "--data", os.path.join(args.model_dir, "data"), "--optimizer", other_opt,
                               "--steps", "3", "--checkpoint-dir", damaged("other-opt", lambda s: None),
                               "--resume"], timeout=120)
    expect_failure(p, f"trained with --optimizer {args.optimizer}", "another optimizer")
    p = resume_from(damaged("other-shuffle", lambda s: None), ["--shuffle", "on"])
    expect_failure(p, "the data order would not continue", "another data order")

    p = train(args, pp2, 2, ["--steps", "3", "--checkpoint-dir", good], timeout=120)
    expect_failure(p, "already holds checkpoints", "a fresh run into a folder with checkpoints")
    p = train(args, pp2, 2, ["--steps", "1", "--export-onnx", os.path.join(work, "no", "such", "x.onnx")],
              timeout=120)
    expect_failure(p, "does not exist (--export-onnx)", "export into a missing folder")
    p = run([args.exec_tool, "export", os.path.join(work, "no-such-folder"), "-o", os.path.join(work, "y.onnx")])
    expect_failure(p, "no such checkpoint folder", "export of a missing checkpoint")
    p = run([args.exec_tool, pp2, "--resume"])
    expect_failure(p, "--resume requires --checkpoint-dir", "--resume without --checkpoint-dir", error_prefix=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--models", required=True, help="folder with one subfolder per generated model")
    ap.add_argument("--work", required=True, help="scratch folder")
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--optimizer", default="adam", choices=["sgd", "adam"])
    ap.add_argument("--case", required=True, choices=["resume", "cross-plan", "fp16-scale", "errors"])
    ap.add_argument("--quick", action="store_true", help="cross-plan: resume on 1 rank only")
    ap.add_argument("--zero", action="store_true",
                    help="cross-plan: between sharded (--zero 1) and unsharded optimizer state")
    ap.add_argument("--interleaved", action="store_true",
                    help="cross-plan: between interleaved-1f1b (2 chunks per rank) and 1F1B plans")
    ap.add_argument("--tensor-parallel", action="store_true",
                    help="cross-plan: between tensor-parallel (--tensor-parallel 2) and other plans")
    args = ap.parse_args()
    args.model_dir = os.path.join(args.models, args.model)
    suffix = "_fp16_overflow" if args.case == "fp16-scale" else ""
    args.ref = json.load(open(os.path.join(args.model_dir, f"reference_{args.optimizer}{suffix}.json")))
    args.work = os.path.join(args.work, f"{args.model}-{args.optimizer}-{args.case}" + ("-zero" if args.zero else "")
                             + ("-tp" if args.tensor_parallel else "") + ("-il" if args.interleaved else ""))
    os.makedirs(args.work, exist_ok=True)
    {"resume": check_resume, "cross-plan": check_cross_plan, "fp16-scale": check_fp16_scale,
     "errors": check_errors}[args.case](args)
    print("all checks passed")


if __name__ == "__main__":
    main()
