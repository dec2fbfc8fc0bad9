#!/usr/bin/env python3
"""Predicted against measured on this machine's GPU. Profiles a model with
`rannc-plan profile --device cuda` (CUDA events, the caching allocator), plans
one rank with that profile, trains it with `rannc-exec --device cuda` on
synthetic data, and compares the log's step_time_s (median after warm-up) and
peak_memory_bytes with the plan's predicted_step_time_s and the stage's
peak_memory_bytes (show --json). Prints both ratios; fails outside the bounds.
Exits 77 (ctest: skipped) when no GPU is visible.

The model is a GPT of ~67M parameters made here (make_model.py --steps 0), not
the tests' tiny one: rannc-exec's logged peak also holds the cuBLAS/cuBLASLt
workspaces, which the caching allocator serves but the planner counts in the
device's runtime reserve, not in a stage (Note [runtime reserve]); at up to
64 MiB they must be a small part of the peak for the comparison to mean
anything (here under 2% of the ~3.9 GB the plan predicts), and kernels, not launches, should dominate the step.

Bounds: memory within --memory-tolerance (15%): the profile measures the
same allocator statistics rannc-exec logs, as memory_check.py's 10% on cpu,
plus room for those workspaces and what one unit alone does not hold (the
allocator's rounding of the whole step's tensors). Time
within a factor --time-factor (1.5) either way: the profile is calibrated
against the whole graph (Note [whole-graph calibration]), but rannc-exec's step
also pays the optimizer, the loss's host copy and logging, which are small on
a GPU next to a model's kernels only for models larger than the test's.

  .venv/bin/python tests/integration/gpu_cost_check.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --model build/models/gpt/model.onnx --work /tmp/gc
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

SKIPPED = 77


def run(cmd, timeout=600):
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def gpu_memory_mib():
    """Total memory of GPU 0 (as CUDA_VISIBLE_DEVICES orders them), from nvidia-smi."""
    p = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                       text=True, capture_output=True, timeout=60)
    if p.returncode != 0 or not p.stdout.strip():
        sys.exit(f"nvidia-smi could not report GPU 0's memory:\n{p.stderr}")
    return int(p.stdout.split()[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--model", help="an .onnx model (default: make a ~67M-parameter GPT in --work)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--memory-tolerance", type=float, default=0.15)
    ap.add_argument("--time-factor", type=float, default=1.5)
    a = ap.parse_args()

    version = subprocess.run([a.exec_tool, "--version"], text=True, capture_output=True, timeout=120).stdout
    visible = [ln for ln in version.splitlines() if ln.startswith("GPUs visible:")]
    if not visible:
        sys.exit(f"rannc-exec --version printed no 'GPUs visible:' line:\n{version}")
    if int(visible[0].split(":", 1)[1]) == 0:
        print("SKIPPED: no GPU visible to rannc-exec (--version says 'GPUs visible: 0')")
        sys.exit(SKIPPED)

    os.makedirs(a.work, exist_ok=True)
    if not a.model:
        maker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "make_model.py")
        out = os.path.join(a.work, "gpt67m")
        run([sys.executable, maker, "--model", "gpt", "--layers", "4", "--hidden", "1024", "--heads", "16",
             "--seq-len", "256", "--vocab", "8192", "--samples", "16", "--steps", "0", "--out", out])
        a.model = os.path.join(out, "model.onnx")
    # A one-device cluster of this GPU. The preset only fills the analytic
    # figures the measured profile makes unused; memory and name are this GPU's.
    name = "local-gpu"
    cluster = os.path.join(a.work, "cluster.yaml")
    with open(cluster, "w") as f:
        f.write(f"nodes: 1\ndevices_per_node: 1\ndevice:\n  preset: a100-80g\n  name: {name}\n"
                f"  memory: {gpu_memory_mib()}MiB\n")
    profile = os.path.join(a.work, "model.prof")
    sizes = sorted({b for b in (1, 2, 4, 8, a.batch_size) if b <= a.batch_size})
    p = run([a.plan_tool, "profile", a.model, "--device", "cuda", "--device-type", name, "--optimizer", "adam",
             "--batch-sizes", ",".join(map(str, sizes)), "-o", profile])
    print(p.stderr.strip().splitlines()[-1])
    plan = os.path.join(a.work, "plan.pb")
    run([a.plan_tool, a.model, "--cluster", cluster, "--profile", profile, "--batch-size", str(a.batch_size),
         "--stages", "1", "--replicas", "1", "--microbatches", "1", "--optimizer", "adam", "-o", plan])
    shown = json.loads(run([a.plan_tool, "show", plan, "--json"]).stdout)
    log = os.path.join(a.work, "log.jsonl")
    if os.path.exists(log):
        os.remove(log)
    run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "1", a.exec_tool, plan,
         "--allow-model-outside-plan", "--synthetic",
         "--steps", str(a.steps), "--optimizer", "adam", "--device", "cuda", "--log", log])
    steps = [json.loads(line) for line in open(log)]
    if len(steps) != a.steps:
        sys.exit(f"log has {len(steps)} steps, expected {a.steps}")

    warm = steps[2:] if len(steps) > 4 else steps[1:]  # CUDA context, kernels and allocator segments warm up
    measured_time = statistics.median(s["step_time_s"] for s in warm)
    predicted_time = shown["predicted_step_time_s"]
    measured_peak = max(s["peak_memory_bytes"] for s in steps)
    predicted_peak = shown["stages"][0]["peak_memory_bytes"]
    time_ratio = measured_time / predicted_time
    memory_ratio = measured_peak / predicted_peak
    print(f"step time: measured {measured_time * 1e3:.3f} ms (median of {len(warm)}), predicted "
          f"{predicted_time * 1e3:.3f} ms, measured/predicted {time_ratio:.3f} (bound {1 / a.time_factor:.2f}.."
          f"{a.time_factor:.2f})")
    print(f"peak memory: measured {measured_peak} bytes, predicted {predicted_peak:.0f}, measured/predicted "
          f"{memory_ratio:.3f} (bound 1 +- {a.memory_tolerance})")
    print(json.dumps({"time_ratio": time_ratio, "memory_ratio": memory_ratio, "measured_step_time_s": measured_time,
                      "predicted_step_time_s": predicted_time, "measured_peak_memory_bytes": measured_peak,
                      "predicted_peak_memory_bytes": predicted_peak}))
    failures = []
    if not 1 / a.time_factor <= time_ratio <= a.time_factor:
        failures.append(f"step time {time_ratio:.3f}x the prediction")
    if abs(memory_ratio - 1) > a.memory_tolerance:
        failures.append(f"peak memory {memory_ratio:.3f}x the prediction")
    if failures:
        sys.exit("prediction off: " + "; ".join(failures))


if __name__ == "__main__":
    main()
