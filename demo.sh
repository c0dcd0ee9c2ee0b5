#!/bin/sh
# The demo on a fresh Debian, as root: installs what it needs (scripts/deps.sh),
# then `make demo`: the daemon on a lab device that turns slow; prints a table
# of throughput with the default window, readaheadd and the best static window.
set -eu
cd "$(dirname "$0")"
. scripts/deps.sh
deps_install demo
if [ "$(id -u)" -ne 0 ]; then
	echo "demo: needs root (BPF, a loop device and a FUSE mount): run it as root" >&2
	exit 1
fi
exec make demo
