#!/usr/bin/env bash
# Installs bubblewrap (bwrap) for the grading sandbox's tests (tests/test_grading_sandbox.py runs real kernels
# under it; under CI=true those tests fail without it) when it is missing, then checks that it can create its
# namespaces here. Needs root, or sudo without a password. Instructors: README, "For instructors".
set -euo pipefail
PACKAGE=bubblewrap
# shellcheck source=tools/system_packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/system_packages.sh"

check() {
  # a sandbox with every namespace, as the grader makes it: as root, bwrap runs as the unprivileged nobody
  local as=() err
  err=$(mktemp)
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  fi
  if "${as[@]}" "$1" --ro-bind / / --unshare-all --die-with-parent /bin/true 2>"$err"; then
    echo "install_bubblewrap: $1 ($("$1" --version)) creates its namespaces here${as:+ (as nobody)}"
    rm -f "$err"
  else
    echo "install_bubblewrap: $1 is installed but cannot create its namespaces here${as:+ as nobody}: $(cat "$err")" >&2
    rm -f "$err"
    echo "  (where unprivileged user namespaces are restricted, e.g. Ubuntu 23.10+ with AppArmor's" >&2
    echo "  kernel.apparmor_restrict_unprivileged_userns=1, bwrap needs an AppArmor profile with 'userns,':" >&2
    echo "  see course grade's message or README, \"For instructors\")" >&2
    exit 1
  fi
}

if BWRAP=$(command -v bwrap); then
  echo "install_bubblewrap: $BWRAP is present; nothing to install"
  check "$BWRAP"
  exit 0
fi
install_packages install_bubblewrap $PACKAGE
BWRAP=$(command -v bwrap) || { echo "install_bubblewrap: installed $PACKAGE, but bwrap is still not on PATH" >&2; exit 1; }
check "$BWRAP"
