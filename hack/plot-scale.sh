#!/usr/bin/env bash
# Draws the chart of hack/bench-scale.sh's figures: list latencies (p50, log scale) per runtime at
# each pod count. Usage: hack/plot-scale.sh BENCH.json OUT.png. Needs gnuplot (Debian's
# gnuplot-nox, installed here when missing).
set -euo pipefail
json=$1 out=$2
command -v gnuplot >/dev/null || {
  apt-get install -y -qq gnuplot-nox >/dev/null 2>&1 || { echo "cannot install gnuplot-nox" >&2; exit 1; }
}
data=$(mktemp)
trap 'rm -f "$data"' EXIT
python3 - "$json" >"$data" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b, c = r["runtimes"]["berth"], r["runtimes"]["containerd"]
print('call "Berth" "containerd 1.6"')
for n in r["counts"]:
    for call, key in (("ListContainers", "listContainers"), ("ListPodSandbox", "listPodSandbox")):
        n_ = str(n)
        print(f'"{call}\\n{n} pods" {b["lists"][n_][key]["p50Ms"]} {c["lists"][n_][key]["p50Ms"]}')
PY
gnuplot <<GP
set terminal pngcairo size 900,540 font "sans,11"
set bmargin 5
set output "$out"
set title "CRI list calls with many running pods (p50, lower is better)"
set ylabel "milliseconds (log scale)"
set logscale y
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set key top left
set grid ytics
plot "$data" using 2:xtic(1) title columnheader(2) lc rgb "#2a7ab0", \
     "" using 3 title columnheader(3) lc rgb "#c0504d"
GP
echo "wrote $out" >&2
