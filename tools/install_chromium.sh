#!/usr/bin/env bash
# Installs Debian's Chromium (and its driver) for the browser tests (e2e/) when it is missing.
# Playwright drives this browser through executable_path: never `playwright install`, which downloads a
# browser build from a CDN that CI cannot reach. Needs root, or sudo without a password.
set -euo pipefail
# shellcheck source=tools/system_packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/system_packages.sh"
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
PACKAGES="chromium chromium-driver"

if [ -x "$CHROMIUM" ]; then
  echo "install_chromium: $CHROMIUM is present ($("$CHROMIUM" --version 2>/dev/null || echo 'version unknown')); nothing to do"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  # another distribution's package names and paths differ: say what to do instead of guessing
  echo "install_chromium: $CHROMIUM is missing and there is no apt-get here; install Chromium with this" >&2
  echo "  system's package manager and set CHROMIUM=/path/to/chromium" >&2
  exit 1
fi
# shellcheck disable=SC2086  # the package list splits on purpose
install_packages install_chromium $PACKAGES
if [ ! -x "$CHROMIUM" ]; then
  echo "install_chromium: installed $PACKAGES, but CHROMIUM=$CHROMIUM is still missing (Debian's is /usr/bin/chromium)" >&2
  exit 1
fi
echo "install_chromium: installed $("$CHROMIUM" --version)"
