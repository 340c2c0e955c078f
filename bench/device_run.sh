#!/usr/bin/env bash
# One GPU-machine session, by steps (default: all of them, in this order):
#   build     sagebuild builds the wheel (torch of the machine, sm_90a) into $OUT/wheelhouse, installs it
#             into /tmp/site and copies its compiled modules into the checkout for the benchmarks
#   test      install it outside the checkout and run the GPU tests against the installed wheel (-c /dev/null keeps
#             pyproject.toml's settings out, so the gpu mark is declared on the command line); where
#             pytest-xdist is installed, in $TEST_WORKERS processes (default 6) sharing the GPU, with
#             $SAGEATTN_FUZZ_EXAMPLES (default 30) examples per fuzz property: the whole suite in one
#             step (one process ran 57% of it in 420 s)
#   accuracy  bench/accuracy.py (the accuracy protocol, README's Accuracy)
#   bench     bench/bench_attention.py (the speed protocol, README's Speed) and the diffusion shape
#   sweep     bench/sweep_triton.py with $SWEEP_ARGS
# Usage: OUT=/some/dir bash bench/device_run.sh [step ...]; PYTEST_ARGS narrows the test step.
set -uo pipefail
export PYTHONUNBUFFERED=1
repo=$(pwd)
OUT=${OUT:?set OUT to a folder for logs and results}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build test accuracy bench)
torch_v=$(python -c "import torch; print(torch.__version__.split('+')[0])")
py_v=$(python -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
step() { echo "== $* ($(date +%T))"; }
site=/tmp/site

for s in "${steps[@]}"; do
  case $s in
    build)
      step "sagebuild build torch $torch_v py $py_v sm_90a"
      # The GPU image sets CC/CXX to a g++ wrapper under /opt/gcc whose builds crash (SIGSEGV) when a
      # TORCH_CHECK in our ops throws; the system g++ of the same version raises RuntimeError as it should.
      if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
      start=$(date +%s)
      timeout 400 python -m sagebuild build --torch "$torch_v" --cuda 13.0 --python "$py_v" --archs 9.0a \
        --use-current-env --no-repair --no-smoke --out "$OUT/wheelhouse" >"$OUT/build.log" 2>&1
      echo "build rc=$? in $(( $(date +%s) - start )) s"; tail -5 "$OUT/build.log"
      rm -rf "$site" && python -m pip install -q --no-deps --no-index --target "$site" "$OUT"/wheelhouse/*.whl
      cp "$site"/sageattention/*.so sageattention/  # the benchmarks import the checkout: give it the kernels
      (cd /tmp && PYTHONPATH=$site python -m sageattention env 2>&1 | tail -25)
      ;;
    test)
      n_workers=${TEST_WORKERS:-6} workers=()
      if python -c "import xdist" 2>/dev/null && [ "$n_workers" -gt 1 ]; then workers=(-n "$n_workers"); fi
      step "GPU tests against the installed wheel (${workers[*]:-one process})"
      # shellcheck disable=SC2086
      (cd /tmp && PYTHONPATH=$site SAGEATTN_FUZZ_EXAMPLES=${SAGEATTN_FUZZ_EXAMPLES:-30} \
        timeout "${TEST_TIMEOUT:-420}" python -m pytest -q -rfEs -p no:cacheprovider "${workers[@]}" \
        -c /dev/null -o "markers=gpu: needs a CUDA GPU" --rootdir "$repo/tests" -m gpu \
        ${PYTEST_ARGS:-"$repo/tests/gpu"} >"$OUT/gpu-tests.log" 2>&1)
      echo "pytest rc=$?"; grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -3
      grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -30
      ;;
    accuracy)
      step "accuracy"
      PYTHONPATH=$repo timeout 150 python bench/accuracy.py --out "$OUT/accuracy.json" 2>&1 | tail -9
      ;;
    bench)
      step "benchmark, speed protocol"
      PYTHONPATH=$repo timeout 420 python bench/bench_attention.py --impls sdpa-flash sdpa-cudnn sageattn \
        sage-triton-fp16 ${BENCH_IMPLS:-} --rep 100 --out "$OUT/attention.json" 2>&1 | tail -30
      step "diffusion shape"
      PYTHONPATH=$repo timeout 60 python bench/bench_attention.py --batch 1 --heads 24 --head-dims 128 \
        --lengths 4608 --causal no --impls sdpa-flash sdpa-cudnn sageattn sage-triton-fp16 ${BENCH_IMPLS:-} \
        --out "$OUT/diffusion.json" --no-plot 2>&1 | tail -3
      ;;
    sweep)
      step "sweep: ${SWEEP_ARGS:-}"
      # shellcheck disable=SC2086
      PYTHONPATH=$repo timeout "${SWEEP_TIMEOUT:-300}" python bench/sweep_triton.py ${SWEEP_ARGS:-} \
        --out "$OUT/sweep.jsonl" 2>&1 | tee "$OUT/sweep.log" | tail -40
      ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
step done
