#!/bin/sh
# Install one Debian package for the tests when its binary is missing (make browser-deps, make door-deps).
# Usage: apt_install.sh PACKAGE BINARY ARTIFACT_DIR WHAT
# Never fails the build: when it cannot install (no root, no password-less sudo, no apt-get, apt refused),
# it writes the reason to ARTIFACT_DIR/PACKAGE-missing.txt, and the tests that need BINARY skip with it.
# APT_GET is a variable only to try this script without touching the system.
package=$1; binary=$2; artifacts=$3; what=$4
apt_get=${APT_GET:-apt-get}
mkdir -p "$artifacts"; missing="$artifacts/$package-missing.txt"; log="$artifacts/apt-$package.log"
rm -f "$missing"
reason() { echo "$what: $1" | tee "$missing"; }
[ -x "$binary" ] && exit 0
if [ "$(id -u)" = 0 ]; then sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"
else reason "$binary is missing, and installing $package needs root or password-less sudo"; exit 0; fi
if ! command -v "$apt_get" >/dev/null 2>&1; then reason "$binary is missing and there is no apt-get (not Debian/Ubuntu)"; exit 0; fi
echo "$what: installing Debian's $package, log in $log"
export DEBIAN_FRONTEND=noninteractive
$sudo "$apt_get" install -y --no-install-recommends "$package" >"$log" 2>&1 \
  || { $sudo "$apt_get" update >>"$log" 2>&1 && $sudo "$apt_get" install -y --no-install-recommends "$package" >>"$log" 2>&1; } \
  || { reason "apt-get could not install $package (see $log): $(tail -n 3 "$log" | tr '\n' ' ')"; exit 0; }
[ -x "$binary" ] || reason "$package was installed but $binary is still missing"
