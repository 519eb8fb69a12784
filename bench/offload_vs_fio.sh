#!/usr/bin/env bash
# offload_vs_fio.sh DIR [PARAMS] [REPS] — the offload engine's update phase beside fio.
#  1. NVMe: `memwall bench offload --tier nvme` (master + fp32 moments on NVMe) reads R and
#     writes W bytes per step; fio then reads R bytes and writes W bytes concurrently (two jobs,
#     1 MiB blocks, queue depth 32 each (fio does worse at 64), O_DIRECT, io_uring) — the I/O-bound limit of the same
#     step. Ratio = engine (R+W)/update_s over fio (R+W)/max(job runtimes). fio runs with its
#     default (4 KiB-page) buffers; the engine uses 2 MiB huge-page staging buffers.
#  2. DRAM: `memwall bench offload --tier dram`: update phase over the bare AdamW kernel on the
#     same parameters, measured alternately in the same run.
# Each runs REPS times (default 3), interleaved; medians and every run are printed.
# Env: MEMWALL (binary, default build/memwall), SUBGROUP (elements, default 4194304),
#      BUFFERS (default 8). Figures in GB/s (10^9 B/s). Test files are removed afterwards.
set -euo pipefail
dir=${1:?usage: offload_vs_fio.sh DIR [PARAMS] [REPS]}
params=${2:-268435456}
reps=${3:-3}
sg=${SUBGROUP:-4194304}
bufs=${BUFFERS:-8}
here=$(cd "$(dirname "$0")/.." && pwd)
mw=${MEMWALL:-$here/build/memwall}
command -v fio >/dev/null || { echo "offload_vs_fio.sh: fio is not installed (scripts/install-deps.sh)"; exit 1; }
[ -x "$mw" ] || { echo "offload_vs_fio.sh: $mw not found (make build)"; exit 1; }
mkdir -p "$dir"
rf="$dir/fio-read.$$.dat"; wf="$dir/fio-write.$$.dat"
trap 'rm -f "$rf" "$wf"' EXIT
jf() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
f2() { awk -v x="$1" -v d="${2:-1}" 'BEGIN {printf "%.2f", x/d}'; }

fio_rw() { # fio_rw READ_BYTES WRITE_BYTES -> seconds until both jobs are done
  fio --output-format=json --direct=1 --ioengine=io_uring --bs=1M --iodepth=32 \
      --name=r --rw=read --filename="$rf" --size="$1" --name=w --rw=write --filename="$wf" --size="$2" 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"]; print(max(j[0]["read"]["runtime"], j[1]["write"]["runtime"])/1000)'
}

echo "offload update phase vs fio: $params parameters, subgroups of $sg, $bufs buffers, median of $reps runs"
eb=(); fb=(); rt=(); iw=(); us=(); dr=()
for ((i = 0; i < reps; i++)); do
  j=$("$mw" bench offload --params "$params" --subgroup-size "$sg" --buffer-count "$bufs" --tier nvme \
      --nvme-dir "$dir" --steps 3 --no-kernel --json)
  R=$(jf "$j" nvme_read_bytes); W=$(jf "$j" nvme_write_bytes); u=$(jf "$j" update_s)
  [ -f "$rf" ] || fio --name=prep --rw=write --bs=1M --direct=1 --filename="$rf" --size="$R" >/dev/null 2>&1
  t=$(fio_rw "$R" "$W"); rm -f "$wf"
  e=$(awk -v a="$R" -v b="$W" -v t="$u" 'BEGIN {print (a+b)/t}'); f=$(awk -v a="$R" -v b="$W" -v t="$t" 'BEGIN {print (a+b)/t}')
  eb+=("$e"); fb+=("$f"); rt+=("$(awk -v a="$e" -v b="$f" 'BEGIN {print a/b}')"); iw+=("$(jf "$j" io_wait_s)"); us+=("$u")
  d=$("$mw" bench offload --params "$params" --subgroup-size "$sg" --tier dram --steps 5 --json)
  dr+=("$(jf "$d" update_over_kernel)")
done
echo "NVMe bytes per step: read $R, written $W"
printf '%-34s %10s   %s\n' "figure" "median" "runs"
row() { local name=$1 div=$2; shift 2; printf '%-34s %10s   ' "$name" "$(f2 "$(median "$@")" "$div")"; for x in "$@"; do printf '%s ' "$(f2 "$x" "$div")"; done; echo; }
row "engine read+write GB/s" 1e9 "${eb[@]}"
row "fio read+write GB/s (same bytes)" 1e9 "${fb[@]}"
row "engine / fio" 1 "${rt[@]}"
row "update phase s (nvme)" 1 "${us[@]}"
row "CPU wait for I/O s (nvme)" 1 "${iw[@]}"
row "update phase / bare kernel (dram)" 1 "${dr[@]}"
