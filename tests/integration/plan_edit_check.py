#!/usr/bin/env python3
"""The hand-edit workflow of docs/plan-format.md, end to end: plan the GPT-style
model for 2 stages as a .pbtxt, move the stage boundary by editing two numbers
in the text, `rannc-plan check` it (valid, re-estimated), train it with
`mpirun -np 2 rannc-exec` and compare every loss with PyTorch's reference
(train_check.py's tolerance). Then a set of broken edits, each of which
`check` must reject with its own message, and the format version a hand
edit needs (Note [plan format versions])."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_check  # noqa: E402  (run, mpirun, REL_TOL: the same comparison as the training tests)

run = train_check.run


def fail(msg):
    sys.exit(f"plan_edit_check: {msg}")


# ----------------------------------------------------------------- text edits

def stage_spans(text):
    """(start, end) of each top-level `stages { ... }` block, in order."""
    spans = []
    for m in re.finditer(r"^stages \{\n", text, re.M):
        depth, i = 1, m.end()
        while depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        spans.append((m.start(), i))
    return spans


def set_stage_field(text, stage, field, value):
    """Sets `field: value` of stage `stage` (proto3 text leaves out zeros: add the line then)."""
    start, end = stage_spans(text)[stage]
    block = text[start:end]
    line = re.compile(rf"^  {field}: .*$", re.M)
    if line.search(block):
        block = line.sub(f"  {field}: {value}", block, count=1)
    else:
        block = block.replace("stages {\n", f"stages {{\n  {field}: {value}\n", 1)
    return text[:start] + block + text[end:]


def stage_field(text, stage, field):
    start, end = stage_spans(text)[stage]
    m = re.search(rf"^  {field}: (\d+)$", text[start:end], re.M)
    return int(m.group(1)) if m else 0


# ----------------------------------------------------------------- the workflow

def choose_boundary(plan_json, current, limit):
    """A new boundary a few ops before `current`: at a MatMul/Gemm, before the
    weight-only ops that feed it (a weight's Transpose: the planner never cuts
    between them either; import fusion places them right before their reader)."""
    graph = plan_json["graph"]
    weights = {v["name"] for v in graph["values"] if v.get("kind") in ("param", "const")}
    ops = graph["ops"]
    weight_only = []
    for op in ops:
        ins = [i for i in op.get("inputs", []) if i]
        only = all(i in weights for i in ins)
        weight_only.append(only)
        if only:
            weights.update(o["name"] for o in op.get("outputs", []) if o.get("name"))
    candidates = set()
    for i in range(1, len(ops)):
        if ops[i]["type"] not in ("MatMul", "Gemm"):
            continue
        k = i
        while k > 0 and weight_only[k - 1]:
            k -= 1
        if 1 <= k < limit and k != current:
            candidates.add(k)
    if not candidates:
        fail("no other boundary to move to")
    earlier = [i for i in candidates if i < current]
    return max(earlier) if earlier else min(candidates)


def expect_check_fails(args, plan, needle, what, extra=()):
    p = run([args.plan_tool, "check", plan, "--allow-model-outside-plan"] + list(extra))
    out = p.stdout + p.stderr
    if p.returncode != 1:
        fail(f"{what}: check exited {p.returncode}, expected 1:\n{out}")
    if needle not in out:
        fail(f"{what}: expected '{needle}' in check's output:\n{out}")
    print(f"ok: {what}: {next(line for line in out.splitlines() if needle in line).strip()}")


def check_format_versions(args, model, ref, plan, broken, work):
    """Note [plan format versions] (planner/plan/plan.h): an fp32 plan that
    neither recomputes nor shards stays format_version 1, readable by older
    rannc; one planned with --precision bf16 is written as 2. A hand edit that
    turns recomputation and bf16 on but leaves format_version: 1 is refused by
    check, each field named with the version it needs, and by rannc-exec;
    convert (text -> binary) writes version 2, which check accepts."""
    def version(path):
        p = run([args.plan_tool, "show", path, "--json"])
        if p.returncode != 0:
            fail(f"show --json {path} failed:\n{p.stderr}")
        return json.loads(p.stdout)["format_version"]
    if version(plan) != 1:
        fail(f"an fp32 plan without recomputation or sharding is written as format_version {version(plan)}, not 1")
    bf16 = os.path.join(work, "bf16.pbtxt")
    p = run([args.plan_tool, model, "--gpus", "2", "--device-type", "cpu", "--batch-size", str(ref["batch_size"]),
             "--stages", "2", "--profile", "analytic", "--precision", "bf16", "--schedule", "1f1b", "-o", bf16])
    if p.returncode != 0:
        fail(f"rannc-plan --precision bf16 failed:\n{p.stderr}")
    if version(bf16) != 2:
        fail(f"a bf16 plan is written as format_version {version(bf16)}, not 2")
    print("ok: format_version 1 for the fp32 plan, 2 for the bf16 one")

    def turn_on(t):
        t = set_stage_field(t, 0, "recompute", "true")
        return t.replace("format_version: 1\n", 'format_version: 1\nprecision: "bf16"\n', 1)
    old = broken("v1_with_v2_fields", turn_on)
    expect_check_fails(args, old, "stages[0].recompute: true needs format_version 2, the plan says 1 (a rannc that "
                                  "reads only version 1 would keep every activation",
                       "recompute under format_version 1")
    expect_check_fails(args, old, "precision: bf16 needs format_version 2, the plan says 1 (a rannc that reads only "
                                  "version 1 would run it in fp32); set format_version: 2, or let rannc-plan convert "
                                  "write it", "bf16 under format_version 1")
    p = run(train_check.mpirun(args, 2) + [args.exec_tool, old,
                                           "--allow-model-outside-plan", "--synthetic", "--steps", "1"], timeout=120)
    train_check.expect_failure(p, "precision: bf16 needs format_version 2", "rannc-exec refuses the mislabelled plan")
    converted = os.path.join(work, "v2_fields.pb")
    if run([args.plan_tool, "convert", old, "-o", converted]).returncode != 0:
        fail("convert of the hand-edited plan failed")
    if version(converted) != 2:
        fail(f"convert wrote format_version {version(converted)} for a plan that recomputes in bf16, not 2")
    p = run([args.plan_tool, "check", converted, "--allow-model-outside-plan"])
    if p.returncode != 0:
        fail(f"check rejects the converted plan:\n{p.stdout}{p.stderr}")
    back = os.path.join(work, "v2_fields.pbtxt")
    if run([args.plan_tool, "convert", converted, "-o", back]).returncode != 0 or \
            "format_version: 2\n" not in open(back).read():
        fail("the converted plan's text form does not say format_version: 2")
    print("ok: convert raised the hand-edited plan to format_version 2, and check accepts it")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    ap.add_argument("--interleaved", type=int, default=0, metavar="V",
                    help="edit an interleaved-1f1b plan of V chunks per rank (steps 1-4: edit, check, train)")
    args = ap.parse_args()

    model_dir = os.path.abspath(os.path.join(args.models, args.model))
    model = os.path.join(model_dir, "model.onnx")
    ref = json.load(open(os.path.join(model_dir, f"reference_{args.optimizer}.json")))
    work = args.work
    os.makedirs(work, exist_ok=True)

    # 1. A 2-stage plan in the text form: 1F1B's, whose broken edits below
    # assume one stage per rank; or 2 ranks of --interleaved V chunks each
    # (Note [interleaved 1F1B]), whose boundary between its first two chunks
    # moves the same way.
    schedule = ["--schedule", "interleaved-1f1b", "--virtual-stages", str(args.interleaved)] if args.interleaved \
        else ["--schedule", "1f1b"]
    plan = os.path.join(work, "plan.pbtxt")
    p = run([args.plan_tool, model, "--gpus", "2", "--device-type", "cpu", "--batch-size", str(ref["batch_size"]),
             "--microbatches", "2", "--stages", "2", "--replicas", "1", "--profile", "analytic",
             "--optimizer", args.optimizer, "-o", plan] + schedule)
    if p.returncode != 0:
        fail(f"rannc-plan failed:\n{p.stderr}")
    text = open(plan).read()
    current = stage_field(text, 0, "op_end")
    if stage_field(text, 1, "op_begin") != current:
        fail(f"stage 1 does not start where stage 0 ends ({current})")

    as_json = os.path.join(work, "plan.json")
    if run([args.plan_tool, "convert", plan, "-o", as_json]).returncode != 0:
        fail("convert to .json failed")
    boundary = choose_boundary(json.load(open(as_json)), current, stage_field(text, 1, "op_end"))
    stages = len(stage_spans(text))
    print(f"moving the boundary from op {current} to op {boundary}")

    # 2. The hand edit: two numbers.
    edited = os.path.join(work, "edited.pbtxt")
    text = set_stage_field(text, 0, "op_end", boundary)
    text = set_stage_field(text, 1, "op_begin", boundary)
    open(edited, "w").write(text)

    # 3. check: valid, re-estimated against the (now stale) estimates in the file.
    p = run([args.plan_tool, "check", edited, "--allow-model-outside-plan"])
    print(p.stdout, p.stderr)
    if p.returncode != 0:
        fail(f"check rejected the moved boundary:\n{p.stdout}{p.stderr}")
    if f"valid: {stages} stages on 2 ranks" not in p.stdout or "plan said" not in p.stdout:
        fail("check did not re-estimate the edited plan")
    if "matches model.sha256" not in p.stdout:
        fail("check did not verify the model hash")
    updated = os.path.join(work, "updated.pbtxt")
    if run([args.plan_tool, "check", edited, "--allow-model-outside-plan", "--update", "-o", updated]).returncode != 0:
        fail("check --update failed")
    d = run([args.plan_tool, "diff", plan, updated])
    print(d.stdout)
    if f"stage 0: ops [0, {current}) -> [0, {boundary})" not in d.stdout or "step time:" not in d.stdout:
        fail("diff does not show the moved boundary and the new step time")
    for verb in (["show", updated], ["show", updated, "--json"],
                 ["simulate", updated, "--trace", os.path.join(work, "trace.json")],
                 ["dot", updated, "-o", os.path.join(work, "plan.dot")]):
        p = run([args.plan_tool] + verb)
        if p.returncode != 0:
            fail(f"rannc-plan {verb[0]} failed:\n{p.stderr}")
    trace = json.load(open(os.path.join(work, "trace.json")))
    if not any(e["ph"] == "X" and e["name"].startswith("forward") for e in trace["traceEvents"]):
        fail("the trace has no forward events")
    if shutil.which("dot"):
        p = run(["dot", "-Tsvg", os.path.join(work, "plan.dot"), "-o", os.path.join(work, "plan.svg")])
        if p.returncode != 0:
            fail(f"graphviz rejects the DOT file:\n{p.stderr}")

    # 3b. check --profile measure on a plan made with measured costs: its
    # memory figures come back as they were (Note [re-estimating a plan]),
    # but for the last bits of sums the planner took over merged units.
    if not args.interleaved:
        measured = os.path.join(work, "measured.pb")
        p = run([args.plan_tool, model, "--gpus", "2", "--device-type", "cpu", "--batch-size",
                 str(ref["batch_size"]), "--microbatches", "2", "--stages", "2", "--replicas", "1",
                 "--optimizer", args.optimizer, "-o", measured])
        if p.returncode != 0:
            fail(f"rannc-plan with measured costs failed:\n{p.stderr}")
        p = run([args.plan_tool, "check", measured, "--model", model, "--profile", "measure"])
        print(p.stdout)
        peaks = re.findall(r"^stage \d+: peak memory .*$", p.stdout, re.M)
        if p.returncode != 0 or "re-estimated with measured costs" not in p.stdout or not peaks:
            fail(f"check --profile measure did not re-estimate the measured plan:\n{p.stdout}{p.stderr}")
        if not all(re.search(r"\((unchanged|plan said [^)]*, [+-]0\.0%)\)", line) for line in peaks):
            fail("check --profile measure moved an unedited measured plan's memory:\n" + "\n".join(peaks))

    # 4. Train the edited plan: PyTorch's losses.
    log = os.path.join(work, "log.jsonl")
    if os.path.exists(log):
        os.remove(log)
    p = run(train_check.mpirun(args, 2) + [args.exec_tool, edited,
                                           "--allow-model-outside-plan", "--data", os.path.join(model_dir, "data"),
                                            "--shuffle", "off", "--steps", str(ref["steps"]), "--optimizer",
                                            args.optimizer, "--lr", repr(ref["lr"]), "--log", log])
    print(p.stderr[-3000:])
    if p.returncode != 0:
        fail(f"rannc-exec failed on the edited plan (exit {p.returncode})")
    steps = [json.loads(line) for line in open(log)]
    if len(steps) != ref["steps"]:
        fail(f"log has {len(steps)} steps, expected {ref['steps']}")
    worst = 0.0
    for rec, want in zip(steps, ref["losses"]):
        rel = abs(rec["loss"] - want) / abs(want)
        worst = max(worst, rel)
        print(f"step {rec['step']}: rannc {rec['loss']:.7f}  pytorch {want:.7f}  rel {rel:.2e}")
    print(f"max relative loss difference {worst:.3e} (tolerance {train_check.REL_TOL})")
    if worst > train_check.REL_TOL:
        fail("the edited plan's losses differ from PyTorch's")
    if args.interleaved:
        return

    # 5. Broken edits: each fails check with its own message.
    n_ops = len(json.load(open(as_json))["graph"]["ops"])

    def broken(name, edit):
        path = os.path.join(work, f"broken_{name}.pbtxt")
        open(path, "w").write(edit(open(edited).read()))
        return path

    expect_check_fails(args, broken("two_stages", lambda t: set_stage_field(t, 1, "op_begin", boundary - 3)),
                       f"stages[1].op_begin: is {boundary - 3}, expected {boundary} (ops in two stages, 0 and 1",
                       "op in two stages")
    expect_check_fails(args, broken("no_stage", lambda t: set_stage_field(t, 0, "op_end", boundary - 2)),
                       f"stages[1].op_begin: is {boundary}, expected {boundary - 2} (ops in no stage: "
                       f"[{boundary - 2}, {boundary})", "op in no stage")
    expect_check_fails(args, broken("rank_missing", lambda t: set_stage_field(t, 1, "ranks", 2)),
                       "stages[*].ranks: rank 1 in no stage", "rank missing")
    expect_check_fails(args, broken("zero_one_rank", lambda t: set_stage_field(t, 0, "zero", 1)),
                       "stages[0].zero: 1 shards the optimizer state over the stage's replicas, but it has 1",
                       "sharded optimizer state on a stage of one rank")

    def swap(t):
        t = set_stage_field(t, 0, "op_begin", boundary)
        t = set_stage_field(t, 0, "op_end", n_ops)
        t = set_stage_field(t, 1, "op_begin", 0)
        return set_stage_field(t, 1, "op_end", boundary)
    swapped = broken("swapped", swap)
    expect_check_fails(args, swapped, "computes later in the pipeline (stages out of dependency order)",
                       "stages out of dependency order")
    # rannc-exec runs the same structural checks before any training step.
    p = run(train_check.mpirun(args, 2) + [args.exec_tool, swapped,
                                           "--allow-model-outside-plan", "--synthetic", "--steps", "1"], timeout=120)
    train_check.expect_failure(p, "stages out of dependency order", "rannc-exec refuses the swapped stages")

    expect_check_fails(args, updated, "but a device holds", "memory over capacity (--device-memory)",
                       ["--device-memory", "256KiB"])
    tiny = os.path.join(work, "tiny-cluster.yaml")
    open(tiny, "w").write("nodes: 1\ndevices_per_node: 2\ndevice: {preset: cpu, memory: 256KiB}\n")
    expect_check_fails(args, updated, "but a device holds", "memory over capacity (--cluster)", ["--cluster", tiny])

    corrupt = os.path.join(work, "corrupt.pb")
    if run([args.plan_tool, "convert", edited, "-o", corrupt]).returncode != 0:
        fail("convert to .pb failed")
    blob = bytearray(open(corrupt, "rb").read())
    blob[0:16] = b"\xff" * 16
    open(corrupt, "wb").write(bytes(blob))
    expect_check_fails(args, corrupt, "corrupt.pb: not a valid binary plan", "corrupt bytes in a .pb")

    expect_check_fails(args, broken("future", lambda t: re.sub(r"^format_version: \d+$", "format_version: 99", t,
                                                                count=1, flags=re.M)),
                       "format_version: 99 is newer than this rannc understands", "a newer format_version")

    check_format_versions(args, model, ref, plan, broken, work)

    changed = os.path.join(work, "changed.onnx")
    shutil.copyfile(model, changed)
    with open(changed, "ab") as f:
        f.write(b"\0")
    expect_check_fails(args, edited, "model.sha256: " + changed, "model file changed", ["--model", changed])
    print("plan_edit_check: all passed")


if __name__ == "__main__":
    main()
