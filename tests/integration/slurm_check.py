#!/usr/bin/env python3
"""rannc under a real Slurm (issue 30): runs docs/gpu.md's Slurm block as it
is written, on a one-node cluster this test starts and stops itself
(tools/slurm/one_node.sh: munged, slurmctld and slurmd, as root). The block
plans the mlp fixture for 4 ranks (2 stages x 2 replicas), prints each rank's
local rank as `srun` gives it, and trains 4 ranks with `srun --mpi=pmix`
(Debian's Open MPI bootstraps from Slurm's PMIx). Checks:
- every rank's local rank came from SLURM_LOCALID, 0..3 once each (what
  --device cuda picks a GPU by; Note [choosing a GPU]);
- the losses are PyTorch's (models/make_model.py's reference) within 1e-4.

The daemons are stopped whatever happens (also on SIGTERM and SIGINT), and
each command has a time limit. Needs root and Debian's slurm-wlm and munge
(tools/setup.sh installs them); without root it is skipped (exit 77).

    .venv/bin/python tests/integration/slurm_check.py --tools build/tools --models build/models --work /tmp/slurm"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DOC = os.path.join(ROOT, "docs", "gpu.md")
ONE_NODE = os.path.join(ROOT, "tools", "slurm", "one_node.sh")
MARKER = "<!-- ctest slurm_4ranks runs the next block as it is -->"
REL_TOL = 1e-4
SKIP = 77


def doc_block():
    """The shell block after MARKER in docs/gpu.md, one command a line."""
    text = open(DOC).read()
    at = text.find(MARKER)
    if at < 0:
        sys.exit(f"{DOC} has no '{MARKER}'")
    m = re.search(r"```sh\n(.*?)```", text[at:], re.S)
    if not m:
        sys.exit(f"no ```sh block after the marker in {DOC}")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", required=True, help="the folder with rannc-plan and rannc-exec")
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--timeout", type=int, default=400, help="seconds for the whole block")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIPPED: the one-node cluster runs its daemons as root")
        sys.exit(SKIP)
    missing = [b for b in ("munged", "slurmctld", "slurmd", "srun") if not shutil.which(b)]
    if missing:
        sys.exit(f"{', '.join(missing)} missing: tools/setup.sh installs Debian's slurm-wlm and munge")

    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    shutil.copytree(os.path.join(a.models, "mlp"), os.path.join(work, "mlp"))
    ref = json.load(open(os.path.join(work, "mlp", "reference_sgd.json")))
    env = dict(os.environ, PATH=os.path.abspath(a.tools) + os.pathsep + os.environ["PATH"],
               RANNC_SLURM_DIR=os.path.join(work, "slurm"))
    env.pop("SLURM_CONF", None)

    def stop(*_):
        subprocess.run(["bash", ONE_NODE, "stop"], env=env, timeout=60)

    def on_signal(sig, _frame):
        stop()
        sys.exit(f"stopped by signal {sig}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The block as docs/gpu.md shows it; only tools/ is this checkout's.
    block = doc_block().replace("tools/slurm/", os.path.join(ROOT, "tools", "slurm") + "/")
    print(block, flush=True)
    try:
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, text=True,
                           capture_output=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        stop()
        sys.exit(f"HANG: the Slurm block ran past {a.timeout} s")
    finally:
        stop()
    out = p.stdout + p.stderr
    print(out)
    if p.returncode != 0:
        for log in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = os.path.join(work, "slurm", log)
            if os.path.exists(path):
                print(f"--- {log} (end)\n" + "".join(open(path).readlines()[-15:]))
        sys.exit(f"the Slurm block failed (exit {p.returncode})")

    # Each rank's local rank, from SLURM_LOCALID.
    local = sorted(int(m) for m in re.findall(r"^Local rank: (\d+) from SLURM_LOCALID", out, re.M))
    if local != [0, 1, 2, 3]:
        sys.exit(f"expected local ranks 0..3 from SLURM_LOCALID, one per rank; got {local}")
    print("ok: the 4 ranks' local ranks are 0, 1, 2, 3, from SLURM_LOCALID")
    if "rannc-exec: 4 rank(s), 2 stage(s)" not in out:
        sys.exit("rannc-exec did not start 4 ranks in 2 stages")

    steps = [json.loads(line) for line in open(os.path.join(work, "run.jsonl"))]
    want = ref["losses"]
    if len(steps) != len(want):
        sys.exit(f"{len(steps)} steps logged, the reference has {len(want)}")
    worst = 0.0
    for rec, w in zip(steps, want):
        rel = abs(rec["loss"] - w) / abs(w)
        worst = max(worst, rel)
        print(f"step {rec['step']}: rannc {rec['loss']:.7f}  pytorch {w:.7f}  rel {rel:.2e}")
    print(f"max relative loss difference {worst:.3e} (tolerance {REL_TOL})")
    if worst > REL_TOL:
        sys.exit("the losses under srun differ from PyTorch's")
    print("slurm_check: 4 ranks under srun --mpi=pmix trained to PyTorch's losses")


if __name__ == "__main__":
    main()
