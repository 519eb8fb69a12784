#!/usr/bin/env bash
# make bench: the benchmark suite, each figure with its unit. Scratch files go to ${MW_BENCH_DIR:-./run/bench}.
set -euo pipefail
cli=${1:-build/memwall}
dir=${MW_BENCH_DIR:-run/bench}
mkdir -p "$dir"
echo "== memwall bench io (1 GiB, 1 MiB blocks, QD 8, O_DIRECT) =="
"$cli" bench io --dir "$dir" --size 1G --block-size 1M --queue-depth 8
for sub in adam offload; do
  if "$cli" bench "$sub" --help >/dev/null 2>&1; then
    echo "== memwall bench $sub =="
    if [ "$sub" = offload ]; then "$cli" bench offload --params 64M --tier nvme --nvme-dir "$dir"
    else "$cli" bench adam; fi
  fi
done
echo "For engine vs fio: bash bench/io_vs_fio.sh $dir 4G 3"
