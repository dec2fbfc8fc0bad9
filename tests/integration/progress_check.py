#!/usr/bin/env python3
"""Progress while planning (issue 30, Note [progress lines]): rannc-plan says
what it is doing at least every --progress-every seconds, and --quiet turns
those lines off. Plans a model with measured costs (which takes a few seconds
here) with lines due every 0.01 s (on an idle machine the test GPT plans in
a fraction of a second), and checks the gaps between stderr lines as
they arrive.

  .venv/bin/python tests/integration/progress_check.py --plan-tool build/tools/rannc-plan \\
      --model build/models/gpt/model.onnx --work /tmp/pc
"""
import argparse
import os
import re
import subprocess
import sys
import time


def plan(a, extra):
    cmd = [a.plan_tool, a.model, "--gpus", "2", "--device-type", "cpu", "--batch-size", "8", "--profile", "measure",
           "-o", os.path.join(a.work, "plan.pb")] + extra
    print("+", " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, bufsize=1)
    start, stamps = time.monotonic(), []
    for line in p.stderr:
        stamps.append((time.monotonic() - start, line.rstrip("\n")))
    end = time.monotonic() - start
    if p.wait() != 0:
        sys.exit("rannc-plan failed:\n" + "\n".join(l for _, l in stamps[-20:]))
    return stamps, end


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    every = 0.01
    stamps, end = plan(a, ["--progress-every", str(every)])
    beats = [l for _, l in stamps if re.match(r"rannc-plan: .* \(\d+ s\)$", l)]
    for t, l in stamps:
        print(f"{t:7.2f}  {l}")
    # From the first line to the last: before it the process loads LibTorch,
    # after it exits, and neither is planning.
    times = [t for t, _ in stamps]
    check(times[-1] - times[0] > 4 * every,
          f"planning took {times[-1] - times[0]:.2f} s, long enough to need progress lines")
    check(any("costing" in l or "measuring" in l or "searching" in l or "importing" in l for l in beats),
          f"{len(beats)} progress lines say what planning is doing")
    worst = max(b - a_ for a_, b in zip(times, times[1:]))
    # Lines are due every 0.01 s; a loaded machine may delay one, never by a second.
    check(worst <= every + 0.5, f"the longest silence {worst:.2f} s (lines due every {every} s)")
    quiet, _ = plan(a, ["--quiet"])
    quiet_beats = [l for _, l in quiet if re.match(r"rannc-plan: .* \(\d+ s\)$", l) and "stage DP" not in l]
    check(not quiet_beats, f"--quiet: no progress lines ({quiet_beats[:2]})")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("progress_check: all checks passed")


if __name__ == "__main__":
    main()
