#!/usr/bin/env bash
# Installs Debian's Chromium (and its driver) for the browser tests (e2e/) when it is missing.
# Playwright drives this browser through executable_path: never `playwright install`, which downloads a
# browser build from a CDN that CI cannot reach. Needs root, or sudo without a password.
set -euo pipefail
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
PACKAGES="chromium chromium-driver"

if [ -x "$CHROMIUM" ]; then
  echo "install_chromium: $CHROMIUM is present ($("$CHROMIUM" --version 2>/dev/null || echo 'version unknown')); nothing to do"
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  SUDO=
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  echo "install_chromium: $CHROMIUM is missing and this user can neither install packages (not root) nor" >&2
  echo "  use sudo without a password; ask an administrator for: apt-get install $PACKAGES" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "install_chromium: $CHROMIUM is missing and there is no apt-get here; install Chromium with this" >&2
  echo "  system's package manager and set CHROMIUM=/path/to/chromium" >&2
  exit 1
fi
echo "install_chromium: installing $PACKAGES with apt-get"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
if [ ! -x "$CHROMIUM" ]; then
  echo "install_chromium: installed $PACKAGES, but CHROMIUM=$CHROMIUM is still missing (Debian's is /usr/bin/chromium)" >&2
  exit 1
fi
echo "install_chromium: installed $("$CHROMIUM" --version)"
