#!/usr/bin/env bash
# CLI contract: help exits 0, unknown commands/options exit 2 with a message.
set -u
cli=${MW_CLI:?}
fail=0
expect() { # expect CODE cmd...
  local want=$1; shift
  "$@" >/tmp/cli_basic.$$ 2>&1; local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: '$*' exited $got, want $want"; cat /tmp/cli_basic.$$; fail=1; fi
}
expect 0 "$cli" --help
expect 0 "$cli" version
expect 2 "$cli"
expect 2 "$cli" no-such-command
expect 2 "$cli" bench
expect 2 "$cli" bench no-such-bench
"$cli" --help | grep -q "train" || { echo "FAIL: top-level help lists no train"; fail=1; }
rm -f /tmp/cli_basic.$$
[ $fail = 0 ] && echo "cli_basic: 1 passed, 0 failed" || echo "cli_basic: 0 passed, 1 failed"
exit $fail
