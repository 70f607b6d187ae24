#!/usr/bin/env bash
# The binary's front door: --help lists the subcommands, --version prints the version and the
# kernel path of each operator, and an unknown subcommand or flag fails with a message instead of
# crashing.
set -euo pipefail
# Its own file: the cli tests run in parallel in one folder (ctest -j).
err=$(mktemp)
dayzero=$1
"$dayzero" --help | grep -q "inspect"
"$dayzero" --help | grep -q "bench"
version=$("$dayzero" --version)
head -1 <<<"$version" | grep -Eq "^dayzero [0-9]+\.[0-9]+\.[0-9]+$"
grep -q "^kernel paths:" <<<"$version"
grep -q "^DZ_CPU_ISA: generic" <<<"$(DZ_CPU_ISA=generic "$dayzero" --version)"
if "$dayzero" no-such-command 2>"$err"; then echo "expected failure"; exit 1; fi
grep -qi "no-such-command" "$err"
rm -f "$err"
