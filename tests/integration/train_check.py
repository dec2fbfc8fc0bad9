#!/usr/bin/env python3
"""Plans a model from models/ for N ranks, trains it with mpirun rannc-exec and
compares every logged loss with the losses PyTorch itself got (reference_*.json
written by models/make_model.py). With --variant, trains one of make_model.py's
optimizer variants (momentum, AdamW, schedules, clipping, accumulation) with
the flags its reference names, and compares the logged gradient norms, batch
losses and learning rates too. With --errors, checks that start-up problems
stop every rank with one clear message instead."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

REL_TOL = 1e-4
# --device-memory: each rank's measured peak tensor memory against its
# stage's predicted peak (docs/partitioner.md, "Memory of one device").
MEMORY_TOL = 0.05
# Mixed precision (--precision bf16): rannc's losses against PyTorch's own
# torch.autocast bf16 run of the same model (issue 15); and, so that the test
# fails when autocast silently does nothing, at least this far from the fp32
# run somewhere, or a quarter of PyTorch's own autocast run's distance from it
# if that is less (fp32 plans match it to ~1e-6; bf16 moves GPT's and BERT's
# losses ~5e-5, fp16 ~1e-5).
LOWP_REL_TOL = 1e-2
# --device cuda: rannc-exec on this machine's GPU against PyTorch's own run of
# the same model on that GPU (make_model.py --reference-device cuda). Both run
# fp32 with TF32 off (the reference sets torch.backends.cuda.matmul.allow_tf32
# and cudnn.allow_tf32 to False; rannc-exec never enables TF32), so they differ
# only where cuBLAS/cuDNN pick other kernels, and so other reduction orders,
# for rannc's per-op shapes than for PyTorch's fused modules: rounding of
# ~1e-7 relative per fp32 product, the same order as the cpu runs' thread and
# reassociation differences. Over the 10 steps of GPT and BERT such rounding
# moved the cpu losses by well under 1e-5, so SPEC.md's 1e-4 holds here too.
CUDA_REL_TOL = REL_TOL
SKIPPED = 77  # ctest's SKIP_RETURN_CODE for the gpu tests


def exec_version(exec_tool):
    """rannc-exec --version's "key: value" lines (SPEC.md) as a dict."""
    out = subprocess.run([exec_tool, "--version"], text=True, capture_output=True, timeout=120).stdout
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def gpus_visible(exec_tool):
    """The GPU count rannc-exec --version reports (0 without CUDA or driver)."""
    version = exec_version(exec_tool)
    if "GPUs visible" not in version:
        sys.exit(f"rannc-exec --version printed no 'GPUs visible:' line: {version}")
    return int(version["GPUs visible"])
LOWP_MIN_FP32_GAP = 1e-5


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, capture_output=True, timeout=kw.pop("timeout", 300), **kw)


def mpirun(args, ranks):
    return [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]


def plan(args, model_dir, ranks, microbatches, batch, out):
    extra = args.plan_args.split()
    if args.precision != "fp32":
        extra += ["--precision", args.precision]
    if args.device_memory:
        extra += ["--device-memory", args.device_memory, "--optimizer", args.optimizer]
    if microbatches:
        extra += ["--microbatches", str(microbatches)]
    model_file = args.model_file or ("model.pt" if args.torchscript else "model.onnx")
    if args.plan_data:
        extra += ["--data", os.path.join(model_dir, "data")]
    if args.device == "cuda":
        extra += ["--profile", "analytic"]  # costs are beside the point here: the plan's layout is pinned
    p = run([args.plan_tool, os.path.join(model_dir, model_file), "--gpus", str(ranks), "--device-type", "cpu",
             "--batch-size", str(batch), "-o", out] + extra)
    if p.returncode != 0:
        sys.exit(f"rannc-plan failed:\n{p.stderr}")
    return out


def edit_tensor_parallel(plan_path, degree):
    """Gives every stage of the text plan tensor-parallel degree `degree` (or
    stage i degree i of "N1,N2,..."), as a person editing the .pbtxt would:
    its ranks form groups of that size (Note [tensor parallel ranks] in
    executor/train/tensor_parallel.h)."""
    text = open(plan_path).read()
    text = re.sub(r"^format_version: \d+", "format_version: 3", text, flags=re.M)
    # After each stage's last `ranks:` line (two-space indent: a Stage field).
    degrees = iter(str(degree).split(","))
    last = [None]

    def add_degree(m):
        last[0] = next(degrees, last[0])
        return m.group(1) + f"  tensor_parallel: {last[0]}\n"
    text = re.sub(r"((?:^  ranks: \d+\n)+)", add_degree, text, flags=re.M)
    open(plan_path, "w").write(text)


def edit_stage_starts(args, plan_path, model_dir, starts):
    """Moves the plan's stage boundaries to op indices `starts` ("86,117,206":
    where stages 1, 2, ... begin), as a person editing the plan would, and
    re-estimates it as they would check it, with measured costs of its own
    units (rannc-plan check --update --profile measure): a plan whose
    boundaries a measured profile's timing noise cannot move."""
    as_json = plan_path + ".json"
    p = run([args.plan_tool, "convert", plan_path, "-o", as_json])
    if p.returncode != 0:
        sys.exit(f"rannc-plan convert failed:\n{p.stderr}")
    plan = json.load(open(as_json))
    stages = plan["stages"]
    begins = [0] + [int(s) for s in starts.split(",")]
    if len(begins) != len(stages):
        sys.exit(f"--edit-stage-starts {starts}: the plan has {len(stages)} stages")
    ends = begins[1:] + [stages[-1]["op_end"]]
    for stage, begin, end in zip(stages, begins, ends):
        stage["op_begin"], stage["op_end"] = begin, end
    json.dump(plan, open(as_json, "w"))
    model = os.path.join(model_dir, args.model_file or ("model.pt" if args.torchscript else "model.onnx"))
    p = run([args.plan_tool, "check", as_json, "--model", model, "--profile", "measure", "--update", "-o", plan_path])
    if p.returncode != 0:
        sys.exit(f"rannc-plan check --update --profile measure failed:\n{p.stdout}{p.stderr}")
    print(f"stages begin at ops {begins}, re-estimated with measured costs")


def edit_scatter_gather(plan_path):
    """Makes the text plan's cluster two nodes of `cuda` devices, as a person
    editing the .pbtxt would, so that rannc-exec (run with --device cpu)
    scatters and gathers the values between its tensor-parallel stages as the
    GPU cost model assumes (Note [scatter/gather in the executor] in
    executor/train/scatter_gather.h)."""
    text = open(plan_path).read()
    per_node = int(re.search(r"^  devices_per_node: (\d+)$", text, flags=re.M).group(1))
    text = re.sub(r"^  num_nodes: \d+$", "  num_nodes: 2", text, count=1, flags=re.M)
    text = re.sub(r"^  devices_per_node: \d+$", f"  devices_per_node: {per_node // 2}", text, count=1, flags=re.M)
    text = re.sub(r'^    type: "cpu"$', '    type: "cuda"', text, count=1, flags=re.M)
    open(plan_path, "w").write(text)


def cuda_reference(args, model_dir):
    """PyTorch's losses for the model on this machine's GPU (exit 77 without one)."""
    if gpus_visible(args.exec_tool) == 0:
        print("SKIPPED: no GPU visible to rannc-exec (--version says 'GPUs visible: 0')")
        sys.exit(SKIPPED)
    maker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "make_model.py")
    p = run([sys.executable, maker, "--model", args.model, "--out", model_dir, "--reference-device", "cuda"]
            + args.make_model_args.split(), timeout=600)
    if p.returncode == SKIPPED:
        print("SKIPPED: PyTorch sees no GPU")
        sys.exit(SKIPPED)
    if p.returncode != 0:
        sys.exit(f"make_model.py --reference-device cuda failed:\n{p.stderr[-3000:]}")
    print(p.stdout.strip())


def check_roles(args, model_dir):
    """--expect-roles: what rannc-plan import --tensor-parallel 2 found, per
    op, so that a plan cutting less than the model allows (the MLP only, say)
    does not pass unnoticed: its training would be exact too."""
    model_file = args.model_file or ("model.pt" if args.torchscript else "model.onnx")
    p = run([args.plan_tool, "import", os.path.join(model_dir, model_file), "--tensor-parallel", "2"])
    if p.returncode != 0:
        sys.exit(f"rannc-plan import failed:\n{p.stderr}")
    found = {}
    for line in p.stdout.splitlines():
        m = re.match(r"^  \S.*? \([\w.:]+\): ([^;]+?)\s*(?:;|$)", line)
        if m:
            found[m.group(1)] = found.get(m.group(1), 0) + 1
    for item in args.expect_roles.split(","):
        role, _, count = item.rpartition("=")
        print(f"tensor-parallel role '{role}': {found.get(role, 0)} op(s), expected {count}")
        if found.get(role, 0) != int(count):
            sys.exit(f"rannc-plan import --tensor-parallel 2 found {found}, expected {args.expect_roles}")


def check_training(args):
    model_dir = os.path.join(args.models, args.model)
    if args.expect_roles:
        check_roles(args, model_dir)
    name = args.variant or args.optimizer
    lowp = args.precision != "fp32"
    suffix = (f"_{args.precision}" if lowp else "") + ("_overflow" if args.overflow else "")
    if args.device == "cuda":
        if lowp or args.variant or args.overflow or args.torchscript or args.check_state:
            sys.exit("--device cuda compares fp32 SGD/Adam losses of an ONNX model only")
        cuda_reference(args, model_dir)
        suffix = "_cuda"
    ref = json.load(open(os.path.join(model_dir, f"reference_{name}{suffix}.json")))
    tol = LOWP_REL_TOL if lowp else CUDA_REL_TOL if args.device == "cuda" else REL_TOL
    layout = args.plan_args.replace("--", "").replace(" ", "_").replace(",", "-")
    # rannc-exec flags too: buckets_* and hybrid_* differ only there, and
    # ctest -j runs them side by side.
    if args.exec_args:
        layout += "-" + args.exec_args.replace("--", "").replace(" ", "_").replace(",", "-")
    if args.edit_scatter_gather:
        layout += "-scatter_gather"
    work = os.path.join(args.work, f"{args.model}-{args.ranks}-{name}-{args.microbatches}-{layout}"
                                   + ("-cuda" if args.device == "cuda" else "")
                                   + ("-ts" if args.torchscript else "") + (f"-{args.model_file}" if args.model_file else "")
                                   + (f"-{args.precision}" if lowp else "") + ("-overflow" if args.overflow else ""))
    os.makedirs(work, exist_ok=True)
    plan_path = plan(args, model_dir, args.ranks, args.microbatches, ref["batch_size"],
                     os.path.join(work, "plan.pbtxt" if args.edit_tensor_parallel or args.edit_scatter_gather
                                  else "plan.pb"))
    if args.edit_tensor_parallel:
        edit_tensor_parallel(plan_path, args.edit_tensor_parallel)
    if args.edit_stage_starts:
        edit_stage_starts(args, plan_path, model_dir, args.edit_stage_starts)
    if args.edit_scatter_gather:
        edit_scatter_gather(plan_path)
    # The DP may leave devices idle where more ranks would not be faster (a
    # measured profile on a busy machine); the plan runs on its own world size.
    ranks = json.loads(run([args.plan_tool, "show", plan_path, "--json"]).stdout)["world_size"]
    if ranks != args.ranks:
        print(f"the planner chose {ranks} of the {args.ranks} devices; running on {ranks}")
    log = os.path.join(work, "log.jsonl")
    train_args = ref["exec_args"] if args.variant else ["--steps", str(ref["steps"]), "--optimizer", args.optimizer,
                                                        "--lr", repr(ref["lr"])]
    # A LibTorch archive's trained weights come back as a state dict (--export-state).
    pt2 = (args.model_file or "").endswith(".pt2")
    trained = os.path.join(work, "trained.pt" if args.torchscript or pt2 else "trained.onnx")
    if args.check_state:
        train_args = train_args + ["--export-state" if args.torchscript or pt2 else "--export-onnx", trained]
    train_args = train_args + args.exec_args.split()
    if args.device == "cuda":
        train_args += ["--device", "cuda"]
    elif args.edit_scatter_gather:
        train_args += ["--device", "cpu"]  # the plan now names cuda devices
    if args.overflow:
        train_args += ["--loss-scale", repr(ref["loss_scale"])]
    p = run(mpirun(args, ranks) + [args.exec_tool, plan_path,
                                   "--allow-model-outside-plan", "--data", os.path.join(model_dir, "data"),
                                        "--shuffle", "off", "--log", log] + train_args)
    print(p.stderr[-3000:])
    if p.returncode != 0:
        sys.exit(f"rannc-exec failed with exit code {p.returncode}")
    steps = [json.loads(line) for line in open(log)]
    shown = run([args.plan_tool, "show", plan_path, "--json"])
    stages = json.loads(shown.stdout)["num_stages"]
    if args.schedule:
        got = json.loads(shown.stdout)
        if got["schedule"] != args.schedule or got["virtual_stages"] != max(1, args.virtual_stages):
            sys.exit(f"--schedule {args.schedule}: the plan runs {got['schedule']} with {got['virtual_stages']} "
                     f"virtual stage(s)")
        if f", {args.schedule}, " not in p.stderr:
            sys.exit(f"--schedule {args.schedule}: rannc-exec's start-up line names another schedule")
    if "--zero 1" in args.plan_args:
        # Sharded optimizer state: every replicated stage says so, and the log does.
        sharded = [st["zero"] for st in json.loads(shown.stdout)["stages"] if len(st["ranks"]) > 1]
        if not sharded or sharded != [1] * len(sharded):
            sys.exit(f"--zero 1: the plan's replicated stages have zero {sharded}")
        if "optimizer state sharded in stage(s)" not in p.stderr:
            sys.exit("--zero 1: rannc-exec did not say it shards the optimizer state")
    if "--recompute on" in args.plan_args:
        # Every stage recomputes: the plan says so, and the log does (a plan
        # that silently did not would pass the comparison unnoticed).
        recomputing = [st.get("recompute") for st in json.loads(shown.stdout)["stages"]]
        if not all(recomputing) or "recomputing stage(s) " + ",".join(map(str, range(stages))) not in p.stderr:
            sys.exit(f"--recompute on: the plan's stages recompute {recomputing}, or rannc-exec did not say so")
    tensor_parallel = "--tensor-parallel" in args.plan_args or args.edit_tensor_parallel
    if tensor_parallel and "tensor-parallel stage(s)" not in p.stderr:
        # Note [tensor parallel ranks]: a plan without a tensor-parallel stage would pass unnoticed.
        sys.exit("--tensor-parallel: rannc-exec did not say it runs tensor-parallel stages")
    if args.edit_scatter_gather and "scatter/gather across nodes (Megatron-LM): stage(s) 0 -> 1, 1 -> 0" not in p.stderr:
        sys.exit("--edit-scatter-gather: rannc-exec did not say it scatters between stages 0 and 1")
    if "rannc-exec: done: " not in p.stderr:
        sys.exit("rannc-exec printed no final summary")
    if len(steps) != ref["steps"]:
        sys.exit(f"log has {len(steps)} steps, expected {ref['steps']}")
    worst = 0.0
    for rec, want in zip(steps, ref["losses"]):
        for key in ("step", "loss", "samples_per_s", "step_time_s", "peak_memory_bytes", "peak_memory_bytes_per_rank"):
            if key not in rec:
                sys.exit(f"log line lacks '{key}': {rec}")
        if len(rec["peak_memory_bytes_per_rank"]) != ranks:
            sys.exit(f"peak_memory_bytes_per_rank has {len(rec['peak_memory_bytes_per_rank'])} entries")
        check_metrics(rec, stages, ranks == 1)
        if args.expect_buckets:
            early, total = rec.get("allreduce_buckets_overlapped", (0, 0))
            if total < args.expect_buckets or early < 1:
                sys.exit(f"expected >= {args.expect_buckets} all-reduce buckets, some started during backward; "
                         f"got {early} of {total}")
        rel = abs(rec["loss"] - want) / abs(want)
        worst = max(worst, rel)
        print(f"step {rec['step']}: rannc {rec['loss']:.7f}  pytorch {want:.7f}  rel {rel:.2e}")
    print(f"max relative loss difference {worst:.3e} (tolerance {tol})")
    if args.device == "cuda":
        if "cuda" not in p.stderr.lower() and "gpu" not in p.stderr.lower():
            sys.exit("rannc-exec --device cuda never said it runs on a GPU")
        if worst > tol:
            sys.exit(f"losses differ from PyTorch's run on {ref.get('device', 'the GPU')}")
        return
    if lowp:
        shown_plan = json.loads(run([args.plan_tool, "show", plan_path, "--json"]).stdout)
        if shown_plan.get("precision") != args.precision:
            sys.exit(f"show --json says precision {shown_plan.get('precision')!r}, expected {args.precision!r}")
        if f"precision {args.precision}" not in p.stderr:
            sys.exit(f"rannc-exec's start-up line does not state precision {args.precision}")
        fp32 = json.load(open(os.path.join(model_dir, f"reference_{name}.json")))["losses"]
        gap = max(abs(r["loss"] - w) / abs(w) for r, w in zip(steps, fp32))
        ref_gap = max(abs(a - w) / abs(w) for a, w in zip(ref["losses"], fp32))
        print(f"{args.precision}: max relative difference from PyTorch's fp32 run: rannc {gap:.3e}, "
              f"PyTorch autocast {ref_gap:.3e}")
        if args.overflow:  # fp16 loss scaling: the same steps skipped as PyTorch's GradScaler
            got = [r["step"] for r in steps if r.get("skipped")]
            print(f"skipped steps: rannc {got}, PyTorch {ref['skipped_steps']}")
            if got != ref["skipped_steps"] or not got:
                sys.exit(f"skipped steps {got} differ from GradScaler's {ref['skipped_steps']}")
            if p.stderr.count("gradients overflowed at loss scale") != len(got):
                sys.exit("rannc-exec did not log each overflowing step")
        if gap < min(LOWP_MIN_FP32_GAP, ref_gap / 4):
            sys.exit(f"losses match the fp32 run to {gap:.1e}: {args.precision} autocast did not take effect")
        if worst > tol:
            sys.exit(f"losses differ from PyTorch's autocast {args.precision} run")
        return
    if args.variant:
        worst = max(worst, check_variant(ref, steps))
    if args.check_state:
        worst = max(worst, check_state(trained, model_dir, name, args.torchscript, args.model_file or "model.onnx",
                                       args.model_file if pt2 else None))
    if args.device_memory:
        check_memory(args, plan_path, model_dir, ref, steps)
    if args.summary:
        times = sorted(r["step_time_s"] for r in steps[1:]) or [steps[0]["step_time_s"]]
        with open(args.summary, "w") as f:
            json.dump({"model": args.model, "ranks": ranks, "optimizer": args.optimizer,
                       "microbatches": args.microbatches, "batch_size": ref["batch_size"],
                       "median_step_time_s": times[len(times) // 2],
                       "peak_memory_bytes": max(r["peak_memory_bytes"] for r in steps),
                       "max_rel_loss_diff": worst}, f)
    if worst > REL_TOL:
        sys.exit("losses differ from PyTorch's")


def check_metrics(rec, stages, one_rank):
    """The per-stage phase times of a log line: one entry per stage, each
    phase >= 0, and on one rank the phases add up to no more than the step
    (they are disjoint intervals of it; 1 ms of slack for the clock; with
    several ranks each phase is a maximum over ranks, which need not add up). A sequence
    model's tokens/s is samples/s times its tokens per sample."""
    times = rec.get("stage_times_s")
    if not isinstance(times, list) or [t.get("stage") for t in times] != list(range(stages)):
        sys.exit(f"stage_times_s does not list stages 0..{stages - 1}: {times}")
    for t in times:
        phases = [t[k] for k in ("forward_s", "backward_s", "comm_s", "update_s")]
        if min(phases) < 0 or t["forward_s"] <= 0 or t["backward_s"] <= 0:
            sys.exit(f"implausible phase times {t}")
        if one_rank and sum(phases) > rec["step_time_s"] + 1e-3:
            sys.exit(f"phases add up to {sum(phases)} s, more than the step's {rec['step_time_s']} s")
    if "tokens_per_s" in rec:
        per_sample = rec["tokens_per_s"] / rec["samples_per_s"]
        if abs(per_sample - round(per_sample)) > 1e-6 or round(per_sample) < 2:
            sys.exit(f"tokens_per_s / samples_per_s = {per_sample}, not a whole sequence length")


def check_state(trained, model_dir, name, torchscript=False, model_file="model.onnx", pt2=None):
    """Every trained parameter and BatchNorm running statistic of the exported
    model against PyTorch's (reference_<opt>_{params,buffers}.npz), per tensor
    max|a - b| / max(max|b|, 1e-3) (Adam: the 2-norm, see below): the floor keeps rounding noise on tensors
    that are mathematically 0 (a BatchNorm bias feeding another BatchNorm, the
    running mean of a 1x1 convolution of normalized input: ~1e-9 in both) from
    counting as a difference (real tensors here are above 5e-4 after a step). The buffers' reference holds the statistics as ONNX
    updates them (models/make_model.py: track_onnx_running_stats); a buffer
    left at its initial value fails. Returns the worst difference."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    if torchscript:
        # --export-state's dict (torch.load), from the archive's own weights;
        # buffers are PyTorch's own (the model runs aten::batch_norm itself).
        import torch
        got = {k: v.numpy() for k, v in torch.load(trained).items()}
        module = torch.jit.load(os.path.join(model_dir, "model.pt"))
        start = {k: v.detach().numpy() for k, v in list(module.named_parameters()) + list(module.named_buffers())}
        buffers = os.path.join(model_dir, f"reference_{name}_torch_buffers.npz")
    elif pt2:
        # A torch.export program (model file `pt2`): its state dict and its
        # lifted constants (non-persistent buffers) are where training starts.
        import torch
        got = {k: v.numpy() for k, v in torch.load(trained).items()}
        program = torch.export.load(os.path.join(model_dir, pt2))
        start = {k: v.detach().numpy() for k, v in list(program.state_dict.items()) + list(program.constants.items())
                 if isinstance(v, torch.Tensor)}
        buffers = os.path.join(model_dir, f"reference_{name}_torch_buffers.npz")
        # Buffers forward never reads (Llama's original_inv_freq) have no
        # PyTorch reference: unchanged, there is nothing to compare.
        compared = set(np.load(os.path.join(model_dir, f"reference_{name}_params.npz")))
        compared |= set(np.load(buffers)) if os.path.exists(buffers) else set()
        got = {k: v for k, v in got.items() if k in compared or not np.array_equal(v, start.get(k))}
        # Non-persistent buffers are not in the user's state_dict, so the
        # export leaves them out (load_state_dict(strict=True) accepts it).
        transient = {spec.target for spec in program.graph_signature.input_specs
                     if spec.kind.name == "BUFFER" and not spec.persistent}
    else:
        got = {i.name: numpy_helper.to_array(i) for i in onnx.load(trained).graph.initializer}
        start = {i.name: numpy_helper.to_array(i)
                 for i in onnx.load(os.path.join(model_dir, model_file)).graph.initializer}
        buffers = os.path.join(model_dir, f"reference_{name}_buffers.npz")
    want = dict(np.load(os.path.join(model_dir, f"reference_{name}_params.npz")))
    n_buffers = 0
    if os.path.exists(buffers):
        b = dict(np.load(buffers))
        n_buffers = len(b)
        want.update(b)
    if pt2:
        want = {k: v for k, v in want.items() if k not in transient}
    # A tied parameter is named in a dynamo export by its last alias
    # (aliases.json, models/make_model.py). Constants the model keeps as
    # initializers (Swin's integer relative_position_index, the dynamo
    # exporter's folded masks and scales) are not trained: unchanged, they
    # are not PyTorch's parameters to compare.
    aliases_file = os.path.join(model_dir, "aliases.json")
    aliases = json.load(open(aliases_file)) if os.path.exists(aliases_file) and not torchscript and not pt2 else {}
    start = {aliases.get(k, k): v for k, v in start.items()}
    got = {aliases.get(k, k): v for k, v in got.items()}
    got = {k: v for k, v in got.items() if k in want or not np.array_equal(v, start.get(k))}
    if sorted(want) != sorted(got):
        sys.exit(f"exported initializers differ from PyTorch's parameters and buffers: {sorted(set(want) ^ set(got))}")
    # Parameters whose PyTorch gradient was rounding noise at every step
    # (models/make_model.py: train_reference): their shapes are checked, their
    # values are noise an optimizer like Adam amplifies, so not compared.
    noise_file = os.path.join(model_dir, f"reference_{name}_noise.json")
    noise = set(json.load(open(noise_file))) if os.path.exists(noise_file) else set()
    # Adam divides each element's step by that element's own gradient scale,
    # so an element whose gradient is tiny takes a full-size step steered by
    # rounding: a few such elements may differ by ~1% of one step while the
    # tensor as a whole agrees to 1e-6. For adam(w) the tensor's 2-norm of
    # the difference is compared, relative to the tensor's norm; for SGD,
    # whose step is proportional to the gradient, the largest element's.
    adaptive = name.startswith("adam")
    worst_name, worst = "", 0.0
    for nm in sorted(want):
        a, b = got[nm], want[nm]
        if a.shape != b.shape:
            sys.exit(f"'{nm}' has shape {a.shape}, PyTorch's {b.shape}")
        if np.array_equal(b, start.get(nm)) or nm in noise:
            continue  # untouched by training (e.g. no gradient reached it), or noise-driven
        diff = a.astype(np.float64) - b
        if adaptive:
            rel = float(np.linalg.norm(diff) / max(np.linalg.norm(b), 1e-3))
        else:
            rel = float(np.abs(diff).max() / max(np.abs(b).max(), 1e-3))
        if rel > worst:
            worst_name, worst = nm, rel
    print(f"trained state: {len(want) - n_buffers} parameters and {n_buffers} buffers, worst tensor {worst_name} "
          f"{'2-norm' if adaptive else 'max-abs'} rel {worst:.3e} (tolerance {REL_TOL})"
          + (f"; not compared, zero gradient up to rounding: {', '.join(sorted(noise))}" if noise else ""))
    return worst


def check_variant(ref, steps):
    """Per step: each accumulated batch's loss, the pre-clip global gradient
    norm (rel REL_TOL) and the learning rate used (rel 1e-9) against PyTorch's.
    Returns the worst relative difference of losses and norms."""
    worst = 0.0

    def compare(what, got, want, tol=REL_TOL):
        nonlocal worst
        rel = abs(got - want) / max(abs(want), 1e-30)
        if tol == REL_TOL:
            worst = max(worst, rel)
        if rel > tol:
            sys.exit(f"step {rec['step']}: {what} {got!r}, PyTorch {want!r} (rel {rel:.2e} > {tol})")

    accum = len(ref["batch_losses"][0])
    for rec, k in zip(steps, range(len(steps))):
        for key in ("grad_norm", "lr") + (("batch_losses",) if accum > 1 else ()):
            if key not in rec:
                sys.exit(f"log line lacks '{key}': {rec}")
        if rec["step"] != k:
            sys.exit(f"log line {k} is step {rec['step']}")
        if accum > 1:
            if len(rec["batch_losses"]) != accum:
                sys.exit(f"step {k}: {len(rec['batch_losses'])} batch losses, expected {accum}")
            for j, (got, want) in enumerate(zip(rec["batch_losses"], ref["batch_losses"][k])):
                compare(f"batch {j} loss", got, want)
        compare("grad_norm", rec["grad_norm"], ref["grad_norms"][k])
        if ref["lrs"][k] == 0:
            if rec["lr"] != 0:
                sys.exit(f"step {k}: lr {rec['lr']}, PyTorch 0")
        else:
            compare("lr", rec["lr"], ref["lrs"][k], tol=1e-9)
        print(f"step {k}: grad_norm {rec['grad_norm']:.7f} (pytorch {ref['grad_norms'][k]:.7f})  lr {rec['lr']:.6g}")
    # The test must exercise what it names: clipping that clips, a schedule that moves.
    if ref["clip_grad_norm"] and not any(n > ref["clip_grad_norm"] for n in ref["grad_norms"]):
        sys.exit(f"no step's gradient norm exceeds --clip-grad-norm {ref['clip_grad_norm']}: nothing was clipped")
    print(f"max relative difference of losses and gradient norms {worst:.3e} (tolerance {REL_TOL})")
    return worst


def check_memory(args, plan_path, model_dir, ref, steps):
    """The model must not fit one rank of this memory, the plan must fit, and
    every rank's measured peak (transfers counted) must stay within its
    stage's capacity and within MEMORY_TOL of the plan's prediction."""
    one = run([args.plan_tool, os.path.join(model_dir, "model.onnx"), "--gpus", "1", "--device-type", "cpu",
               "--batch-size", str(ref["batch_size"]), "--device-memory", args.device_memory, "--optimizer",
               args.optimizer, "--profile", "analytic", "-o", plan_path + ".one.pb"])
    if one.returncode == 0:
        sys.exit(f"the model fits one rank of {args.device_memory}: the test proves nothing")
    print("as expected, one rank cannot hold it:", one.stderr.strip().splitlines()[-1])
    shown = json.loads(run([args.plan_tool, "show", plan_path, "--json"]).stdout)
    capacity = {r: st["memory_capacity_bytes"] for st in shown["stages"] for r in st["ranks"]}
    # Note [a rank's chunks' memory] (planner/partition/evaluate.cpp): an
    # interleaved rank holds each of its chunks (stages), and the plan says
    # its figure with each of them.
    predicted = {}
    for st in shown["stages"]:
        for r in st["ranks"]:
            predicted[r] = st["rank_peak_memory_bytes"] if "rank_peak_memory_bytes" in st else st["peak_memory_bytes"]
    measured = [max(s["peak_memory_bytes_per_rank"][r] for s in steps) for r in range(len(steps[0]["peak_memory_bytes_per_rank"]))]
    failures = []  # every rank's figures first, then what failed
    for r, m in enumerate(measured):
        print(f"rank {r}: measured peak {m} bytes, predicted {predicted[r]:.0f}, capacity {capacity[r]}")
        if m > capacity[r]:
            failures.append(f"rank {r} used {m} bytes, more than its capacity {capacity[r]}")
        ratio = m / predicted[r]
        print(f"rank {r}: measured / predicted {ratio:.3f}")
        if abs(ratio - 1) > MEMORY_TOL:
            failures.append(f"rank {r}: the measured peak is {ratio:.3f}x the plan's, not within {MEMORY_TOL:.0%}")
    if failures:
        sys.exit("\n".join(failures))


def expect_failure(p, needle, what):
    out = p.stdout + p.stderr
    if p.returncode == 0:
        sys.exit(f"{what}: expected a non-zero exit, got 0")
    if needle not in out:
        sys.exit(f"{what}: expected a message containing '{needle}', got:\n{out}")
    if "Segmentation fault" in out or "core dumped" in out:
        sys.exit(f"{what}: crashed:\n{out}")
    print(f"ok: {what}")


def check_nonfinite(args, model_dir, work):
    """A learning rate of 1e30 makes the second step's gradients non-finite:
    by default every rank stops naming the step and a stage; with
    --on-nonfinite skip, the run finishes and logs those steps as skipped."""
    plan_path = os.path.join(work, "plan2.pb")
    p = run([args.plan_tool, os.path.join(model_dir, "model.onnx"), "--gpus", "2", "--batch-size", "8",
             "--profile", "analytic", "-o", plan_path] + (args.plan_args.split() or ["--stages", "2"]))
    if p.returncode != 0:
        sys.exit(p.stderr)
    explode = [args.exec_tool, plan_path,
               "--allow-model-outside-plan", "--data", os.path.join(model_dir, "data"), "--steps", "4", "--optimizer", "sgd",
               "--lr", "1e30"]
    p = run(mpirun(args, 2) + explode, timeout=120)
    expect_failure(p, "non-finite gradients at step 1 in stage ", "non-finite gradients")
    log = os.path.join(work, "skip.jsonl")
    p = run(mpirun(args, 2) + explode + ["--on-nonfinite", "skip", "--log", log], timeout=120)
    if p.returncode != 0:
        sys.exit(f"--on-nonfinite skip: expected exit 0, got {p.returncode}:\n{p.stderr}")
    skipped = [json.loads(line).get("skipped", False) for line in open(log)]
    if skipped != [False, True, True, True]:
        sys.exit(f"--on-nonfinite skip: expected steps 1-3 skipped, got {skipped}")
    print("ok: --on-nonfinite skip")


def check_torchscript_errors(args, model_dir, work):
    """A truncated TorchScript archive, and one saved without the input
    description rannc-plan needs: each one clear error, no crash."""
    import torch
    archive = os.path.join(model_dir, "model.pt")
    truncated = os.path.join(work, "truncated.pt")
    with open(archive, "rb") as f:
        blob = f.read()
    with open(truncated, "wb") as f:
        f.write(blob[: len(blob) // 2])
    p = run([args.plan_tool, "import", truncated])
    import torch
    version = torch.__version__.split("+")[0]
    expect_failure(p, f"not a TorchScript archive this LibTorch ({version}) can load", "truncated TorchScript archive")
    bare = os.path.join(work, "bare.pt")
    torch.jit.load(archive).save(bare)  # no _extra_files
    p = run([args.plan_tool, "import", bare])
    expect_failure(p, "the archive does not describe forward's inputs", "TorchScript archive without inputs")


def check_stopped_ranks(args, model_dir, work):
    """A rank killed from outside mid-run (SIGKILL: MPI notices), and a rank
    frozen (SIGSTOP: nobody notices but the peers' watchdog): each time the job
    ends within a bounded time, non-zero, with a message; nothing hangs."""
    import signal
    import time
    plan_path = os.path.join(work, "kill.pb")
    p = run([args.plan_tool, os.path.join(model_dir, "model.onnx"), "--gpus", "2", "--batch-size", "8",
             "--stages", "2", "--replicas", "1", "--profile", "analytic", "-o", plan_path])
    if p.returncode != 0:
        sys.exit(p.stderr)
    for sig, timeout, needle in ((signal.SIGKILL, 20, "signal 9"), (signal.SIGSTOP, 5, "no progress for")):
        log = os.path.join(work, "kill.jsonl")
        if os.path.exists(log):
            os.remove(log)
        job = subprocess.Popen(mpirun(args, 2) + [args.exec_tool, plan_path, "--allow-model-outside-plan", "--data",
                                                  os.path.join(model_dir, "data"), "--steps", "1000000", "--log", log,
                                                  "--timeout", str(timeout)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while time.time() < deadline and not (os.path.exists(log) and os.path.getsize(log) > 0):
            time.sleep(0.2)
        pids = subprocess.run(["pgrep", "-f", f"^{args.exec_tool} {plan_path}"], capture_output=True,
                              text=True).stdout.split()
        if len(pids) != 2:
            job.kill()
            sys.exit(f"expected 2 rannc-exec processes, found {pids}")
        victim = int(sorted(pids, key=int)[-1])
        stopped_at = time.time()
        os.kill(victim, sig)
        try:
            out, _ = job.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            job.kill()
            sys.exit(f"the job hung after a rank got {sig.name}")
        took = time.time() - stopped_at
        if sig == signal.SIGSTOP:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if job.returncode == 0:
            sys.exit(f"the job exited 0 after a rank got {sig.name}")
        if needle not in out:
            sys.exit(f"after {sig.name}, no message containing '{needle}':\n{out[-2000:]}")
        print(f"ok: {sig.name} to a rank: the job stopped {took:.1f} s later (exit {job.returncode})")


def check_errors(args):
    model_dir = os.path.join(args.models, args.model)
    work = os.path.join(args.work, f"{args.model}-errors")
    os.makedirs(work, exist_ok=True)
    model_copy = os.path.join(work, "model.onnx")
    shutil.copyfile(os.path.join(model_dir, "model.onnx"), model_copy)
    plan_path = os.path.join(work, "plan.pb")
    p = run([args.plan_tool, model_copy, "--gpus", "2", "--batch-size", "8", "-o", plan_path])
    if p.returncode != 0:
        sys.exit(p.stderr)
    data = ["--data", os.path.join(model_dir, "data"), "--steps", "1"]

    p = run(mpirun(args, 3) + [args.exec_tool, plan_path, "--allow-model-outside-plan"] + data, timeout=120)
    expect_failure(p, "the plan is for 2 ranks, but this job has 3", "world size differs from the plan")

    with open(model_copy, "ab") as f:
        f.write(b"\0")
    p = run(mpirun(args, 2) + [args.exec_tool, plan_path, "--allow-model-outside-plan"] + data, timeout=120)
    expect_failure(p, "the model file changed since planning", "model changed since planning")

    # A data file whose per-sample shape does not fit its graph input.
    import numpy as np
    bad_data = os.path.join(work, "bad_data")
    shutil.copytree(os.path.join(model_dir, "data"), bad_data, dirs_exist_ok=True)
    labels = np.load(os.path.join(bad_data, "labels.npy"))
    np.save(os.path.join(bad_data, "labels.npy"), labels[:, :-1])
    p = run([args.plan_tool, os.path.join(model_dir, "model.onnx"), "--gpus", "2", "--batch-size", "8",
             "-o", plan_path])
    p = run(mpirun(args, 2) + [args.exec_tool, plan_path,
                               "--allow-model-outside-plan", "--data", bad_data, "--steps", "1"], timeout=120)
    expect_failure(p, "labels.npy: dimension 1 is 15, graph input 'labels' [B,16] needs 16", "mis-shaped .npy file")

    # --device cuda where no GPU is visible: a clear refusal, not a crash.
    if gpus_visible(args.exec_tool) == 0:
        p = run(mpirun(args, 2) + [args.exec_tool, plan_path,
                                   "--allow-model-outside-plan", "--device", "cuda"] + data, timeout=120)
        want = ("no GPU is visible to this process" if exec_version(args.exec_tool)["CUDA"].startswith("compiled")
                else "built on a LibTorch without CUDA")
        expect_failure(p, want, "--device cuda without a GPU")

    check_nonfinite(args, model_dir, work)
    check_stopped_ranks(args, model_dir, work)

    check_torchscript_errors(args, model_dir, work)

    truncated = os.path.join(work, "truncated.onnx")
    with open(os.path.join(model_dir, "model.onnx"), "rb") as f:
        blob = f.read()
    with open(truncated, "wb") as f:
        f.write(blob[: len(blob) // 3])
    p = run([args.plan_tool, truncated, "--gpus", "2", "-o", os.path.join(work, "never.pb")])
    expect_failure(p, "truncated.onnx", "truncated ONNX file")
    if os.path.exists(os.path.join(work, "never.pb")):
        sys.exit("a failed plan left a file behind")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--models", required=True, help="folder with one subfolder per generated model")
    ap.add_argument("--work", required=True, help="scratch folder")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    ap.add_argument("--variant", help="an optimizer variant of models/make_model.py (reference_VARIANT.json)")
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="plan with --precision; bf16/fp16 compare with reference_<opt>_<precision>.json")
    ap.add_argument("--overflow", action="store_true",
                    help="fp16: start from reference_<opt>_fp16_overflow.json's loss scale, so GradScaler skips steps, "
                         "and expect rannc-exec to skip the same ones")
    ap.add_argument("--device-memory", help="plan for this much memory per rank and check that ranks stay within it")
    ap.add_argument("--edit-tensor-parallel", default="",
                    help="write the plan as text and give every stage this tensor-parallel degree by hand "
                         "(N, or N1,N2,... per stage)")
    ap.add_argument("--edit-stage-starts", default="",
                    help="move the plan's stage boundaries by hand to these op indices (where stages 1, 2, ... "
                         "begin) and re-estimate it with measured costs (rannc-plan check --update --profile measure)")
    ap.add_argument("--edit-scatter-gather", action="store_true",
                    help="write the plan as text and make its cluster two nodes of cuda devices by hand, so that "
                         "rannc-exec --device cpu scatters between tensor-parallel stages")
    ap.add_argument("--plan-args", default="", help="more rannc-plan flags, e.g. '--stages 3 --replicas 2,1,1'")
    ap.add_argument("--schedule", help="plan under this pipeline schedule (rannc-plan --schedule) and check that "
                                       "the plan names it; with --device-memory, each rank's measured peak against "
                                       "the sum of its stages' (an interleaved rank's chunks)")
    ap.add_argument("--virtual-stages", type=int, default=0,
                    help="with --schedule interleaved-1f1b: the chunks per rank (rannc-plan --virtual-stages)")
    ap.add_argument("--errors", action="store_true", help="check start-up error handling instead of training")
    ap.add_argument("--nonfinite", action="store_true",
                    help="only the non-finite gradient check (stop, then --on-nonfinite skip) on 2 ranks planned "
                         "with --plan-args (default --stages 2)")
    ap.add_argument("--summary", help="write step time, memory and loss difference as JSON here")
    ap.add_argument("--torchscript", action="store_true",
                    help="plan and train DIR/model.pt (make_model.py --torchscript) instead of model.onnx")
    ap.add_argument("--model-file", help="the model file in the model's folder (default model.onnx, or model.pt "
                                         "with --torchscript), e.g. model_dynamo.onnx")
    ap.add_argument("--plan-data", action="store_true",
                    help="plan with --data DIR (an archive without its own input description)")
    ap.add_argument("--exec-args", default="", help="more rannc-exec flags, e.g. '--bucket-size 0.02'")
    ap.add_argument("--expect-buckets", type=int, default=0,
                    help="rank 0's gradient all-reduce must use at least this many buckets, some started "
                         "while backward ran (Note [gradient buckets])")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: rannc-exec --device cuda against PyTorch on this machine's GPU "
                         "(exits 77, skipped, without one)")
    ap.add_argument("--make-model-args", default="",
                    help="--device cuda: the make_model.py flags the model folder was made with")
    ap.add_argument("--expect-roles", default="",
                    help="'ROLE=N,...': rannc-plan import --tensor-parallel 2 prints each role "
                         "(column-parallel, row-parallel, vocab-parallel embedding, ...) on exactly N ops")
    ap.add_argument("--check-state", action="store_true",
                    help="also compare the trained parameters and BatchNorm buffers (--export-onnx) with PyTorch's")
    args = ap.parse_args()
    if args.schedule:  # a flag of its own so that the check knows what to expect of the plan
        args.plan_args = (args.plan_args + f" --schedule {args.schedule}").strip()
    if args.virtual_stages:
        if not args.schedule:
            sys.exit("--virtual-stages needs --schedule interleaved-1f1b")
        args.plan_args += f" --virtual-stages {args.virtual_stages}"
    if args.nonfinite:
        work = os.path.join(args.work, f"{args.model}-nonfinite-" + args.plan_args.replace("--", "").replace(" ", "_"))
        os.makedirs(work, exist_ok=True)
        check_nonfinite(args, os.path.join(args.models, args.model), work)
    elif args.errors:
        check_errors(args)
    else:
        check_training(args)


if __name__ == "__main__":
    main()
