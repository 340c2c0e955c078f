#!/usr/bin/env bash
# One device-machine session: build the wheel there with sagebuild (torch of the image, sm_90a), install
# it outside the checkout, run the GPU tests against the installed wheel, then the benchmark and the
# accuracy report from the checkout. Everything lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
repo=$(pwd)
torch_v=$(python -c "import torch; print(torch.__version__.split('+')[0])")
py_v=$(python -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
step() { echo "== $* ($(date +%T))"; }

step "sagebuild build torch $torch_v py $py_v sm_90a"
timeout 300 python -m sagebuild build --torch "$torch_v" --cuda 13.0 --python "$py_v" --archs 9.0a \
  --use-current-env --no-repair --no-smoke --out "$OUT/wheelhouse" 2>&1 | tail -25
step "install the wheel into a fresh folder and run the GPU tests against it"
rm -rf /tmp/site && python -m pip install -q --no-deps --no-index --target /tmp/site "$OUT"/wheelhouse/*.whl
(cd /tmp && PYTHONPATH=/tmp/site timeout 400 python -m pytest -q -p no:cacheprovider -c /dev/null \
  --rootdir "$repo/tests" "$repo/tests/gpu/test_fused_quant.py" "$repo/tests/gpu/test_triton_api.py" \
  -k "fused or bit_exact or protocol or picks or lse or head_dims" 2>&1 | tail -4)
PYTHONPATH=/tmp/site python -c "import sageattention, sys; print(sageattention.__file__)"
PYTHONPATH=/tmp/site python -m sageattention env 2>&1 | tail -20

export PYTHONPATH=$repo
step "accuracy"
timeout 120 python bench/accuracy.py --out "$OUT/accuracy.json" 2>&1 | tail -9
step "benchmark, DESIGN protocol"
timeout 420 python bench/bench_attention.py --impls sdpa-flash sdpa-cudnn sageattn sage-triton-fp16 \
  --rep 100 --out "$OUT/attention.json" 2>&1 | tail -30
step "diffusion shape"
timeout 60 python bench/bench_attention.py --batch 1 --heads 24 --head-dims 128 --lengths 4608 --causal no \
  --impls sdpa-flash sdpa-cudnn sageattn sage-triton-fp16 --out "$OUT/diffusion.json" --no-plot 2>&1 | tail -3
step done
