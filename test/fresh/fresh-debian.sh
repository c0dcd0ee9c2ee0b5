#!/usr/bin/env bash
# demo.sh and test.sh on a bare Debian, as a new machine would run them: a
# minbase root (debootstrap, nothing installed by hand) with the host's apt
# configuration, resolv.conf, hosts and local certificate authorities, /proc, /sys and /dev bound into it, a clean
# clone of HEAD copied in, each command run in a chroot with an empty
# environment. Prints the time of each step and the packages each added.
# Whatever happens, it stops the processes left in the root, detaches the
# loop devices whose backing file lies in it, unmounts everything under it
# and (without FRESH_KEEP=1) removes it. Root; see docs/fresh-install.md.
#
# Usage: test/fresh/fresh-debian.sh [STEP...]    STEP: nonroot demo test
#   FRESH_DIR        where the root goes (default: a new /var/tmp/readaheadd-fresh.*)
#   FRESH_SUITE      Debian release (default: the host's, from /etc/os-release)
#   FRESH_MIRROR     mirror for debootstrap (default: the one the host's apt uses)
#   FRESH_TESTFLAGS  TESTFLAGS for test.sh (default: make test's own)
#   FRESH_KEEP=1     keep the root afterwards (still unmounted)
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
	echo "fresh-debian: needs root (debootstrap, chroot, mounts)" >&2
	exit 1
fi
for tool in debootstrap chroot git losetup; do
	command -v "$tool" >/dev/null || {
		echo "fresh-debian: $tool not found (apt-get install debootstrap git)" >&2
		exit 1
	}
done
steps=("$@")
[ "${#steps[@]}" -gt 0 ] || steps=(nonroot demo test)
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse HEAD)

# shellcheck disable=SC1091
suite=${FRESH_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}
# The mirror apt on this machine uses for that release ("500 URL suite/main ...").
mirror=${FRESH_MIRROR:-$(apt-cache policy 2>/dev/null | awk -v s="$suite/main" '$3 == s && $2 ~ /^https?:/ { print $2; exit }')}
if [ -z "$mirror" ]; then
	echo "fresh-debian: apt here has no source for $suite: set FRESH_MIRROR" >&2
	exit 1
fi

dir=${FRESH_DIR:-$(mktemp -d /var/tmp/readaheadd-fresh.XXXXXX)}
mkdir -p "$dir"
chmod 755 "$dir"
dir=$(cd "$dir" && pwd -P)
if [ "$dir" = / ]; then
	echo "fresh-debian: FRESH_DIR must not be /" >&2
	exit 1
fi

# under DIR: mount points below it, deepest first (mountinfo escapes spaces).
mounts_under() {
	awk -v d="$dir/" 'index($5 "/", d) == 1 { print $5 }' /proc/self/mountinfo |
		sed 's/\\040/ /g' | awk '{ print length, $0 }' | sort -rn | cut -d' ' -f2-
}

cleanup() {
	local rc=$? pids="" pid n dev bf m
	trap - EXIT INT TERM
	set +e
	echo "=== cleanup"
	# Processes whose root is the chroot (started here, nowhere else).
	for n in 1 2 3; do
		pids=""
		for pid in /proc/[0-9]*; do
			[ "$(readlink "$pid/root" 2>/dev/null)" = "$dir" ] && pids="$pids ${pid#/proc/}"
		done
		[ -n "$pids" ] || break
		echo "stopping processes left in the root:$pids"
		# shellcheck disable=SC2086
		if [ "$n" -lt 3 ]; then kill -TERM $pids 2>/dev/null; else kill -KILL $pids 2>/dev/null; fi
		sleep 3
	done
	# Loop devices on files in the root (the lab's), before and after the
	# unmounts: a mounted one detaches when its file system is unmounted.
	detach_loops() {
		for bf in /sys/block/loop*/loop/backing_file; do
			[ -r "$bf" ] || continue
			case "$(cat "$bf" 2>/dev/null)" in
			"$dir"/*)
				dev=/dev/$(basename "$(dirname "$(dirname "$bf")")")
				echo "detaching $dev ($(cat "$bf"))"
				losetup -d "$dev"
				;;
			esac
		done
	}
	detach_loops
	while IFS= read -r m; do
		[ -n "$m" ] || continue
		umount "$m" 2>/dev/null || umount -l "$m" || echo "could not unmount $m" >&2
	done < <(mounts_under)
	detach_loops
	if [ -n "$(mounts_under)" ]; then
		echo "still mounted under $dir, not removing it:" >&2
		mounts_under >&2
		[ "$rc" -ne 0 ] || rc=1
	elif [ "${FRESH_KEEP:-0}" = 1 ]; then
		echo "kept $dir"
	else
		rm -rf --one-file-system "$dir"
		echo "removed $dir"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$(date +%s)
elapsed() { echo $(($(date +%s) - $1)); }
# The packages dpkg has installed in the root.
pkgs() { chroot "$dir" dpkg-query -W -f='${Package}\n' | sort; }

echo "=== debootstrap --variant=minbase $suite $dir $mirror"
t=$(date +%s)
debootstrap --variant=minbase "$suite" "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 || {
	tail -20 "$dir.debootstrap.log" >&2
	exit 1
}
rm -f "$dir.debootstrap.log"
echo "debootstrap: $(elapsed "$t") s, $(pkgs | wc -l) packages, $(du -sm "$dir" | cut -f1) MB"

# apt as this machine has it, and its name resolution.
if [ ! -e /etc/apt/sources.list ]; then rm -f "$dir/etc/apt/sources.list"; fi
for d in sources.list sources.list.d apt.conf.d preferences.d trusted.gpg.d keyrings auth.conf.d; do
	[ -e "/etc/apt/$d" ] && cp -a "/etc/apt/$d" "$dir/etc/apt/"
done
cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
# The root shares the host's name (one UTS namespace): Java (the HDFS tests)
# resolves it, so the names in /etc/hosts come along, as an installer writes them.
cp -L /etc/hosts "$dir/etc/hosts"
cp -L /etc/hostname "$dir/etc/hostname" 2>/dev/null || hostname >"$dir/etc/hostname"
# The certificate authorities this machine adds to Debian's (its network may
# need one for HTTPS); the ca-certificates package, once installed, takes them in.
if [ -d /usr/local/share/ca-certificates ]; then
	mkdir -p "$dir/usr/local/share/ca-certificates"
	cp -a /usr/local/share/ca-certificates/. "$dir/usr/local/share/ca-certificates/"
fi

# The root a mount point of its own, as a machine's root is: container
# storage (buildah, podman) remounts / private and fails with EINVAL on a
# plain directory.
mount --bind "$dir" "$dir"
mount --make-private "$dir"
for m in proc sys dev; do
	mount --rbind "/$m" "$dir/$m"
	# Unmounting under the root must not reach the host's mounts.
	mount --make-rslave "$dir/$m"
done

# A clean clone of HEAD (git is not in the root: cloned here, copied in),
# readable by nobody for the step without root.
git clone -q "$repo" "$dir/srv/readaheadd"
git -C "$dir/srv/readaheadd" checkout -q "$commit"
echo "source: $commit"

# in_root CMD...: CMD in the chroot, in the clone, with an empty environment.
in_root() {
	env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		${GOPROXY:+GOPROXY=$GOPROXY} "$@"
}

status=0
for step in "${steps[@]}"; do
	before=$(pkgs)
	t=$(date +%s)
	set +e
	case "$step" in
	nonroot)
		echo "=== test.sh as nobody (must list what to install and exit non-zero)"
		out=$(in_root chroot --userspec=nobody:nogroup "$dir" /bin/sh -c 'cd /srv/readaheadd && ./test.sh' 2>&1)
		rc=$?
		echo "$out"
		# Fails, names the packages and the Go version, installs nothing.
		if [ "$rc" -ne 0 ] && grep -q 'apt-get install' <<<"$out" && grep -q '^  Go ' <<<"$out"; then rc=0; else rc=1; fi
		;;
	demo)
		echo "=== ./demo.sh"
		in_root chroot "$dir" /bin/sh -c 'cd /srv/readaheadd && ./demo.sh'
		rc=$?
		;;
	test)
		echo "=== ./test.sh${FRESH_TESTFLAGS:+ with TESTFLAGS=$FRESH_TESTFLAGS}"
		flags=()
		[ -z "${FRESH_TESTFLAGS:-}" ] || flags=(TESTFLAGS="$FRESH_TESTFLAGS")
		in_root "${flags[@]}" chroot "$dir" /bin/sh -c 'cd /srv/readaheadd && ./test.sh'
		rc=$?
		;;
	*)
		echo "fresh-debian: unknown step $step (nonroot, demo, test)" >&2
		rc=2
		;;
	esac
	set -e
	added=$(comm -13 <(echo "$before") <(pkgs))
	echo "--- $step: exit $rc, $(elapsed "$t") s, $(echo "$added" | sed '/^$/d' | wc -l) packages added"
	[ -z "$added" ] || echo "$added" | tr '\n' ' ' | fold -s -w 100
	echo
	[ "$rc" -eq 0 ] || status=1
done
echo "=== total $(elapsed "$t0") s, $(pkgs | wc -l) packages in the root, $(du -smx "$dir" | cut -f1) MB"
exit "$status"
