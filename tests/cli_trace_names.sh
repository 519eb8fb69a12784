#!/usr/bin/env bash
# The trace names memwall writes are the documented ones: a real training run with the optimizer
# state on the NVMe tier, one with the weights streamed from NVMe (--offload-params nvme) and an
# offload run with the emulated accelerator are traced, and every
# (ph, cat, name) in the two traces must be in the Events table of docs/trace-conventions.md
# (not in its "Also accepted" table: legacy names are for reading old traces only). Then
# `memwall report` reads the training trace and finds its offload read/write/update spans and
# decisions per subgroup.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_trace_names-$$
rm -rf "$dir" && mkdir -p "$dir"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

"$cli" train --preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --steps 3 \
  --subgroup-size 10000 --buffer-count 3 --optimizer-tier nvme --nvme-dir "$dir/nvme" --val-every 2 \
  --trace "$dir/train.json" >"$dir/train.out" 2>&1 || { bad "traced nvme training run failed"; cat "$dir/train.out"; }
"$cli" train --preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --steps 2 --grad-accum 3 \
  --subgroup-size 4096 --offload-params nvme --nvme-dir "$dir/nv3" --val-every 0 --trace "$dir/train-stream.json" \
  >"$dir/stream.out" 2>&1 || { bad "traced streamed training run failed"; cat "$dir/stream.out"; }
"$cli" bench offload --params 300000 --subgroup-size 65536 --tier nvme --nvme-dir "$dir/nv2" --device \
  --policy every-2 --steps 1 --no-kernel --trace "$dir/bench.json" --json >"$dir/bench.out" 2>&1 \
  || { bad "traced bench offload run failed"; cat "$dir/bench.out"; }

python3 - "$src/docs/trace-conventions.md" "$dir/train.json" "$dir/bench.json" "$dir/train-stream.json" <<'EOF' || fail=1
import json, re, sys
doc, traces = sys.argv[1], sys.argv[2:]
text = open(doc, encoding="utf-8").read()
events = text.split("## Events", 1)[1].split("\n## ", 1)[0]
allowed = set()
for line in events.splitlines():
    cells = [c.strip() for c in line.split("|")]
    if len(cells) < 6 or not cells[2].startswith("`"):
        continue
    ticks = lambda c: re.findall(r"`([^`]*)`", c)
    phs, cats, names = ticks(cells[2]), ticks(cells[3]) or [""], ticks(cells[4])
    expanded = []
    for n in names:  # "<tier> bytes": one per tier name
        expanded += [n.replace("<tier>", t) for t in ("device", "host", "nvme")] if "<tier>" in n else [n]
    for ph in phs:
        for cat in cats:
            for n in expanded:
                allowed.add((ph, cat, n))
if len(allowed) < 20:
    print("FAIL: parsed only %d (ph, cat, name) triples from %s" % (len(allowed), doc)); sys.exit(1)
bad = 0
for path in traces:
    seen = {}
    for e in json.load(open(path))["traceEvents"]:
        key = (e.get("ph"), e.get("cat", ""), e.get("name"))
        seen[key] = seen.get(key, 0) + 1
    for key, n in sorted(seen.items()):
        if key not in allowed:
            print("FAIL: %s: %d event(s) %r not in the Events table of %s" % (path, n, key, doc)); bad = 1
    # The run must have exercised what it is meant to: a test that sees nothing checks nothing.
    want = [("X", "offload", "read"), ("X", "offload", "write"), ("X", "offload", "update"), ("X", "io", "read"),
            ("X", "io", "write"), ("X", "offload", "step")]
    want += [("X", "phase", "forward"), ("X", "step", "step"), ("C", "counter", "loss")] if "train" in path else \
            [("X", "decision", "device"), ("X", "decision", "cpu"), ("X", "device", "kernel")]
    want += [("X", "residency", n) for n in ("fetch", "resident", "grad_write", "act_write", "act_read")] \
            if "stream" in path else []
    for key in want:
        if key not in seen:
            print("FAIL: %s has no %r events" % (path, key)); bad = 1
sys.exit(bad)
EOF

# The report reads the training trace: every subgroup has read, write and update time and bytes.
"$cli" report "$dir/train.json" --csv "$dir/csv" --text >"$dir/report.out" 2>&1 \
  || { bad "memwall report failed"; cat "$dir/report.out"; }
python3 - "$dir/csv/subgroups.csv" <<'EOF' || fail=1
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
if len(rows) != 4:  # 35968 parameters in subgroups of 10000
    print("FAIL: report found %d subgroups, want 4" % len(rows)); sys.exit(1)
bad = 0
for r in rows:
    for k in ("read_s", "update_s", "write_s"):
        if not r[k] or float(r[k]) <= 0:
            print("FAIL: subgroup %s: %s = %r" % (r["subgroup"], k, r[k])); bad = 1
    if int(r["bytes_read"]) <= 0 or int(r["bytes_written"]) <= 0 or int(r["updates_cpu"]) != 3:
        print("FAIL: subgroup %s: %r" % (r["subgroup"], r)); bad = 1
sys.exit(bad)
EOF
rm -rf "$dir"
[ $fail = 0 ] && echo "cli_trace_names: passed" || echo "cli_trace_names: failed"
exit $fail
