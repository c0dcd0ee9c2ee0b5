package probe

// The BPF object is compiled from bpf/ and committed (probe_bpfel.o and its
// Go bindings), so building needs no clang. `make generate` regenerates it;
// BPF2GO_CC picks the compiler (default clang). -mcpu=v3 for the
// compare-and-swap that claims a disk slot (Linux >= 5.12).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -type rec -type ra_event -type dev_stats -type dev_slot -type file_key -type file_stats -type file_cache -type file_cache_entry -type around_val probe ../../bpf/probe.bpf.c -- -mcpu=v3 -O2 -g -Wall -Werror -I../../bpf
