#!/usr/bin/env bash
# The binary's front door: --help lists the subcommands, --version prints the version, and an
# unknown subcommand or flag fails with a message instead of crashing.
set -euo pipefail
dayzero=$1
"$dayzero" --help | grep -q "inspect"
"$dayzero" --help | grep -q "bench"
"$dayzero" --version | grep -Eq "^dayzero [0-9]+\.[0-9]+\.[0-9]+$"
if "$dayzero" no-such-command 2>err.txt; then echo "expected failure"; exit 1; fi
grep -qi "no-such-command" err.txt
rm -f err.txt
