package fileras

// The BPF object is compiled from bpf/fileras.bpf.c and committed (its Go
// bindings too), so building needs no clang; `make generate` regenerates it.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -type ra_file -type fileras_filter -type opened fileras ../../bpf/fileras.bpf.c -- -O2 -g -Wall -Werror -I../../bpf
