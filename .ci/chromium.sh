#!/usr/bin/env bash
# Headless Chromium and chromedriver for the dashboard's browser test
# (examples/tests/dashboard.rs), from Debian's packages.
#
#   bash .ci/chromium.sh   # installs both if either is missing
#
# Only what the test needs: `--no-install-recommends` leaves out the fonts,
# the sandbox helper and the desktop integration Recommends pull in
# (the test runs Chromium with --headless and --no-sandbox), which keeps
# the install to about a minute. Prints nothing on stdout.
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }

if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
  log "chromium and chromedriver are installed ($(/usr/bin/chromium --version 2>/dev/null || echo '?'))"
  exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
  log "Chromium is not installed; run: sudo apt-get install -y --no-install-recommends chromium chromium-driver"
  exit 1
fi
log "installing chromium and chromium-driver from Debian's packages"
apt-get update >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver >&2
log "installed $(/usr/bin/chromium --version 2>/dev/null || echo '?')"
