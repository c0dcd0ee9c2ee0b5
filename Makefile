# readaheadd build, test and benchmark entry points.
# `make demo` runs the daemon on the lab; `make test` runs the whole test suite
# (integration tests need root and skip without it).

GO        ?= go
CC        ?= cc
BIN       := bin
LABFS     := test/lab/labfs/labfs
GOTEST    ?= $(GO) test
TESTFLAGS ?= -count=1 -timeout 25m

.PHONY: all build generate check-generate labfs test test-unit vet demo bench bench-short clean

all: build

build: labfs
	CGO_ENABLED=0 $(GO) build -o $(BIN)/readaheadd ./cmd/readaheadd

# Regenerate the BPF objects and Go bindings (needs clang, llvm, libbpf-dev, bpftool).
# Every package with a go:generate line (each BPF object has its own).
generate:
	$(GO) generate ./pkg/... ./cmd/...

# CI: regenerated objects must equal the committed ones (and none may be
# missing from git).
check-generate: generate
	git diff --exit-code -- pkg cmd bpf || { echo "BPF objects differ from bpf/ sources: run 'make generate' and commit"; exit 1; }
	test -z "$$(git status --porcelain --untracked-files=all -- ':(glob)**/*_bpfel.go' ':(glob)**/*_bpfel.o')" || { git status --short -- ':(glob)**/*_bpfel.*'; echo "generated BPF objects not in git: run 'make generate' and commit them"; exit 1; }

# The lab's FUSE server (libfuse3, Debian's libfuse3-dev).
labfs: $(LABFS)
$(LABFS): test/lab/labfs/labfs.c
	$(CC) -O2 -Wall -Wextra -o $@ $< $$(pkg-config --cflags --libs fuse3) -lpthread -lm

vet:
	$(GO) vet ./...

test-unit:
	$(GOTEST) $(TESTFLAGS) ./...

# The full suite; run as root for the BPF, lab, real-HDFS and end-to-end
# tests. Packages run one at a time (-p 1): the root tests share the machine's
# page cache (drop_caches) and its two cores, and their ratios are measured
# side by side within a package, so they must not race each other.
test: labfs build
	READAHEADD_HDFS=1 $(GOTEST) -p 1 $(TESTFLAGS) ./...

clean:
	rm -rf $(BIN) $(LABFS)

# Real, unmodified HDFS (MiniDFSCluster) on a loop device: needs root, Java 17 and Maven;
# the first run downloads about 110 MB of Hadoop jars into ~/.m2. See docs/hdfs.md.
.PHONY: test-hdfs bench-hdfs
test-hdfs:
	READAHEADD_HDFS=1 $(GOTEST) $(TESTFLAGS) -v -run RealHDFS ./test/hdfs/

bench-hdfs:
	READAHEADD_HDFS=1 $(GOTEST) -count=1 -timeout 25m -run '^$$' -bench RealHDFS -benchtime=3x ./test/hdfs/...

# The lab device (test/lab): LAB_DIR is where its ext4 file system is mounted.
LAB_DIR  ?= /tmp/readaheadd-lab
LAB_SIZE ?= 2G
.PHONY: lab-up lab-down bench-lab
lab-up: labfs
	$(GO) run ./test/lab/cmd/lab up --dir $(LAB_DIR) --size $(LAB_SIZE)

# Removes every lab and anything a crashed run left behind.
lab-down:
	$(GO) run ./test/lab/cmd/lab down

# The lab's acceptance benchmarks in their full form (256 MB files).
bench-lab: labfs
	READAHEADD_BENCH=full $(GOTEST) $(TESTFLAGS) -v -run 'TestLab' ./test/lab/

# The daemon on the lab (root): a reader of a file that turns slow (+3 ms
# per read) with the default window, with readaheadd, and with the best
# static window; prints a table and the actions taken, and writes a PNG
# timeline to bin/demo (a minute or two). The acceptance test of the same
# story, with the metrics and the restore on SIGTERM, is
# TestEndToEndPermanentSlowdown in ./cmd/readaheadd.
demo: labfs
	$(GO) build -o $(BIN)/demo ./test/demo
	$(BIN)/demo -out $(BIN)/demo-out

.PHONY: bench-probe
# What the BPF probe costs per block read request, from the kernel's BPF
# run-time statistics while reading 512 MB from a loop device (root).
bench-probe:
	READAHEADD_BENCH=1 $(GOTEST) -count=1 -v -run '^TestBenchProbeCost$$' ./pkg/probe/

# Detector acceptance on the lab (root): records live runs (regimes in turn,
# healthy) into test/integration/detector/testdata, then replays them and
# prints precision, recall and detection delay per regime kind. Without root
# the replay runs on the committed recordings only. See docs/detector.md.
DETECTOR_TESTDATA := $(CURDIR)/test/integration/detector/testdata
.PHONY: bench-detector
bench-detector: labfs
	READAHEADD_BENCH=full READAHEADD_DETECTOR_RECORD=$(DETECTOR_TESTDATA) $(GOTEST) $(TESTFLAGS) -v -run 'TestDetectorLab' ./test/integration/detector/
	$(GOTEST) -count=1 -run '^$$' -bench DetectorReplay -benchtime=1x ./test/integration/detector/

# Fail-slow disks on the lab (root): 10 minutes of two healthy disks under the
# same load, 3 minutes at different request sizes and queue depths, then one
# disk 3 ms slower on every read and one file slower than its disk
# (docs/operations.md, "Fail-slow disks and files"). CI runs a 30 s form.
.PHONY: bench-failslow
bench-failslow: labfs
	READAHEADD_BENCH=failslow $(GOTEST) -count=1 -timeout 30m -v -run '^TestFailSlowDiskLab$$' ./cmd/readaheadd/

# Evaluation (test/bench): every workload and regime on the lab, side by side
# for the default read_ahead_kb, each static value and readaheadd; writes
# docs/results/ (report, results.json, PNG plots). Needs root; HDFS needs Java 17
# and Maven. See docs/benchmarks.md.
bench: labfs build
	READAHEADD_BIN=$(CURDIR)/$(BIN)/readaheadd $(GO) run ./test/bench/cmd/benchrun -full -out docs/results

# The reduced matrix CI runs (a few minutes; HDFS only with READAHEADD_HDFS=1).
# Skips without root.
bench-short: labfs build
	READAHEADD_BENCH=short READAHEADD_BIN=$(CURDIR)/$(BIN)/readaheadd $(GOTEST) -count=1 -timeout 20m -v -run 'TestBenchShort|TestRecovery|TestTargets|TestDecisions|TestDedupe' ./test/bench/

# The full soak (root, about 11 minutes): the daemon under churning
# sequential readers, random readers and many small files while the lab's
# regimes switch; prints memory, goroutines, tracked files, lost events and
# actions over time. See docs/reliability.md.
.PHONY: soak
soak: labfs
	READAHEADD_BENCH=full $(GOTEST) -count=1 -timeout 20m -v -run '^TestSoak$$' ./test/reliability/

.PHONY: bench-frontier
# What a mixed device can give both of its readers (root, about 4 minutes):
# a slowed stream at each window beside an mmap random reader at its
# read-around window or trimmed; prints the stream's MB/s and the random
# reader's touches and latency per point. See docs/tuner.md.
bench-frontier: labfs
	READAHEADD_BENCH=frontier $(GOTEST) -count=1 -timeout 15m -v -run '^TestMixedDeviceFrontier$$' ./test/bench/

.PHONY: bench-blocks
# Fresh block files (root, about 3 minutes): files each opened afresh and
# read whole once, back to back, every one slow before its open, on a fast
# lab device and the default one; prints every static window's MB/s over
# the files and readaheadd's first pass, second pass and pass after a
# restart with state, as ratios to the best static window. See
# docs/tuner.md (the prior climbs).
bench-blocks: labfs build
	READAHEADD_BENCH=blocks READAHEADD_BIN=$(CURDIR)/$(BIN)/readaheadd $(GOTEST) -count=1 -timeout 20m -v -run '^TestFreshBlockFiles$$' ./test/bench/

.PHONY: bench-openfiles
# The daemon beside many open files (root, about 2 minutes): a stream of a
# file slowed before its open, with the daemon, without and with 102,000
# idle descriptors that six other processes hold on the data disk; prints
# the daemon's CPU share over the 6 s after the open, its first action and
# the stream's MB/s beside the static windows' with the same files held.
# See docs/reliability.md.
bench-openfiles: labfs
	READAHEADD_BENCH=openfiles $(GOTEST) -count=1 -timeout 15m -v -run '^TestManyOpenFiles$$' ./test/bench/

.PHONY: bench-trialcost
# What trials cost other readers (root, about 45 minutes with the defaults):
# a healthy device at its bandwidth with one stream, and a device three
# streams fill, each with a random mmap reader beside; default and
# readaheadd in alternating segments of one run; prints the streams' total
# and the random reader's p99 per arm, and their ratios against the goals
# (docs/reliability.md). READAHEADD_TRIALCOST_MIN sets minutes per arm.
bench-trialcost: labfs
	READAHEADD_BENCH=trialcost $(GOTEST) -count=1 -timeout 90m -v -run '^TestTrialsCost$$' ./test/bench/

.PHONY: bench-iops
# What watching a fast device costs (root, fio, about 4 minutes): 4 KiB
# random and 1 MiB sequential direct reads on a loop device in tmpfs, fio
# running without a break while the arms (without anything, readaheadd, an
# empty program pair) take short turns; prints the ratios of IOPS with and
# without the daemon (mean, median, spread, confidence interval),
# BPF ns per request (kernel.bpf_stats_enabled, restored), the daemon's CPU
# share and RSS, and events lost. See docs/probe.md.
bench-iops: build
	READAHEADD_BENCH=1 READAHEADD_BIN=$(CURDIR)/$(BIN)/readaheadd $(GOTEST) -count=1 -timeout 60m -v -run '^TestIOPSCost$$' ./test/probecost/

.PHONY: fresh-debian
# demo.sh and test.sh on a bare Debian (root, debootstrap; 10-40 minutes):
# a minbase root with this machine's apt configuration, a clean clone of
# HEAD, each command in a chroot; prints each step's time and the packages
# it installed, and unmounts and removes the root even on failure. Steps and
# a part of the suite: FRESH_TESTFLAGS='-count=1 -run TestX' and
# FRESH_STEPS='nonroot demo test'. See docs/fresh-install.md.
FRESH_STEPS ?= nonroot demo test
fresh-debian:
	test/fresh/fresh-debian.sh $(FRESH_STEPS)

.PHONY: bench-matrix bench-matrix-short
# The scenario matrix (root; about 3.5 minutes a scenario): the named
# scenarios, then N drawn from SEED (device model x readers x start x file
# system x memory), each with the default window (twice), every static
# window from 128 to 4096 KB and readaheadd, 20 s an arm; prints a row and
# a verdict (met / not met) per scenario and the classes the set covers,
# writes docs/results/matrix/ (README.md, matrix.json) after every row,
# and exits non-zero on any `not met`. NAMED=0 leaves out the named ones;
# ONLY=name,... runs only those. RESUME=1 keeps the rows of the committed
# table (same SEED, N, NAMED) and runs only the scenarios it lacks, each
# row marked with the run (and source commit) that measured it; REDO=1,2
# with it runs the rows of those runs again (an older daemon's, or a busy
# host's).
SEED  ?= 1
N     ?= 10
NAMED ?= 1
ONLY  ?=
RESUME ?=
REDO   ?=
bench-matrix: labfs build
	READAHEADD_BIN=$(CURDIR)/$(BIN)/readaheadd $(GO) run ./test/bench/cmd/benchrun -matrix -seed $(SEED) -n $(N) \
		-named=$(if $(filter 0,$(NAMED)),false,true) $(if $(ONLY),-only $(ONLY)) $(if $(RESUME),-resume) $(if $(REDO),-redo $(REDO)) -out docs/results/matrix

# CI's short set (root, under 3 minutes): the whole device slow beside a
# bursty reader, and a saturated device; the default, 512 KB and
# readaheadd. Reports its verdicts without failing on `not met`; fails on
# harness errors.
bench-matrix-short: labfs build
	READAHEADD_BIN=$(CURDIR)/$(BIN)/readaheadd $(GOTEST) -count=1 -timeout 10m -v -run '^TestMatrixShort$$' ./test/bench/
