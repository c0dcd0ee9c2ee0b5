// Package reliability holds the tests that show readaheadd is safe to run on
// every storage node: bad input changes nothing, faults while running are
// logged, counted and survived, a SIGKILL at any point is undone by
// `readaheadd restore`, a long run stays bounded, and the daemon cannot be
// used to reach beyond what it is configured for. See docs/security.md.
//
// The tests build the real binary and run it as an operator would. Tests
// that need root (BPF, loop devices, the lab) skip otherwise. The soak test
// runs for about a minute by default and for ten with READAHEADD_BENCH=full.
package reliability
