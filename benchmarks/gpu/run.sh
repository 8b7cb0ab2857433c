#!/usr/bin/env bash
# tirjax on one GPU in under 10 minutes: train step, chunked log-probs, advantage kernels, the
# JAX sampler and the padded vs shared/packed update (issue 38), as one JSON file and a short
# table (issue 19).
#
#   benchmarks/gpu/run.sh [--dry-run] [--wheels] [--out=DIR]
#
# On the GPU machine (no network; Python 3.12 with jax[cuda], flax, optax, orbax, chex,
# transformers, scipy, absl ...): copy the repository with its `.whl/` folder (`make
# gpu-wheels` fills it here: the pure-Python packages that image lacks), then run this script
# from anywhere. Results: DIR/gpu.json (default DIR: benchmarks/results/gpu_run); commit it
# as benchmarks/results/gpu_h200.json.
#
# --dry-run: the same sections on the CPU at tiny sizes (about a minute), as `make test`
# runs it, so that the script cannot rot between the rare GPU sessions.
# --wheels: install `.whl/` in a dry run too, as on the GPU (`make test-compat` runs the dry
# run in the image's versions, with what the image lacks blocked).
set -euo pipefail
cd "$(dirname "$0")/../.."
DRY=0
WHEELS=0
OUT=benchmarks/results/gpu_run
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --wheels) WHEELS=1 ;;
    --out=*) OUT="${arg#--out=}" ;;
    *) echo "run.sh: unknown argument '$arg' (expected --dry-run, --wheels, --out=DIR)" >&2
       exit 2 ;;
  esac
done
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The wheels are CPython 3.12 builds for the GPU image: a dry run uses the venv instead,
# unless given --wheels.
if { [ "$DRY" = 0 ] || [ "$WHEELS" = 1 ]; } && compgen -G ".whl/*.whl" > /dev/null; then
  SITE="$(cd "$OUT" && pwd)/site-packages"  # --out may be relative or absolute
  "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi

if [ "$DRY" = 1 ]; then
  export JAX_PLATFORMS=cpu
  TRAIN=(--presets=tiny --meshes=1x1x1 --length=64 --fit_budget_gib=0.05 --repeats=1)
  LOGPROBS=(--batch=1 --length=256 --hidden=64 --vocab=4096 --chunk_size=128 --repeats=1)
  KERNELS=(--queries=4 --steps=3 --calls=2 --gt_calls=3 --repeats=1 --ref_repeats=1)
  SAMPLER=(--preset=tiny --batches=2,4 --prompt_len=16 --new_tokens=8 --repeats=1)
  UPDATE=(--preset=tiny --synthetic=64,2,4 --repeats=1)
  LIMITS=(300 300 300 300 300)
else
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
  TRAIN=(--gpu --presets=qwen3_0p6b,qwen3_1p7b --meshes=1x1x1 --length=4096 --repeats=3)
  LOGPROBS=(--batch=1 --length=16384 --time_batch=1 --hidden=1024 --vocab=151936
            --chunk_size=1024 --dtype=bfloat16 --repeats=5)
  KERNELS=(--queries=2048 --repeats=5 --ref_repeats=1)
  SAMPLER=(--preset=qwen3_0p6b --batches=64,256 --prompt_len=256 --new_tokens=256 --repeats=3)
  # Padded against shared/packed update + KL reference pass (issue 38): 4 groups of 8 rows
  # sharing a 4096-token prompt (BFCL-like), short responses.
  UPDATE=(--preset=qwen3_0p6b --synthetic=4096,4,8 --repeats=2)
  LIMITS=(255 45 120 60 120)  # seconds per section: 10 min at most in all
fi
TRAIN+=(--fit_microbatch)

# Each section in its own process and time limit: one that fails or runs over is recorded as
# such and the others still run.
status=()
section() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  if timeout "$limit" "$PY" "$@" > "$OUT/$name.log" 2>&1; then
    status+=("$name=ok:$((SECONDS - start))")
  else
    status+=("$name=failed($?):$((SECONDS - start))")
    tail -5 "$OUT/$name.log" >&2
  fi
}
section train_step "${LIMITS[0]}" -m benchmarks.bench_train_step "${TRAIN[@]}" \
  --json="$OUT/train_step.json"
section logprobs "${LIMITS[1]}" -m benchmarks.bench_model "${LOGPROBS[@]}" \
  --json="$OUT/logprobs.json"
section kernels "${LIMITS[2]}" -m benchmarks.bench_kernels "${KERNELS[@]}" \
  --json="$OUT/kernels.json"
section sampler "${LIMITS[3]}" -m benchmarks.bench_sampler --sections=jax "${SAMPLER[@]}" \
  --json="$OUT/sampler.json"
section update "${LIMITS[4]}" -m benchmarks.bench_update --cases=synthetic "${UPDATE[@]}" \
  --json="$OUT/update.json"
"$PY" benchmarks/gpu/summarize.py "$OUT" --dry_run="$DRY" "${status[@]}"
