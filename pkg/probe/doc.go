// Package probe loads readaheadd's BPF programs (bpf/), which trace every
// block read request on the chosen devices, and streams them to the rest of
// the daemon as typed records, each attributed to the file it reads
// (device, inode), together with the kernel's readahead events, which say
// which process reads which file.
package probe
