#!/usr/bin/env bash
# deploy/tests/units.sh — the systemd units parse cleanly: systemd-analyze
# verify on instances of each (binaries replaced by /bin/true, since they are
# not installed here) must print nothing; and each unit's TimeoutStopSec
# covers its daemon's shutdown with the default settings (the drain deadline
# and what follows it, docs/daemons.md), by at most 15 s more.
# Usage: units.sh ROUTERD PREFILLD DECODED
set -u
command -v systemd-analyze >/dev/null ||
  { echo "units: systemd-analyze not found (Debian's systemd; tools/install-deps)" >&2; exit 1; }
src=$(cd "$(dirname "$0")/../systemd" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for u in routerd.service prefilld@pf0.service decoded@dec0.service tandem-ready.service; do
  sed 's|/usr/local/bin/[a-z]*|/bin/true|' "$src/${u/@*./@.}" >"$tmp/$u"
done
out=$(cd "$tmp" && systemd-analyze verify ./routerd.service ./prefilld@pf0.service \
      ./decoded@dec0.service ./tandem-ready.service 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
  echo "systemd-analyze verify (exit $rc):" >&2
  echo "$out" >&2
  exit 1
fi
# TimeoutStopSec in ms: what the unit says, what the daemon needs.
fails=0
opt() { "$1" --dump-config | sed -n "s/^$2 = //p"; }
ms() { # 30s, 1m, 250ms, 10000 (ms) -> ms
  case $1 in
    *ms) echo "${1%ms}" ;; *s) echo $(( ${1%s} * 1000 )) ;; *m) echo $(( ${1%m} * 60000 )) ;;
    *h) echo $(( ${1%h} * 3600000 )) ;; *) echo "$1" ;;
  esac
}
check_stop() { # UNIT BIN NEED_MS
  local t
  t=$(ms "$(sed -n 's/^TimeoutStopSec=//p' "$src/$1")")
  if [ -z "$t" ] || [ "$t" -lt "$3" ] || [ "$t" -gt $(( $3 + 15000 )) ]; then
    echo "units: $1: TimeoutStopSec ${t:-unset} ms does not match $(basename "$2")'s stop bound $3 ms" >&2
    fails=$((fails + 1))
  fi
}
if [ $# -eq 3 ]; then
  routerd=$1 prefilld=$2 decoded=$3
  # routerd: the drain, 100 ms for the last answers, 1 s of margin
  check_stop routerd.service "$routerd" $(( $(ms "$(opt "$routerd" drain-timeout)") + 1100 ))
  # workers: the drain, then what the abort may wait for, then 100 ms to flush
  check_stop prefilld@.service "$prefilld" $(( $(ms "$(opt "$prefilld" drain-timeout)") +
    2 * $(opt "$prefilld" xfer-deadline-ms) + 2000 + 100 ))
  check_stop decoded@.service "$decoded" $(( $(ms "$(opt "$decoded" drain-timeout)") + 200 ))
else
  echo "units: no daemons given: stop timeouts not checked" >&2
  exit 1
fi
[ $fails -eq 0 ] || exit 1
echo "units: verified"
