#!/usr/bin/env bash
# io_vs_fio.sh DIR [SIZE] [REPS] — memwall's I/O engine beside fio, same file size, 1 MiB blocks,
# O_DIRECT (direct=1), ioengine=io_uring, queue depth 8 and 32. Each configuration runs REPS
# times (default 3) interleaved fio / engine, and the medians are printed side by side with the
# ratio engine/fio for read and write. fio runs with its default buffers (malloc'd, 4 KiB pages);
# the engine with its 2 MiB huge-page I/O buffers — that difference is what is being shown.
# Rows: "write" into a new preallocated file (ext4 converts unwritten extents: both tools pay
# it), "overwrite" a second write pass over the written file (the NVMe store's steady state),
# and "read".
# Env: MEMWALL (path of the memwall binary, default build/memwall), QDS (default "8 32"),
#      BS (default 1M). Figures in GB/s (10^9 bytes/s). Test files are removed afterwards.
set -euo pipefail
dir=${1:?usage: io_vs_fio.sh DIR [SIZE] [REPS]}
size=${2:-4G}
reps=${3:-3}
bs=${BS:-1M}
qds=${QDS:-"8 32"}
here=$(cd "$(dirname "$0")/.." && pwd)
mw=${MEMWALL:-$here/build/memwall}
command -v fio >/dev/null || { echo "io_vs_fio.sh: fio is not installed (scripts/install-deps.sh)"; exit 1; }
[ -x "$mw" ] || { echo "io_vs_fio.sh: $mw not found (make build)"; exit 1; }
mkdir -p "$dir"
fiofile="$dir/fio-bench.$$.dat"
trap 'rm -f "$fiofile"' EXIT

fio_bw() { # fio_bw RW QD -> bytes/s
  fio --name=mw --filename="$fiofile" --rw="$1" --bs="$bs" --iodepth="$2" --size="$size" \
      --direct=1 --ioengine=io_uring --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; k=sys.argv[1]; print(j[k]["bw_bytes"])' \
      "$([ "$1" = write ] && echo write || echo read)"
}

jget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
gbs() { awk -v x="$1" 'BEGIN {printf "%.2f", x/1e9}'; }

echo "memwall engine vs fio: file $size, blocks $bs, O_DIRECT, io_uring, median of $reps runs (GB/s = 10^9 B/s)"
printf '%-4s %-9s %8s %8s %7s   %s\n' QD op fio engine ratio "runs (fio | engine)"
for qd in $qds; do
  fw=(); fo=(); fr=(); ew=(); eo=(); er=()
  for ((i = 0; i < reps; i++)); do
    rm -f "$fiofile"
    fw+=("$(fio_bw write "$qd")")
    fo+=("$(fio_bw write "$qd")")
    fr+=("$(fio_bw read "$qd")")
    rm -f "$fiofile"
    j=$("$mw" bench io --dir "$dir" --size "$size" --block-size "$bs" --queue-depth "$qd" --overwrite --json)
    ew+=("$(jget "$j" write_bytes_per_s)")
    eo+=("$(jget "$j" overwrite_bytes_per_s)")
    er+=("$(jget "$j" read_bytes_per_s)")
  done
  for op in write overwrite read; do
    case $op in
      write) f=("${fw[@]}"); e=("${ew[@]}") ;;
      overwrite) f=("${fo[@]}"); e=("${eo[@]}") ;;
      read) f=("${fr[@]}"); e=("${er[@]}") ;;
    esac
    mf=$(median "${f[@]}"); me=$(median "${e[@]}")
    runs="$(for x in "${f[@]}"; do printf '%s ' "$(gbs "$x")"; done)| $(for x in "${e[@]}"; do printf '%s ' "$(gbs "$x")"; done)"
    printf '%-4s %-9s %8s %8s %7s   %s\n' "$qd" "$op" "$(gbs "$mf")" "$(gbs "$me")" \
      "$(awk -v a="$me" -v b="$mf" 'BEGIN {printf "%.2f", a/b}')" "$runs"
  done
done
