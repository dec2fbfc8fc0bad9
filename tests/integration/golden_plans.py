#!/usr/bin/env python3
"""Plans are byte-identical across refactors: every model the tests build, planned
from a saved profile, against the fingerprints in tests/golden/plans/.

Two kinds of case:
- measured: the small models committed in tests/golden/plans/ (their bytes are
  fixed, so their saved measured profiles `rannc-plan profile` wrote stay valid),
  planned from those profiles;
- analytic: every model file (.onnx, .pt, .pt2) of every model folder the tests
  build, planned with `--profile analytic` in a few cluster configurations.

Each plan is written as .pbtxt into the folder it is planned from, the models folder
(a plan records its model relative to itself, so the model path in it is the same
relative one), read, and removed there; and fingerprinted by SHA-256 after blanking the model files'
SHA-256 lines: the test-built models hold weights drawn from the CPU's RNG paths,
and only the graph, not the weight bytes, decides a plan. The golden file keeps the
fingerprint and the `show --json` summary of each plan, so a difference names
what moved. After an intended change of plans (or a new PyTorch exporter):

    RANNC_UPDATE_GOLDEN=1 ctest -R golden_plans     # rewrites the golden file; review its diff

    .venv/bin/python tests/integration/golden_plans.py --plan-tool build/tools/rannc-plan \
        --models build/models --work /tmp/golden [--update] mlp bert gpt ...   # GOLDEN_MODELS
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_DIR = os.path.join(HERE, "..", "golden", "plans")
GOLDEN = os.path.join(GOLDEN_DIR, "plans.json")

# The `cpu` preset takes its memory from this machine's RAM (shared by the
# ranks), which the plan records: the CPU cases fix it, so that a plan's bytes
# do not depend on the machine that runs the test (its cores still do; the
# machines this project runs on have 2).
CPU_MEMORY = ["--device-memory", "4GiB"]

# Cluster configurations the analytic cases run in: the DP choosing everything
# on CPUs; GPUs in fp16, where recomputation and ZeRO are choices; a pinned layout.
ANALYTIC_CONFIGS = {
    "cpu4": ["--gpus", "4", "--device-type", "cpu", "--batch-size", "32", *CPU_MEMORY],
    "a100x16_fp16": ["--gpus", "16", "--device-type", "a100-80g", "--precision", "fp16", "--batch-size", "64"],
    "pinned_2x2_gpipe": ["--gpus", "4", "--device-type", "cpu", "--batch-size", "16", "--stages", "2",
                         "--replicas", "2", "--schedule", "gpipe", "--microbatches", "4", *CPU_MEMORY],
}

# The committed models with measured profiles: name -> (model file, profile, plan flags).
MEASURED = {
    "mlp_cpu4": ("mlp.onnx", "mlp.cpu.profile.pb", ["--gpus", "4", "--device-type", "cpu", "--batch-size", "32",
                                                    *CPU_MEMORY]),
    "mlp_pinned_1f1b": ("mlp.onnx", "mlp.cpu.profile.pb",
                        ["--gpus", "2", "--device-type", "cpu", "--batch-size", "32", "--stages", "2",
                         "--schedule", "1f1b", "--microbatches", "4", *CPU_MEMORY]),
    "gpt_small_cpu4": ("gpt_small.onnx", "gpt_small.cpu.profile.pb",
                       ["--gpus", "4", "--device-type", "cpu", "--batch-size", "16", *CPU_MEMORY]),
    "gpt_small_cpu4_tight": ("gpt_small.onnx", "gpt_small.cpu.profile.pb",
                             ["--gpus", "4", "--device-type", "cpu", "--batch-size", "16",
                              "--device-memory", "2MiB", "--optimizer", "adam"]),
}

# What the golden file keeps of `show --json`, to say what moved when a plan differs.
SUMMARY_KEYS = ["world_size", "num_stages", "global_batch_size", "microbatches", "schedule",
                "predicted_step_time_s"]
STAGE_KEYS = ["ranks", "num_ops", "peak_memory_bytes"]

SHA_LINE = re.compile(r'^(\s*sha256: )"[0-9a-f]{64}"$', re.M)


def fingerprint(plan_text):
    return hashlib.sha256(SHA_LINE.sub(r'\1"-"', plan_text).encode()).hexdigest()


def plan(tool, cwd, model, flags, name):
    out = os.path.join(cwd, name)  # beside the models: the recorded path is `model` (Note [plan model path])
    cmd = [tool, model, *flags, "-o", out]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"
    try:
        with open(out) as f:
            text = f.read()
        show = subprocess.run([tool, "show", out, "--json"], capture_output=True, text=True, check=True)
    finally:
        os.remove(out)
    full = json.loads(show.stdout)
    summary = {k: full[k] for k in SUMMARY_KEYS}
    summary["stages"] = [{k: s[k] for k in STAGE_KEYS} for s in full["stages"]]
    return {"fingerprint": fingerprint(text), "summary": summary}, None


def cases(models_dir, model_dirs, work):
    """(name, cwd, model path relative to cwd, flags) for every case."""
    golden_models = os.path.join(work, "golden_models")
    os.makedirs(golden_models, exist_ok=True)
    for name, (model, profile, flags) in MEASURED.items():
        for f in (model, profile):
            shutil.copyfile(os.path.join(GOLDEN_DIR, f), os.path.join(golden_models, f))
        # --no-fuse: the profiles were measured on the graph as exported, and a
        # profile fits only the units it was measured on (fusion changes them:
        # Note [pattern fusion]); the analytic cases plan the fused graphs.
        yield f"measured/{name}", golden_models, model, [*flags, "--profile", profile, "--no-fuse"]
    for d in model_dirs:
        folder = os.path.join(models_dir, d)
        if not os.path.isdir(folder):
            sys.exit(f"golden_plans: {folder} is missing (its make_model_{d} fixture did not run)")
        files = sorted(f for f in os.listdir(folder) if f.endswith((".onnx", ".pt", ".pt2")))
        for f in files:
            extra = ["--data", f"{d}/data"] if f.endswith(".pt") and os.path.isdir(os.path.join(folder, "data")) else []
            for cfg, flags in ANALYTIC_CONFIGS.items():
                yield f"analytic/{d}/{f}/{cfg}", models_dir, f"{d}/{f}", [*flags, *extra, "--profile", "analytic"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--models", required=True, help="the folder the make_model_* fixtures write")
    ap.add_argument("--work", required=True)
    ap.add_argument("model_dirs", nargs="+", help="the model folders to plan (tests/CMakeLists.txt's GOLDEN_MODELS)")
    ap.add_argument("--jobs", type=int, default=2, help="plans made at once")
    ap.add_argument("--update", action="store_true", help="rewrite the golden file (also RANNC_UPDATE_GOLDEN=1)")
    a = ap.parse_args()
    update = a.update or bool(os.environ.get("RANNC_UPDATE_GOLDEN"))
    tool = os.path.abspath(a.plan_tool)
    models = os.path.abspath(a.models)
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)

    got = {}
    todo = list(cases(models, a.model_dirs, work))
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        runs = [pool.submit(plan, tool, cwd, model, flags, f".golden_plan{i}.pbtxt")
                for i, (name, cwd, model, flags) in enumerate(todo)]
        for (name, *_), run in zip(todo, runs):
            result, err = run.result()
            got[name] = result if result else {"error": err}
            print(f"{name}: {result['fingerprint'][:16] if result else err}", flush=True)

    if update:
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"golden_plans: wrote {len(got)} cases to {os.path.relpath(GOLDEN)}")
        return
    with open(GOLDEN) as f:
        want = json.load(f)
    bad = []
    for name in sorted(set(want) | set(got)):
        if name not in got:
            bad.append(f"{name}: in the golden file, not made now")
        elif name not in want:
            bad.append(f"{name}: made now, not in the golden file")
        elif got[name] != want[name]:
            w, g = want[name], got[name]
            detail = ""
            if "summary" in w and "summary" in g:
                keys = sorted(k for k in set(w["summary"]) | set(g["summary"])
                              if w["summary"].get(k) != g["summary"].get(k))
                detail = f" (summary keys that differ: {', '.join(keys) or 'none; only the plan bytes'})"
            else:
                detail = f" (golden: {w.get('error', 'a plan')}; now: {g.get('error', 'a plan')})"
            bad.append(f"{name}: the plan differs{detail}")
    if bad:
        print("\n".join(bad))
        sys.exit(f"golden_plans: {len(bad)} of {len(want)} cases differ from {GOLDEN} "
                 "(RANNC_UPDATE_GOLDEN=1 rewrites it after an intended change)")
    print(f"golden_plans: all {len(got)} plans are byte-identical to the golden fingerprints")


if __name__ == "__main__":
    main()
