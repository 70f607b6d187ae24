#!/usr/bin/env bash
# Proves that README's `make test` passes on a fresh Debian 12: builds a minimal root with debootstrap,
# gives it only what this machine's network needs (apt sources and settings, CA certificates, npm
# configuration), copies in a clean clone of the repository and runs `make test` there as root, which
# installs everything else itself (scripts/install-deps.sh). Run as root; see usage below.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/test-in-clean-root.sh [options]
  --root DIR         where to build the root (default /var/tmp/dayzero-clean-root); a previous root of this
                     script there is unmounted and deleted first
  --repo URL|PATH    repository to clone (default: the one this script is in)
  --commit REV       commit to test (default: HEAD of --repo)
  --keep             leave the root in place afterwards (its mounts are removed all the same)
  --only-configure   stop after `make deps` and the CMake configure of build/ (a quick check of the install)
  --target T         with --only-configure: also build the CMake target T
  --log FILE         full output (default: DIR.log, beside the root)
  --remove           only unmount and delete the root a previous run left (--keep), then exit
Prints the time of each phase and exits with the status of `make test` (or of the quick check).
EOF
}

script_dir=$(cd "$(dirname "$0")" && pwd)
root=/var/tmp/dayzero-clean-root
repo=$(git -C "$script_dir" rev-parse --show-toplevel)
commit=
keep=0
only_configure=0
remove_only=0
target=
log=
while [ $# -gt 0 ]; do
  case $1 in
    --root) root=$2; shift 2 ;;
    --repo) repo=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --only-configure) only_configure=1; shift ;;
    --target) target=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --remove) remove_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done

die() { echo "test-in-clean-root: $*" >&2; exit 1; }
say() { echo "test-in-clean-root: $*" | tee -a "$log"; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mount and chroot need it)"
[ -z "$target" ] || [ "$only_configure" -eq 1 ] || die "--target goes with --only-configure"

# The root is deleted with rm -rf at the end: accept only a plain absolute path at least two levels
# deep that is not an ancestor of this repository, and only ever delete a directory carrying our marker.
root=$(realpath -m -- "$root")
[[ $root =~ ^/[A-Za-z0-9._-]+/[A-Za-z0-9._/-]+$ ]] || die "--root must be an absolute path two levels deep or more, of [A-Za-z0-9._-]: $root"
repo_dir=$(cd "$script_dir/.." && pwd -P)
case "$repo_dir/" in "$root"/*) die "--root $root contains this repository" ;; esac
case "$root/" in "$repo_dir"/*) die "--root $root is inside this repository" ;; esac
[[ $target =~ ^[A-Za-z0-9_.+-]*$ ]] || die "bad --target: $target"
marker=$root/.dayzero-clean-root
if [ -z "$log" ]; then
  if [ "$remove_only" -eq 1 ]; then log=/dev/null; else log=$root.log; fi  # keep the last run's log
fi

# One run per root at a time: a second one fails here, before its trap could touch the first's root.
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock -n 9 || die "another run is using $root ($root.lock is held)"
: >"$log"

# Mount targets strictly under the root, deepest first.
mounts_under_root() {
  findmnt -rn -o TARGET | awk -v r="$root" 'index($0, r "/") == 1' | sort -r
}

# Processes still running inside the root (a server a test left behind) hold its mounts busy. They can
# only be this run's own descendants: the root is ours (marker, lock).
stop_root_processes() {
  local pids=() p
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && pids+=("${p#/proc/}")
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  say "stopping processes left in the root: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 2
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

unmount_root() {
  local m
  for _ in 1 2 3 4 5; do
    [ -n "$(mounts_under_root)" ] || return 0
    while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" || true
    done < <(mounts_under_root)
  done
  [ -z "$(mounts_under_root)" ]
}

# Deletes the root only when it is ours and nothing is mounted under it any more; --one-file-system
# makes rm skip anything mounted that the checks would have missed.
remove_root() {
  [ -e "$root" ] || return 0
  [ -f "$marker" ] || die "$root exists and is not a root of this script (no $marker): not deleting it"
  unmount_root || die "could not unmount $(mounts_under_root | tr '\n' ' '): not deleting $root"
  rm -rf --one-file-system -- "$root"
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM HUP
  rm -f "$deps_done" "$step_status"
  if [ -f "$marker" ]; then
    stop_root_processes
    if ! unmount_root; then
      echo "test-in-clean-root: still mounted, left in place: $(mounts_under_root | tr '\n' ' ')" >&2
    elif [ "$keep" -eq 1 ]; then
      echo "test-in-clean-root: root kept: chroot $root bash (mount /proc, /dev first to use it)" >&2
    else
      remove_root
    fi
  fi
  exit "$rc"
}
deps_done=$(mktemp)
step_status=$(mktemp)
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# A previous run of this script (killed before its trap ran) may have left the root and its mounts.
if [ -f "$marker" ]; then
  say "removing the previous root $root"
  remove_root
  [ "$remove_only" -eq 0 ] || exit 0
elif [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
  die "$root exists and is not a root of this script: choose another --root"
fi

[ "$remove_only" -eq 0 ] || { say "no root of this script at $root"; exit 0; }

avail_gib=$(df -P -BG "$(dirname "$root")" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
need_gib=$((only_configure ? 8 : 20))
[ "$avail_gib" -ge "$need_gib" ] || die "$(dirname "$root") has ${avail_gib} GiB free, the run needs about $need_gib"

# --- The mirror: the first enabled `deb` entry for bookworm in this machine's own apt sources (the
# files apt reads: sources.list, sources.list.d/*.list and, deb822, sources.list.d/*.sources).
source_files=()
[ -f /etc/apt/sources.list ] && source_files+=(/etc/apt/sources.list)
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && source_files+=("$f")
done
[ "${#source_files[@]}" -gt 0 ] || die "no apt sources in /etc/apt"
mirror=
for f in "${source_files[@]}"; do
  case $f in
    *.sources)
      mirror=$(awk '
        function flush() { if (deb && bookworm && enabled && uri != "" && found == "") found = uri
                           deb = bookworm = 0; enabled = 1; uri = "" }
        BEGIN { enabled = 1 }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
        tolower($1) == "uris:" { uri = $2 }
        tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == "bookworm") bookworm = 1 }
        tolower($1) == "enabled:" { enabled = (tolower($2) != "no") }
        END { flush(); print found }' "$f") ;;
    *)
      mirror=$(sed -E 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }') ;;
  esac
  [ -z "$mirror" ] || break
done
[ -n "$mirror" ] || die "no 'deb ... bookworm' entry in ${source_files[*]}"

# The commit to test: resolved now where --repo is a local repository, so that a bad one fails before
# anything slow; a URL's commit is checked out after the clone.
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  rev=${commit:-HEAD}
  commit=$(git -C "$repo" rev-parse --verify -q "$rev^{commit}") || die "no commit $rev in $repo"
else
  commit=${commit:-HEAD}
fi
say "root $root, mirror $mirror, repository $repo at $commit, log $log"

declare -A took
phase_start=
begin() { phase_start=$EPOCHREALTIME; say "--- $1"; }
end() { took[$1]=$(awk -v a="$phase_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }'); }
report() {
  local p
  for p in debootstrap setup install-deps configure build "make test (rest)"; do
    [ -z "${took[$p]:-}" ] || say "$(printf '%-18s %5d s  (%d min %02d s)' "$p" "${took[$p]}" $((took[$p] / 60)) $((took[$p] % 60)))"
  done
}

# --- debootstrap
begin debootstrap
command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap; } >>"$log" 2>&1
mkdir -p "$root"
touch "$marker"
debootstrap --variant=minbase bookworm "$root" "$mirror" >>"$log" 2>&1 || {
  tail -n 30 "$log" >&2
  die "debootstrap failed"
}
end debootstrap

# --- What a fresh machine of this network already has: its apt sources and settings (proxy, snapshot
# mirrors that need Check-Valid-Until off), name resolution, CA certificates and npm configuration.
begin setup
rm -f "$root/etc/apt/sources.list"  # debootstrap's own; the host's sources replace it
for f in "${source_files[@]}"; do
  cp "$f" "$root$f"
  # Keyrings that the sources name and the root lacks (third-party repositories).
  for k in $(grep -oiE '(signed-by[:=][[:space:]]*)/[^] ,[:space:]]+' "$f" | sed -E 's/^[^/]*//'); do
    [ -e "$root$k" ] || { mkdir -p "$(dirname "$root$k")"; cp "$k" "$root$k"; }
  done
done
for f in /etc/apt/apt.conf /etc/apt/apt.conf.d/* /etc/apt/auth.conf.d/*; do
  # The root's own package defaults (same names) win.
  if [ -f "$f" ] && [ ! -e "$root$f" ]; then cp "$f" "$root$f"; fi
done
cp /etc/resolv.conf /etc/hosts "$root/etc/"
mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
if [ -d /usr/local/share/ca-certificates ]; then
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
# Until the root's ca-certificates builds its own bundle, the host's lets apt reach an https mirror.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"; fi
if [ -f /etc/npmrc ]; then cp /etc/npmrc "$root/etc/npmrc"; fi
# A chroot must not start daemons (they would outlive it and hold its mounts).
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"

mount -t proc proc "$root/proc"
mount -o ro -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"

# A clean environment: nothing of this shell's (PATH additions, CA variables) reaches the root.
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "$1"
}

# The one prerequisite README asks of a newcomer besides the repository itself: make (git too, for the
# clone; install-deps.sh installs it). ca-certificates is this network's: it turns the host's CAs into
# the root's bundle, without which npm fails with SELF_SIGNED_CERT_IN_CHAIN.
in_root 'export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends make ca-certificates &&
  update-ca-certificates' >>"$log" 2>&1 || { tail -n 30 "$log" >&2; die "installing make in the root failed"; }

# A clone, not the working tree: nothing uncommitted or ignored can leak in.
clone=$root/root/dayzero
git clone -q --no-hardlinks "$repo" "$clone" >>"$log" 2>&1
# A commit on no branch of a remote is not in the clone until fetched by name.
git -C "$clone" checkout -q --detach "$commit" 2>/dev/null ||
  { git -C "$clone" fetch -q origin "$commit" && git -C "$clone" checkout -q --detach FETCH_HEAD; }
end setup

# --- README's command. Each step runs in the background and the script waits for it, so that a
# signal reaches the trap at once (cleanup then stops what runs in the root) instead of after the step;
# tee ignores Ctrl-C so the log keeps what the root prints until then.
step() {  # step COMMAND: runs COMMAND in the root's clone; returns its status
  : >"$step_status"
  { local rc=0; in_root "cd /root/dayzero && $1" 2>&1 || rc=$?; echo "$rc" >"$step_status"; } | {
    trap '' INT
    while IFS= read -r line; do
      printf '%s\n' "$line"
      if [ ! -s "$deps_done" ] && [ "$line" = "install-deps: all dependencies present" ]; then
        echo "$EPOCHREALTIME" >"$deps_done"
      fi
    done
  } | (trap '' INT; exec tee -a "$log") &
  wait $! || true
  local rc
  rc=$(cat "$step_status")
  return "${rc:-1}"
}

status=0
if [ "$only_configure" -eq 1 ]; then
  begin install-deps
  step 'make deps' || status=$?
  end install-deps
  if [ "$status" -eq 0 ]; then
    begin configure
    step 'make build/build.ninja' || status=$?
    end configure
  fi
  if [ "$status" -eq 0 ] && [ -n "$target" ]; then
    begin build
    step "cmake --build build --target $target" || status=$?
    end build
  fi
else
  begin "make test"
  step 'make test' || status=$?
  # make test runs install-deps.sh first; its last line splits the phase in two.
  if [ -s "$deps_done" ]; then
    split=$(cat "$deps_done")
    took[install-deps]=$(awk -v a="$phase_start" -v b="$split" 'BEGIN { printf "%.0f", b - a }')
    phase_start=$split
  fi
  end "make test (rest)"
fi
report
say "exit status $status"
exit "$status"
