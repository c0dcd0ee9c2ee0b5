#!/bin/sh
# The test suite on a fresh Debian: as root it first installs what the tests
# need (scripts/deps.sh), then runs `make test` (the root tests included).
# Without root it installs nothing: it says what is missing and exits 1, or,
# with everything there, runs the suite, whose root tests then skip.
# TESTFLAGS passes through to go test, e.g. to run a part of the suite:
#   TESTFLAGS="-count=1 -timeout 25m -run 'TestLab|Capabilit'" ./test.sh
set -eu
cd "$(dirname "$0")"
. scripts/deps.sh
deps_install test
exec make test ${TESTFLAGS+"TESTFLAGS=$TESTFLAGS"}
