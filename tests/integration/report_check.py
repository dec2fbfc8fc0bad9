#!/usr/bin/env python3
"""rannc-plan report (issue 30): the page of a 2-stage plan with the measured
run of it, opened in headless Chromium (Debian's), and what it rendered
checked: the script ran to its end (no error stopped it), one table row per
stage, both timelines drawn with the actions of both ranks, memory bars, the
stage graph as SVG, nothing fetched from the network; and a screenshot taken.

  .venv/bin/python tests/integration/report_check.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --model build/models/gpt/model.onnx --work /tmp/rc
Exits 77 (skipped) where no chromium is installed (tools/setup.sh installs it).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, text=True, capture_output=True, timeout=300, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def chromium(args, profile):
    # As root Chromium needs --no-sandbox; its own profile folder keeps
    # concurrent runs apart.
    return [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"] + args


def main():
    global CHROMIUM
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--screenshot", help="also keep the screenshot here")
    a = ap.parse_args()
    CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
    if not CHROMIUM:
        print("SKIPPED: no chromium (tools/setup.sh installs Debian's)")
        sys.exit(77)
    os.makedirs(a.work, exist_ok=True)
    plan = os.path.join(a.work, "plan.pb")
    run([a.plan_tool, a.model, "--gpus", "2", "--device-type", "cpu", "--stages", "2", "--schedule", "1f1b",
         "--batch-size", "8", "--microbatches", "4", "--profile", "analytic", "--optimizer", "sgd", "--quiet",
         "-o", plan])
    trace = os.path.join(a.work, "trace.json")
    run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", a.exec_tool, plan, "--synthetic", "--steps",
         "3", "--trace", trace, "--allow-model-outside-plan"])  # the plan sits apart from the test's model
    page = os.path.join(a.work, "plan.html")
    run([a.plan_tool, "report", plan, "--trace", trace, "-o", page])
    html = open(page).read()

    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    # Self-contained: no script, style, image or link fetched from anywhere.
    fetched = re.findall(r'(?:src|href)\s*=\s*"(?!#)[^"]*"', html) + re.findall(r"@import|url\(", html)
    check(not fetched, f"nothing fetched: {fetched[:3]}")
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(chromium(["--dump-dom", "file://" + os.path.abspath(page)], profile), text=True,
                             capture_output=True, timeout=120)
    check(dom.returncode == 0, f"chromium --dump-dom exits 0 ({dom.returncode})")
    dom_text = dom.stdout
    errors = [l for l in dom.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    check(not errors, f"no script errors or console messages: {errors[:3]}")
    check('data-rendered="2"' in dom_text, "the script ran to its end and counted 2 stage rows")
    check(len(re.findall(r'<tr class="stage-row"', dom_text)) == 2, "one stage-table row per stage")
    for kind in ("predicted", "measured"):
        m = re.search(r'<svg class="timeline" data-kind="' + kind + r'".*?</svg>', dom_text, re.S)
        rects = re.findall(r'<rect class="ev[^"]*" data-cat="([a-z-]+)"', m.group(0)) if m else []
        check(m is not None and {"forward", "backward"} <= set(rects),
              f"the {kind} timeline draws forwards and backwards ({len(rects)} actions)")
        lanes = re.findall(r"<text[^>]*>rank (\d) \(stage \d\)</text>", m.group(0)) if m else []
        check(sorted(lanes) == ["0", "1"], f"the {kind} timeline has a lane per rank ({lanes})")
    check(len(re.findall(r'<rect class="mem"', dom_text)) >= 4, "memory bars by kind for both stages")
    graph = re.search(r'<div id="stage-graph">\s*<svg.*?</svg>', dom_text, re.S)
    check(graph is not None and graph.group(0).count('class="cluster"') == 2, "the stage graph: an SVG of 2 stages")
    check('id="compare-table"' in dom_text and "step time" in dom_text, "the predicted-vs-measured table")

    shot = os.path.join(a.work, "plan.png")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(chromium([f"--screenshot={shot}", "--window-size=1150,2200", "--hide-scrollbars",
                                 "file://" + os.path.abspath(page)], profile), capture_output=True, timeout=120)
    png = open(shot, "rb").read() if os.path.exists(shot) else b""
    check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000, f"a screenshot ({len(png)} bytes)")
    if a.screenshot and png:
        shutil.copyfile(shot, a.screenshot)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("report_check: all checks passed")


if __name__ == "__main__":
    main()
