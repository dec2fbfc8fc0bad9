"""rannc-exec --gpu-transport rehearsal with one rank's NCCL calls reordered
(Note [rehearsal] in executor/comm/rehearsal.h): rank 1 issues the first two
gradient buckets' all-reduces of its replica group swapped (RANNC_REHEARSAL's
test hook). The stand-in must stop the job within seconds, naming the
communicator, the call and what each rank issued, where NCCL would hang or sum
the wrong buckets."""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_check import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seconds", type=float, default=30,
                    help="the run's bound, start-up included (a few seconds on a quiet machine): half the stand-in's "
                         "60 s stall time, so the mismatch check, not the stall report, must have stopped it")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    model_dir = os.path.join(args.models, "gpt")
    plan = os.path.join(args.work, "plan.pb")
    p = run([args.plan_tool, os.path.join(model_dir, "model.onnx"), "--gpus", "2", "--device-type", "cpu",
             "--batch-size", "8", "--microbatches", "2", "--profile", "analytic", "--schedule", "1f1b",
             "--stages", "1", "--replicas", "2", "-o", plan], timeout=300)
    if p.returncode != 0:
        sys.exit(f"rannc-plan failed:\n{p.stderr}")
    env = dict(os.environ, RANNC_REHEARSAL="swap=1:1")
    start = time.monotonic()
    try:
        p = run([args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", args.exec_tool, plan, "--model",
                 os.path.join(model_dir, "model.onnx"), "--data",
                 os.path.join(model_dir, "data"), "--steps", "2", "--gpu-transport", "rehearsal",
                 "--bucket-size", "0.02"], env=env, timeout=120)
    except subprocess.TimeoutExpired:
        sys.exit("the reordered run hung (killed after 120 s)")
    elapsed = time.monotonic() - start
    out = p.stdout + p.stderr
    print(out[-3000:])
    if p.returncode == 0:
        sys.exit("the reordered run succeeded: the stand-in let a reordered collective through")
    # Communicators 0 and 1 are the pipeline's channels (messages only); 2 the replicas' sums.
    want = re.compile(r"NCCL calls out of order on device communicator 2 \(world ranks 0,1\): its collective #1 is "
                      r"rank 0: ncclAllReduce of (\d+) floats \(sum\); rank 1: ncclAllReduce of (\d+) floats \(sum\)")
    if not want.search(out):
        sys.exit(f"expected the stand-in's mismatch message ({want.pattern}), got:\n{out}")
    if elapsed > args.seconds:
        sys.exit(f"the mismatch stopped the job after {elapsed:.1f} s, more than {args.seconds} s")
    print(f"ok: the reorder was reported and the job stopped after {elapsed:.1f} s")


if __name__ == "__main__":
    main()
