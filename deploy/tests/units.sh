#!/usr/bin/env bash
# deploy/tests/units.sh — the systemd units parse cleanly: systemd-analyze
# verify on instances of each (binaries replaced by /bin/true, since they are
# not installed here) must print nothing. Usage: units.sh
set -u
command -v systemd-analyze >/dev/null ||
  { echo "units: systemd-analyze not found (Debian's systemd; tools/install-deps)" >&2; exit 1; }
src=$(cd "$(dirname "$0")/../systemd" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for u in routerd.service prefilld@pf0.service decoded@dec0.service; do
  sed 's|/usr/local/bin/[a-z]*|/bin/true|' "$src/${u/@*./@.}" >"$tmp/$u"
done
out=$(cd "$tmp" && systemd-analyze verify ./routerd.service ./prefilld@pf0.service \
      ./decoded@dec0.service 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
  echo "systemd-analyze verify (exit $rc):" >&2
  echo "$out" >&2
  exit 1
fi
echo "units: verified"
