#!/usr/bin/env bash
# Two trees of tilec side by side on one OpenCL device, alternating, three rounds:
#     git archive REV | tar -x -C OLD_DIR
#     bash benchmarks/before_after.sh OLD_DIR DEVICE
# Each file runs through `tilec run --validate --repeat 15` (median kernel event time, checked
# against the numpy reference).  Runs from /tmp so that PYTHONPATH decides which tilec is
# imported; each tree gets its own cache folder.
set -u
OLD=$(cd "$1" && pwd)
NEW=$(cd "$(dirname "$0")/.." && pwd)
DEVICE=$2
cat > /tmp/stem.tile <<'T'
// shapes: D=1x230x230x3 K=7x7x64x3
function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, 112, 112, CO] = +(D[n, 2*x+i, 2*y+j, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}
T
cd /tmp
for round in 1 2 3; do
  for tree in "$OLD" "$NEW"; do
    for f in "$NEW/examples/conv_relu.tile" /tmp/stem.tile "$NEW/examples/matmul.tile" \
             "$NEW/examples/softmax.tile"; do
      printf "%s %s: " "$([ "$tree" = "$OLD" ] && echo before || echo after)" "$(basename "$f")"
      TILEC_CACHE_DIR=/tmp/cache-$(basename "$tree") PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$tree" \
        python3 -m tilec.cli run "$f" --device "$DEVICE" --repeat 15 --validate 2>&1 |
        grep -E "total|validation" | sed 's/ \+/ /g' | tr '\n' ' '
      echo
    done
  done
done
