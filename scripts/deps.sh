# What readaheadd's demo, tests and CI need on Debian, and the one step that
# installs it: the Debian packages of the list below (with apt as the machine
# has it configured) and Go, if it is missing or older than go.mod asks.
#
# Sourced from the repository's top directory by demo.sh, test.sh and
# .ci/run, which then call `deps_install demo|test|ci`; `sh scripts/deps.sh [demo|test|ci]` runs the
# same step alone. As root it installs what is missing; otherwise it prints
# what to install and returns 1 without trying. POSIX sh: a bare Debian has
# no bash-only tools to rely on, only dash, apt and dpkg.

# The packages, each with the first of demo, test and ci that needs it: test
# takes demo's too, ci all three. Essential packages (util-linux: losetup,
# setpriv, unshare; mount) are on every Debian and are not listed.
deps_packages() {
	cat <<'EOF'
make                    demo  the Makefile
gcc                     demo  the lab's FUSE server (labfs); cgo
libc6-dev               demo  gcc's headers and C library (a recommends of gcc only)
pkg-config              demo  finds libfuse3 for labfs
libfuse3-dev            demo  labfs
fuse3                   demo  fusermount3, /etc/fuse.conf
e2fsprogs               demo  mkfs.ext4 on the lab device
ca-certificates         demo  https to the Go module proxy
curl                    demo  fetches Go from the Go module proxy
unzip                   demo  unpacks it
procps                  test  pgrep (the HDFS tests)
prometheus              test  promtool and the server the end-to-end test scrapes with
openjdk-17-jdk-headless test  the real HDFS tests (MiniDFSCluster)
maven                   test  builds the HDFS test harness, fetches Hadoop
buildah                 test  the image test builds deploy/kubernetes/Dockerfile
podman                  test  and runs it as the DaemonSet does
crun                    test  podman's runtime
systemd                 test  systemd-analyze verify of the unit
systemd-container       test  systemd-nspawn: the unit under a real systemd (test/systemd)
debootstrap             test  the Debian root that test boots
xfsprogs                test  mkfs.xfs for the lab's xfs file systems
clang                   ci    make generate (the BPF objects)
llvm                    ci    llvm-strip for bpf2go
libbpf-dev              ci    the BPF headers
bpftool                 ci    vmlinux.h
git                     ci    make check-generate compares with git
EOF
}

# The Go release fetched when Go is missing or too old (go.mod's "go" line
# is the least accepted).
DEPS_GO_FETCH=1.26.8

# deps_list LEVEL: the package names LEVEL needs.
deps_list() {
	case "$1" in
	demo) deps_levels="demo" ;;
	test) deps_levels="demo test" ;;
	ci) deps_levels="demo test ci" ;;
	*)
		echo "deps: unknown level '$1' (demo, test or ci)" >&2
		return 2
		;;
	esac
	deps_packages | awk -v want=" $deps_levels " 'index(want, " " $2 " ") { print $1 }'
}

# deps_missing LEVEL: the packages LEVEL needs that dpkg does not have installed.
deps_missing() {
	for p in $(deps_list "$1"); do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || printf "%s " "$p"
	done
}

# deps_go_version BIN: the version of the Go toolchain BIN (1.26.8), or nothing.
deps_go_version() {
	{ "$1" env GOVERSION 2>/dev/null || true; } | sed -n 's/^go\([0-9][0-9.]*\).*/\1/p'
}

# deps_go_ok VERSION: VERSION is go.mod's Go version or newer.
deps_go_ok() {
	[ -n "$1" ] && [ "$(printf '%s\n%s\n' "$DEPS_GO_WANT" "$1" | sort -V | head -n 1)" = "$DEPS_GO_WANT" ]
}

# deps_go_pick: puts a Go that satisfies go.mod first in PATH, the one in
# PATH or /usr/local/go's; returns 1 when there is none.
deps_go_pick() {
	if command -v go >/dev/null 2>&1 && deps_go_ok "$(deps_go_version go)"; then
		return 0
	fi
	if [ -x /usr/local/go/bin/go ] && deps_go_ok "$(deps_go_version /usr/local/go/bin/go)"; then
		PATH=/usr/local/go/bin:$PATH
		export PATH
		hash -r 2>/dev/null || true
		return 0
	fi
	return 1
}

# deps_go_fetch: Go $DEPS_GO_FETCH into /usr/local/go, from the Go module
# proxy's toolchain archive (the one GOTOOLCHAIN=auto downloads).
deps_go_fetch() {
	proxy=${GOPROXY:-https://proxy.golang.org}
	proxy=${proxy%%,*}
	proxy=${proxy%%|*}
	case "$proxy" in http*) ;; *) proxy=https://proxy.golang.org ;; esac
	case "$(uname -m)" in
	x86_64) arch=amd64 ;;
	aarch64) arch=arm64 ;;
	*)
		echo "deps: no Go toolchain for $(uname -m) here: install Go $DEPS_GO_WANT or newer by hand" >&2
		return 1
		;;
	esac
	mod="golang.org/toolchain@v0.0.1-go$DEPS_GO_FETCH.linux-$arch"
	echo "deps: installing Go $DEPS_GO_FETCH into /usr/local/go from $proxy (found: ${1:-none}, go.mod needs $DEPS_GO_WANT)"
	tmp=$(mktemp -d)
	if ! curl -fsSL -o "$tmp/go.zip" "$proxy/golang.org/toolchain/@v/v0.0.1-go$DEPS_GO_FETCH.linux-$arch.zip"; then
		rm -rf "$tmp"
		echo "deps: could not download Go from $proxy: set GOPROXY to a reachable Go module proxy" >&2
		return 1
	fi
	# The module zip keeps no file modes.
	unzip -q "$tmp/go.zip" -d "$tmp" &&
		rm -rf /usr/local/go &&
		mv "$tmp/$mod" /usr/local/go &&
		chmod +x /usr/local/go/bin/* /usr/local/go/pkg/tool/*/*
	rc=$?
	rm -rf "$tmp"
	[ "$rc" -eq 0 ] || echo "deps: could not unpack Go into /usr/local/go" >&2
	return "$rc"
}

# deps_install LEVEL: installs what LEVEL needs (root), or says what is
# missing and returns 1 (not root). Leaves a suitable Go first in PATH, and
# /usr/sbin (Debian's bpftool, mkfs.ext4, losetup) in it.
deps_install() {
	deps_level=${1:-test}
	deps_list "$deps_level" >/dev/null || return 2
	case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/sbin:/sbin ;; esac
	export PATH
	DEPS_GO_WANT=$(awk '/^go /{ print $2; exit }' go.mod)
	[ -n "$DEPS_GO_WANT" ] || {
		echo "deps: no go line in ./go.mod: run from the repository's top directory" >&2
		return 2
	}
	missing=$(deps_missing "$deps_level")
	missing=${missing% }
	go_have=""
	if ! deps_go_pick; then
		command -v go >/dev/null 2>&1 && go_have=$(deps_go_version go)
		[ -n "$go_have" ] || go_have=none
	fi

	if [ "$(id -u)" -ne 0 ]; then
		[ -z "$missing" ] && [ -z "$go_have" ] && return 0
		echo "deps: not root, so nothing is installed. What '$deps_level' needs:" >&2
		[ -n "$missing" ] && echo "  Debian packages: apt-get install --no-install-recommends $missing" >&2
		[ -n "$go_have" ] && echo "  Go $DEPS_GO_WANT or newer (found: $go_have; as root this step installs Go $DEPS_GO_FETCH into /usr/local/go)" >&2
		echo "Run this again as root to install them, or install them and run it again." >&2
		return 1
	fi

	deps_t0=$(date +%s)
	if [ -n "$missing" ]; then
		echo "deps: installing $missing"
		DEBIAN_FRONTEND=noninteractive
		export DEBIAN_FRONTEND
		apt-get update -qq || return 1
		# shellcheck disable=SC2086 # one word per package
		apt-get install -y -qq --no-install-recommends $missing >/dev/null || return 1
	fi
	if [ -n "$go_have" ]; then
		deps_go_fetch "$go_have" || return 1
		deps_go_pick || {
			echo "deps: Go $DEPS_GO_FETCH installed but not usable from /usr/local/go/bin" >&2
			return 1
		}
	fi
	if [ -n "$missing$go_have" ]; then
		echo "deps: installed in $(($(date +%s) - deps_t0)) s"
	fi
	return 0
}

case "${0##*/}" in
deps.sh)
	set -eu
	cd "$(dirname "$0")/.."
	deps_install "${1:-test}"
	;;
esac
