#!/usr/bin/env python3
"""The plan records its model (format, inputs, SHA-256 of the model file and
of every external data file it reads weights from) and the tools hold it to
that: `rannc-plan check` and `rannc-exec` refuse a model whose external data
changed since planning, naming the file, before any step. The model is one
the dynamo exporter wrote with its weights in external data
(models/make_model.py --dynamo-onnx); a TorchScript archive planned with
--data records where its input description came from; a torch.export
program records its format and inputs, and one exported without a dynamic
batch is refused with the fix."""

import argparse
import json
import os
import shutil
import subprocess
import sys


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, capture_output=True, timeout=300, **kw)


def plan_json(args, plan):
    p = run([args.plan_tool, "convert", plan, "-o", plan + ".json"])
    if p.returncode != 0:
        sys.exit(f"convert failed: {p.stderr}")
    return json.load(open(plan + ".json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    src = os.path.join(args.models, "nanogpt")
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for f in ("model_dynamo.onnx", "model_dynamo.onnx.data"):
        shutil.copyfile(os.path.join(src, f), os.path.join(work, f))
    model = os.path.join(work, "model_dynamo.onnx")
    plan = os.path.join(work, "plan.pbtxt")
    common = ["--gpus", "2", "--device-type", "cpu", "--batch-size", "8", "--profile", "analytic"]
    p = run([args.plan_tool, model, *common, "-o", plan])
    if p.returncode != 0:
        sys.exit(f"rannc-plan failed: {p.stderr}")
    ref = plan_json(args, plan)["model"]
    if ref.get("format") != "onnx" or ref.get("inputs_from") != "model":
        sys.exit(f"model record: {ref}")
    # The dynamo export has a dynamic batch and sequence (models/make_model.py: as Hugging Face exports).
    if [i["name"] for i in ref.get("inputs", [])] != ["idx", "targets"] or ref["inputs"][0]["shape"] != "[B,?]":
        sys.exit(f"inputs: {ref.get('inputs')}")
    files = ref.get("external_data", [])
    if [f["path"] for f in files] != ["model_dynamo.onnx.data"] or len(files[0]["sha256"]) != 64:
        sys.exit(f"external data not recorded: {files}")
    p = run([args.plan_tool, "check", plan, "--allow-model-outside-plan"])
    if p.returncode != 0 or "(and its external data)" not in p.stdout:
        sys.exit(f"check of the unchanged model: rc {p.returncode}\n{p.stdout}{p.stderr}")

    # One byte of one weight changes: the model file itself is the same.
    data = os.path.join(work, "model_dynamo.onnx.data")
    with open(data, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    p = run([args.plan_tool, "check", plan, "--allow-model-outside-plan"])
    if p.returncode == 0 or "model_dynamo.onnx.data: the model's external data changed" not in p.stdout + p.stderr:
        sys.exit(f"check did not name the changed external data:\n{p.stdout}{p.stderr}")
    p = run([args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", args.exec_tool, plan,
             "--allow-model-outside-plan",
             "--synthetic", "--steps", "1"])
    if p.returncode == 0 or "external data changed since planning" not in p.stderr:
        sys.exit(f"rannc-exec did not refuse the changed external data: rc {p.returncode}\n{p.stderr[-2000:]}")

    # A TorchScript archive without its own input description, planned with --data.
    plan_ts = os.path.join(work, "plan_ts.pbtxt")
    p = run([args.plan_tool, os.path.join(src, "model.pt"), *common, "-o", plan_ts])
    if p.returncode == 0 or "pass --data DIR" not in p.stderr:
        sys.exit(f"an archive without an input description planned without --data:\n{p.stderr}")
    p = run([args.plan_tool, os.path.join(src, "model.pt"), "--data", os.path.join(src, "data"), *common,
             "-o", plan_ts])
    if p.returncode != 0:
        sys.exit(f"rannc-plan --data failed: {p.stderr}")
    ref = plan_json(args, plan_ts)["model"]
    if ref.get("format") != "torchscript" or not ref.get("inputs_from", "").startswith("--data "):
        sys.exit(f"TorchScript model record: {ref}")
    empty = os.path.join(work, "empty_data")
    os.makedirs(empty)
    p = run([args.plan_tool, os.path.join(src, "model.pt"), "--data", empty, *common, "-o", plan_ts])
    if p.returncode == 0 or f"--data {empty}: forward's input 'idx'" not in p.stderr:
        sys.exit(f"--data without idx.npy was not named:\n{p.stderr}")

    # A torch.export program: its record, and a batch that is not dynamic.
    plan_pt2 = os.path.join(work, "plan_pt2.pbtxt")
    p = run([args.plan_tool, os.path.join(src, "model.pt2"), *common, "-o", plan_pt2])
    if p.returncode != 0:
        sys.exit(f"rannc-plan of the .pt2 failed: {p.stderr}")
    ref = plan_json(args, plan_pt2)["model"]
    if ref.get("format") != "torch.export" or [i["shape"] for i in ref.get("inputs", [])] != ["[B,16]", "[B,16]"]:
        sys.exit(f"torch.export model record: {ref}")
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
    import zoo
    model = zoo.build("nanogpt")
    data = [torch.from_numpy(np.load(os.path.join(src, "data", n + ".npy"))[:4]) for n in model.input_names]
    fixed = os.path.join(work, "fixed.pt2")
    torch.export.save(torch.export.export(model, tuple(data)), fixed)
    p = run([args.plan_tool, fixed, *common, "-o", plan_pt2])
    if p.returncode == 0 or "input 'idx' has a fixed first dimension" not in p.stderr:
        sys.exit(f"a .pt2 without a dynamic batch was not refused clearly:\n{p.stderr}")
    print("identity ok")


if __name__ == "__main__":
    main()
