#!/usr/bin/env python3
"""Weightless models (Note [weightless models] in planner/import/onnx_weights.cpp).

--case plan-100b   models/make_large.py writes a ~100-billion-parameter BERT
                   (hidden 8192, 128 layers) without weights in seconds;
                   rannc-plan imports and plans it for 256 A100-80G in bounded
                   time, and `show --json` counts exactly the parameters the
                   generator declared (computed there from the dims).
--case train       a tiny weightless BERT (external data file absent) and
                   ResNet (dims only, BatchNorm buffers too): rannc-exec refuses
                   them with one clear line, trains them with --init-weights,
                   to the same losses on 1 rank and on a 2-stage pipeline (the
                   initial weights do not depend on the plan), and to other
                   losses with another seed.
--case tp-vocab    a weightless GPT of Megatron's vocabulary (51,200;
                   --gpt-flags=--untied for an output layer of its own)
                   planned at --tensor-parallel 2 on one stage: each device
                   holds half of the word embedding and of the output layer
                   (Note [vocabulary parallelism] in planner/sharding/vocab.cpp);
                   what stays whole is no more than the position table and
                   the per-layer vectors.
--case external-data  the GPT test model re-saved with its weights in an ONNX
                   external data file trains to PyTorch's losses (the file is
                   read), and fails clearly once that file is gone.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REL_TOL = 1e-4


def run(cmd, timeout=300):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)


def must(p, what):
    if p.returncode != 0:
        sys.exit(f"{what} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def make_large(args, *flags):
    p = must(run([args.python, os.path.join(args.root, "models", "make_large.py")] + list(flags)), "make_large.py")
    return json.loads(p.stdout)


def mpirun(args, ranks):
    return [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]


def losses(log):
    return [json.loads(line)["loss"] for line in open(log)]


def expect_failure(p, needles, what):
    out = p.stdout + p.stderr
    if p.returncode == 0:
        sys.exit(f"{what}: expected a non-zero exit, got 0")
    for needle in needles:
        if needle not in out:
            sys.exit(f"{what}: expected a message containing '{needle}', got:\n{out[-3000:]}")
    print(f"ok: {what}")


# --------------------------------------------------------------------------- plan-100b

def plan_100b(args, work):
    model = os.path.join(work, "bert100b.onnx")
    t0 = time.time()
    info = make_large(args, "bert", "--layers", "128", "--hidden", "8192", "--heads", "64", "--seq-len", "512",
                      "--vocab", "30522", "-o", model)
    gen_s = time.time() - t0
    size = os.path.getsize(model)
    print(f"generated {info['params']} parameters, {info['nodes']} ops, {size} bytes in {gen_s:.1f} s")
    if not 95e9 <= info["params"] <= 110e9:
        sys.exit(f"the generator made {info['params']} parameters, not ~100 billion")
    if size > 16 << 20:
        sys.exit(f"the weightless model is {size} bytes; it should hold no weights")
    if gen_s > 30:
        sys.exit(f"generating took {gen_s:.1f} s (limit 30 s)")
    plan = os.path.join(work, "bert100b.pb")
    t0 = time.time()
    must(run([args.plan_tool, model, "--gpus", "256", "--device-type", "a100-80g", "--profile", "analytic",
              "-o", plan], timeout=args.plan_limit + 60), "rannc-plan")
    plan_s = time.time() - t0
    print(f"import + plan took {plan_s:.1f} s")
    if plan_s > args.plan_limit:
        sys.exit(f"import + plan took {plan_s:.1f} s (limit {args.plan_limit} s)")
    shown = json.loads(must(run([args.plan_tool, "show", plan, "--json"]), "rannc-plan show").stdout)
    num = sum(s["num_params"] for s in shown["stages"])
    param_bytes = sum(s["param_bytes"] for s in shown["stages"])
    print(f"plan: {shown['num_stages']} stages on {shown['world_size']} ranks, {num} parameters, "
          f"{param_bytes} parameter bytes, peak {max(s['peak_memory_bytes'] for s in shown['stages'])} of "
          f"{shown['stages'][0]['memory_capacity_bytes']} bytes per device")
    if num != info["params"]:
        sys.exit(f"the plan counts {num} parameters, the model has {info['params']}")
    # Each device of a t-way tensor-parallel stage holds 1/t of the split
    # weights and all of the rest: between 4 num / t and 4 num bytes, exactly
    # 4 num without tensor parallelism.
    for s in shown["stages"]:
        t, whole = s.get("tensor_parallel", 1), 4 * s["num_params"]
        if not (whole / t <= s["param_bytes"] <= whole) or (t == 1 and s["param_bytes"] != whole):
            sys.exit(f"stage {s['id']} (tensor parallel {t}) holds {s['param_bytes']} parameter bytes per device "
                     f"for {s['num_params']} parameters")
    for s in shown["stages"]:
        if s["peak_memory_bytes"] > s["memory_capacity_bytes"]:
            sys.exit(f"stage {s['id']} does not fit: {s['peak_memory_bytes']} > {s['memory_capacity_bytes']}")
    if shown["num_stages"] < 2:
        sys.exit("a 100-billion-parameter model cannot fit one 80 GB device: expected a pipeline")


# --------------------------------------------------------------------------- tp-vocab

def tp_vocab(args, work):
    layers, hidden, seq, vocab, t = 2, 256, 256, 51200, 2
    model = os.path.join(work, "gpt.onnx")
    info = make_large(args, "gpt", "--layers", str(layers), "--hidden", str(hidden), "--heads", "8", "--seq-len",
                      str(seq), "--vocab", str(vocab), *args.gpt_flags.split(), "-o", model)
    plan = os.path.join(work, "gpt-tp2.pb")
    must(run([args.plan_tool, model, "--gpus", str(t), "--device-type", "a100-80g", "--profile", "analytic",
              "--batch-size", "8", "--stages", "1", "--replicas", "1", "--tensor-parallel", str(t), "-o", plan]),
         "rannc-plan")
    stage = json.loads(must(run([args.plan_tool, "show", plan, "--json"]), "rannc-plan show").stdout)["stages"][0]
    whole = 4 * info["params"]
    # param_bytes = (whole - kept) / t + kept, for the `kept` bytes not split.
    kept = (t * stage["param_bytes"] - whole) / (t - 1)
    # Position table, two LayerNorms and two row-parallel biases per layer, the final LayerNorm.
    bound = 4 * (seq * hidden + 6 * layers * hidden + 2 * hidden)
    print(f"{info['params']} parameters; each device holds {stage['param_bytes']} of {whole} bytes; "
          f"{kept:.0f} bytes not split (bound {bound}; the word embedding alone is {4 * vocab * hidden})")
    if stage.get("tensor_parallel") != t:
        sys.exit(f"the stage is not {t}-way tensor parallel: {stage}")
    if not 0 <= kept <= bound:
        sys.exit(f"{kept:.0f} parameter bytes are held whole on each device; at most {bound} should be "
                 "(the word embedding and the tied output layer are cut by vocabulary)")


# --------------------------------------------------------------------------- train

def write_data(work, name, arrays):
    """Random data (synthetic labels would all be class 0, learnt in one step)."""
    import numpy as np
    folder = os.path.join(work, name + "-data")
    os.makedirs(folder, exist_ok=True)
    for input_name, a in arrays.items():
        np.save(os.path.join(folder, input_name + ".npy"), a)
    return folder


def train_case(args, work, name, flags, batch, data):
    model = os.path.join(work, name + ".onnx")
    make_large(args, *flags, "-o", model)
    data = write_data(work, name, data)
    runs = {}
    for layout, ranks, extra in (("1rank", 1, []), ("2stages", 2, ["--stages", "2", "--replicas", "1"])):
        plan = os.path.join(work, f"{name}-{layout}.pb")
        must(run([args.plan_tool, model, "--gpus", str(ranks), "--device-type", "cpu", "--batch-size", str(batch),
                  "--microbatches", "1", "--profile", "analytic", "-o", plan] + extra), "rannc-plan")
        base = mpirun(args, ranks) + [args.exec_tool, plan,
                                      "--allow-model-outside-plan", "--data", data, "--shuffle", "off", "--steps", "3",
                                      "--optimizer", "sgd", "--lr", "0.01"]
        if layout == "1rank":
            expect_failure(run(base), ["holds no weights", "--init-weights SEED"],
                           f"{name}: weightless model without --init-weights")
        for seed in (7, 8):
            log = os.path.join(work, f"{name}-{layout}-{seed}.jsonl")
            must(run(base + ["--init-weights", str(seed), "--log", log]), f"{name} {layout} --init-weights {seed}")
            runs[(layout, seed)] = losses(log)
    print(f"{name}: {runs}")
    for (layout, seed), got in runs.items():
        want = runs[("1rank", seed)]
        for k, (g, w) in enumerate(zip(got, want)):
            if abs(g - w) > REL_TOL * abs(w):
                sys.exit(f"{name}: step {k}, {layout} seed {seed}: loss {g} differs from 1 rank's {w}")
    if abs(runs[("1rank", 7)][0] - runs[("1rank", 8)][0]) < 1e-6:
        sys.exit(f"{name}: seeds 7 and 8 start from the same loss; the seed is ignored")
    if any(l != l for l in runs[("1rank", 7)]):
        sys.exit(f"{name}: non-finite loss")
    print(f"ok: {name} trains from --init-weights, the same on 1 rank and 2 stages")


def train(args, work):
    import numpy as np
    rng = np.random.RandomState(0)
    train_case(args, work, "bert_tiny",
               ["bert", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "8", "--vocab", "50"], 4,
               {"input_ids": rng.randint(0, 50, (16, 8)), "labels": rng.randint(0, 50, (16, 8))})
    train_case(args, work, "resnet_tiny",
               ["resnet", "--depth", "18", "--width", "1", "--image-size", "32", "--classes", "10", "--weights",
                "none"], 4,
               {"x": rng.standard_normal((16, 3, 32, 32)).astype(np.float32), "y": rng.randint(0, 10, 16)})


# --------------------------------------------------------------------------- external-data

def external_data(args, work):
    import onnx
    src = os.path.join(args.models, args.model)
    model = os.path.join(work, "model.onnx")
    m = onnx.load(os.path.join(src, "model.onnx"))
    if os.path.exists(os.path.join(work, "model.weights")):
        os.remove(os.path.join(work, "model.weights"))
    onnx.save_model(m, model, save_as_external_data=True, all_tensors_to_one_file=True, location="model.weights",
                    size_threshold=0)
    if os.path.getsize(model) > os.path.getsize(os.path.join(work, "model.weights")):
        sys.exit("the re-saved model keeps its weights inline; the test would prove nothing")
    ref = json.load(open(os.path.join(src, "reference_sgd.json")))
    plan = os.path.join(work, "plan.pb")
    must(run([args.plan_tool, model, "--gpus", "2", "--device-type", "cpu", "--batch-size", str(ref["batch_size"]),
              "--profile", "analytic", "-o", plan]), "rannc-plan")
    log = os.path.join(work, "log.jsonl")
    cmd = mpirun(args, 2) + [args.exec_tool, plan,
                             "--allow-model-outside-plan", "--data", os.path.join(src, "data"), "--shuffle", "off",
                             "--steps", str(ref["steps"]), "--optimizer", "sgd", "--lr", repr(ref["lr"])]
    must(run(cmd + ["--log", log]), "rannc-exec")
    worst = max(abs(g - w) / abs(w) for g, w in zip(losses(log), ref["losses"]))
    print(f"external data: max relative loss difference {worst:.3e} over {len(ref['losses'])} steps")
    if len(losses(log)) != ref["steps"] or worst > REL_TOL:
        sys.exit("losses with external data differ from PyTorch's")
    os.remove(os.path.join(work, "model.weights"))
    # The plan recorded the file's SHA-256 (Note [model identity]): its
    # absence is a changed model. Planned without it, the model is weightless.
    expect_failure(run(cmd), ["model.weights: the external data the plan recorded is missing"],
                   "external data file removed after planning")
    must(run([args.plan_tool, model, "--gpus", "2", "--device-type", "cpu", "--batch-size", str(ref["batch_size"]),
              "--profile", "analytic", "-o", plan]), "rannc-plan")
    expect_failure(run(cmd), ["model.weights' does not exist", "--init-weights"], "external data file removed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", required=True, choices=["plan-100b", "train", "external-data", "tp-vocab"])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--models", help="folder of make_model.py models (external-data)")
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--work", required=True)
    ap.add_argument("--gpt-flags", default="", help="more make_large.py flags for tp-vocab (--untied)")
    ap.add_argument("--plan-limit", type=float, default=60, help="seconds import + plan of the 100B model may take")
    args = ap.parse_args()
    work = os.path.join(args.work, args.case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    {"plan-100b": plan_100b, "train": train, "external-data": external_data, "tp-vocab": tp_vocab}[args.case](args, work)


if __name__ == "__main__":
    main()
