#!/usr/bin/env bash
# The demo on a fresh machine: install, build, export a small GPT-style
# transformer with its loss inside, plan it for 2 ranks, train it with
# mpirun -np 2 rannc-exec and watch the loss fall.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${RANNC_BUILD_DIR:-$root/build}"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh"

demo="$build/demo"
mkdir -p "$demo"
echo "== export a GPT-style model (loss inside) and its dataset" >&2
"$root/.venv/bin/python" "$root/models/make_model.py" --model gpt --out "$demo/gpt" --samples 256 --steps 0
echo "== plan it for 2 ranks" >&2
"$build/tools/rannc-plan" "$demo/gpt/model.onnx" --gpus 2 --device-type cpu --batch-size 16 --microbatches 4 \
  -o "$demo/plan.pb"
"$build/tools/rannc-plan" show "$demo/plan.pb"
echo "== train with mpirun -np 2" >&2
mpirun --allow-run-as-root --oversubscribe -np 2 "$build/tools/rannc-exec" "$demo/plan.pb" \
  --data "$demo/gpt/data" --steps 60 --optimizer adam --lr 0.003 --log "$demo/log.jsonl"
"$root/.venv/bin/python" - "$demo/log.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
first = sum(s["loss"] for s in steps[:5]) / 5
last = sum(s["loss"] for s in steps[-5:]) / 5
print(f"mean loss of the first 5 steps {first:.3f}, of the last 5 steps {last:.3f}")
sys.exit(0 if last < first else "the loss did not fall")
PY
