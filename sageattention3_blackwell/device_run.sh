#!/usr/bin/env bash
# sageattn3 on a GPU machine, by steps (default: build selftest test), run from the repository root:
#   build     with WHEEL3=path: that prebuilt wheel (an abi3 wheel serves the machine's torch if it is of
#             torch's CUDA line and torch is at least its floor); without: sagebuild builds the abi3 wheel
#             with the machine's torch for 9.0a;10.0a;12.0a into $OUT/wheelhouse3 (9.0a: the test target,
#             so that an H100/H200 runs the native quantization kernels and the sm_100a attention code).
#             Either is installed into /tmp/site3 and its compiled module copied into the checkout (the
#             GPU tests import the source tree)
#   selftest  python -m sageattn3 env and selftest against the installed wheel
#   test      the GPU tests (sageattention3_blackwell/tests/gpu), accuracy figures into $OUT/sage3-gpu-tests.log
#   unit      the CPU tests of sageattn3 (reference, emulation, compile checks, the ops over the C ABI)
# Usage: OUT=/some/dir [WHEEL3=wheelhouse3/sageattn3-...whl] bash sageattention3_blackwell/device_run.sh
# [step ...]; PYTEST_ARGS narrows the tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a folder for logs and results}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build selftest test)
torch_v=$(python -c "import torch; print(torch.__version__.split('+')[0])")
cuda_v=$(python -c "import torch; print(torch.version.cuda)")
py_v=$(python -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
site=/tmp/site3
step() { echo "== $* ($(date +%T))"; }

for s in "${steps[@]}"; do
  case $s in
    build)
      if [ -n "${WHEEL3:-}" ]; then
        step "prebuilt wheel $WHEEL3 (torch $torch_v CUDA $cuda_v py $py_v here)"
        wheel=$WHEEL3
        [ -f "$wheel" ] || { echo "WHEEL3=$wheel: no such file"; exit 2; }
      else
        step "sagebuild build sageattn3 (abi3): torch $torch_v CUDA $cuda_v py $py_v, 9.0a;10.0a;12.0a"
        # As bench/device_run.sh: the system g++ rather than the image's wrapper.
        if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
        start=$(date +%s)
        timeout 540 python -m sagebuild build --package sageattn3 --wheel abi3 --torch "$torch_v" \
          --cuda "$cuda_v" --python "$py_v" --archs "9.0a;10.0a;12.0a" --use-current-env --no-repair \
          --no-smoke --out "$OUT/wheelhouse3" >"$OUT/sage3-build.log" 2>&1
        echo "build rc=$? in $(( $(date +%s) - start )) s"; grep -E "SASS|=> |compile: done|Error|error:" "$OUT/sage3-build.log" | tail -8
        wheels=("$OUT"/wheelhouse3/sageattn3-*.whl); wheel=${wheels[0]}
      fi
      rm -rf "$site" && python -m pip install -q --no-deps --no-index --target "$site" "$wheel" || exit 1
      echo "installed $(basename "$wheel") into $site"
      cp "$site"/sageattn3/_C*.so sageattention3_blackwell/sageattn3/
      ;;
    selftest)
      step "python -m sageattn3 env and selftest (installed wheel)"
      (cd /tmp && PYTHONPATH=$site timeout 60 python -m sageattn3 env 2>&1 | tee "$OUT/sage3-env.log")
      (cd /tmp && PYTHONPATH=$site timeout 300 python -m sageattn3 selftest 2>&1 | tee "$OUT/sage3-selftest.log")
      ;;
    test)
      step "GPU tests"
      # shellcheck disable=SC2086
      timeout "${TEST_TIMEOUT:-560}" python -m pytest -q -s -rfEsxX -p no:cacheprovider -m gpu \
        ${PYTEST_ARGS:-sageattention3_blackwell/tests/gpu} >"$OUT/sage3-gpu-tests.log" 2>&1
      echo "pytest rc=$?"; grep -E "^\[(triton|native)\]" "$OUT/sage3-gpu-tests.log"
      grep -E "passed|failed|error" "$OUT/sage3-gpu-tests.log" | tail -3
      grep -E "^(FAILED|ERROR|XPASS)" "$OUT/sage3-gpu-tests.log" | head -30
      ;;
    unit)
      step "CPU tests of sageattn3"
      timeout 300 python -m pytest -q -p no:cacheprovider -m "not gpu" sageattention3_blackwell/tests 2>&1 | tail -5
      ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
step "done"
