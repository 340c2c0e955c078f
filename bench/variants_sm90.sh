#!/usr/bin/env bash
# Kernel-only timings of sm_90a kernel variants: each "name:-DKNOB=value ..." argument builds
# bench/trace_sm90.cu untraced with those knobs (in parallel), then every variant runs every shape,
# in two alternating passes. A knob is an #ifndef / #define an experiment adds to
# csrc/sm90/attn_int8_fp8.cu (the kernel keeps none once the winner is in).
# Usage: bash bench/variants_sm90.sh OUTFILE "base:" "try:-DSOME_KNOB=1" ...
# Shapes: $SHAPES (default "4096 4 32 0;16384 4 32 0;4608 1 24 0;16384 4 32 1", n batch heads causal).
set -uo pipefail
out=$1; shift
shapes=${SHAPES:-"4096 4 32 0;16384 4 32 0;4608 1 24 0;16384 4 32 1"}
names=()
for v in "$@"; do
  name=${v%%:*}; flags=${v#*:}; names+=("$name")
  # shellcheck disable=SC2086
  nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc/include -Icsrc -DSAGE_SM90_NO_TRACE $flags bench/trace_sm90.cu \
    -o "/tmp/variant-$name" 2>"/tmp/variant-$name.log" &
done
wait
for pass in 1 2; do
  IFS=';' read -ra list <<<"$shapes"
  for shape in "${list[@]}"; do
    for name in "${names[@]}"; do
      # shellcheck disable=SC2086
      echo "pass $pass $name $("/tmp/variant-$name" $shape 2>&1 | grep -m1 -E "kernel|rror")" | tee -a "$out"
    done
  done
done
