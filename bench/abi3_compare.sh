#!/usr/bin/env bash
# One GPU run for the torch-independent wheel (docs/building.md, "One wheel for every PyTorch"): the abi3
# wheel built on another machine against another torch ($WHEEL) is installed with --no-deps beside the
# GPU machine's torch and runs the GPU suite; the per-torch wheel of the libtorch binding it replaced is
# built from $BASELINE (a copy of that commit's sources) meanwhile; then both run the same speed and
# host-overhead benchmarks, one after the other, so that their ratios hold.
# Usage: OUT=/dir WHEEL=path/to.whl BASELINE=.baseline [OVERLAY=1] [SPEED=0] [HOST_ROUNDS=3]
#        [EXTRA="native backward parity accuracy masks integration"] [EXTRA_WHEELS="a.whl b.whl"] [PYTEST_ARGS=...]
#        bash bench/abi3_compare.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
repo=$(pwd)
OUT=${OUT:?set OUT to a folder for logs and results}
WHEEL=${WHEEL:?set WHEEL to the abi3 wheel}
BASELINE=${BASELINE:-.baseline}
step() { echo "== $* ($(date +%T))"; }
# The image's CC/CXX wrapper miscompiles throwing code (bench/device_run.sh); the system g++ does not.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
rm -rf /tmp/site /tmp/base /tmp/basewheel /tmp/benchroot
python -m pip install -q --no-deps --no-index --target /tmp/site "$WHEEL" || exit 1
# EXTRA_WHEELS: wheels of clients and peers (diffusers, comfy-kitchen) beside it, without their dependencies.
if [ -n "${EXTRA_WHEELS:-}" ]; then
  python -m pip install -q --no-deps --no-index --no-compile --target /tmp/site $EXTRA_WHEELS || exit 1
fi
# OVERLAY=1: the checkout's Python files over the installed ones (a Python-only change on the wheel's modules).
if [ "${OVERLAY:-0}" = 1 ]; then
  cp "$repo"/sageattention/*.py /tmp/site/sageattention/ && cp "$repo"/sageattention/triton/*.py /tmp/site/sageattention/triton/
fi
(cd /tmp && PYTHONPATH=/tmp/site python -m sageattention env >"$OUT/env.txt" 2>&1); head -12 "$OUT/env.txt"

step "baseline build (background)"
(cd "$BASELINE" && start=$(date +%s) && TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=6 SAGEATTENTION_BUILD_CUDA=1 \
  timeout 480 python -m pip wheel -q --no-build-isolation --no-deps -w /tmp/basewheel . >"$OUT/baseline-build.log" 2>&1 \
  && python -m pip install -q --no-deps --no-index --target /tmp/base /tmp/basewheel/*.whl
  echo "baseline rc=$? in $(( $(date +%s) - start )) s" >>"$OUT/baseline-build.log") &
builder=$!

step "GPU suite against the abi3 wheel"
(cd /tmp && PYTHONPATH=/tmp/site SAGEATTN_FUZZ_EXAMPLES=${SAGEATTN_FUZZ_EXAMPLES:-10} \
  timeout "${TEST_TIMEOUT:-330}" python -m pytest -q -rfEs -p no:cacheprovider -n "${TEST_WORKERS:-8}" \
  -c /dev/null -o "markers=gpu: needs a CUDA GPU" --rootdir "$repo/tests" -m gpu \
  ${PYTEST_ARGS:-"$repo/tests/gpu"} >"$OUT/gpu-tests.log" 2>&1)
echo "pytest rc=$?"; grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20
wait "$builder"; tail -2 "$OUT/baseline-build.log"

# The benchmarks import the installed package, not the checkout: run them from a folder without it.
mkdir -p /tmp/benchroot && cp -r "$repo/bench" "$repo/example" /tmp/benchroot/
wheels="abi3:/tmp/site per-torch:/tmp/base"
if [ "${SPEED:-1}" = 1 ]; then
  for pair in $wheels; do
    name=${pair%%:*} site=${pair#*:}
    [ -d "$site/sageattention" ] || { echo "no $name wheel"; continue; }
    step "speed: $name"
    (cd /tmp/benchroot && PYTHONPATH=$site timeout 150 python bench/bench_attention.py --head-dims 128 \
      --lengths 4096 16384 --causal no --impls sdpa-cudnn sageattn --rep 100 --no-plot \
      --out "$OUT/attention-$name.json" 2>&1 | tail -4)
  done
fi
# Host time differs from one process to the next by more than the wheels do (torch SDPA itself by up
# to 13 us): HOST_ROUNDS processes per wheel, alternating, and the least time of each entry.
for round in $(seq "${HOST_ROUNDS:-3}"); do
  for pair in $wheels; do
    name=${pair%%:*} site=${pair#*:}
    [ -d "$site/sageattention" ] || continue
    step "host overhead: $name, round $round"
    (cd /tmp/benchroot && PYTHONPATH=$site timeout 120 python bench/host_overhead.py \
      --out "$OUT/host-$name-$round.json" 2>&1 | grep -E "sageattn|torch SDPA" | head -8)
  done
done
python - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
for name in ("abi3", "per-torch"):
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/host-{name}-*.json"))]
    if not runs:
        continue
    best = {}
    for run in runs:
        for row in run["rows"]:
            key = (row["shape"], row["entry"])
            if key not in best or row["host us"] < best[key]["host us"]:
                best[key] = row
    json.dump({"device": runs[0]["device"], "rounds": len(runs), "least of the rounds": list(best.values())},
              open(f"{out}/host-{name}.json", "w"), indent=1)
    for (shape, entry), row in best.items():
        print(f"{name:<9} {shape:<22} {entry:<13} host {row['host us']:6.1f} us (least of {len(runs)})")
PY
for extra in ${EXTRA:-}; do
  case $extra in
    backward)
      step "training: backward GPU tests ran in the suite; forward + backward against cuDNN"
      (cd /tmp/benchroot && PYTHONPATH=/tmp/site timeout "${BACKWARD_TIMEOUT:-150}" python bench/backward.py \
        --out "$OUT/backward.json" 2>&1 | tail -25) ;;
    parity)
      step "training: fine-tuning parity"
      (cd /tmp/benchroot && PYTHONPATH=/tmp/site timeout "${PARITY_TIMEOUT:-120}" python bench/finetune_parity.py \
        --out "$OUT/finetune-parity.json" 2>&1 | tail -8) ;;
    accuracy)
      step "training: where the gradient error comes from"
      (cd /tmp && PYTHONPATH=/tmp/site timeout 200 python "$repo/bench/backward_accuracy.py" \
        --out "$OUT/backward-accuracy.json" 2>&1 | tail -60) ;;
    masks)
      step "key-padding masks against torch SDPA and comfy-kitchen (prefix, then random kept keys)"
      (cd /tmp/benchroot && PYTHONPATH=/tmp/site timeout 240 python bench/masks.py --out "$OUT/masks.json" 2>&1 \
        | tail -6 && PYTHONPATH=/tmp/site timeout 240 python bench/masks.py --random --out "$OUT/masks-random.json" \
        2>&1 | tail -6) ;;
    integration)
      step "the integrations end to end, their tables printed (diffusers and transformers from EXTRA_WHEELS or the image)"
      (cd /tmp && PYTHONPATH=/tmp/site timeout "${INTEGRATION_TIMEOUT:-200}" python -m pytest -q -s -p no:cacheprovider \
        -c /dev/null -o "markers=gpu: needs a CUDA GPU" --rootdir "$repo/tests" "$repo/tests/gpu/test_integration.py" \
        >"$OUT/integration.txt" 2>&1; tail -3 "$OUT/integration.txt") ;;
    native)
      step "host time by layer"
      (cd /tmp && PYTHONPATH=/tmp/site timeout 120 python "$repo/bench/host_native.py" --out "$OUT/host-native.json" \
        2>&1 | grep " us$") ;;
  esac
done
step done
# Everything in one archive: the tool brings back a handful of files.
(cd "$OUT" && tar czf results.tgz --exclude results.tgz --exclude run.log ./* && find . -type f ! -name results.tgz \
  ! -name run.log -delete)
