#!/bin/sh
# Build (if needed) and run the real MiniDFSCluster command server on BASEDIR, talking on
# stdin/stdout; Hadoop's logs go to stderr. Example:
#   printf 'write /f 256\nread /f\nquit\n' | test/hdfs/run.sh /mnt/lab/hdfs 2>hdfs.log
set -eu
if [ $# -lt 1 ]; then
	echo "usage: $0 BASEDIR [READ_BUFFER_BYTES]" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
stamp=target/.built
if [ ! -f "$stamp" ] || [ -n "$(find pom.xml src -newer "$stamp" -type f | head -n1)" ]; then
	goals="-q -B compile dependency:build-classpath -Dmdep.outputFile=$here/target/classpath.txt"
	# Offline first: only the first build needs Maven Central (about 110 MB into ~/.m2).
	# shellcheck disable=SC2086
	mvn -o $goals >&2 || mvn $goals >&2
	date -u +%Y-%m-%dT%H:%M:%SZ >"$stamp"
fi
cd - >/dev/null
exec java -Xmx2g -XX:+ExitOnOutOfMemoryError -Djava.net.preferIPv4Stack=true \
	-cp "$here/target/classes:$(cat "$here/target/classpath.txt")" \
	io.readaheadd.hdfsbench.Server "$@"
