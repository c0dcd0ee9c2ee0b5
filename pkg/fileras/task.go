package fileras

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// iterLinkInfo is union bpf_iter_link_info as its task member (tid, pid,
// pid_fd), padded to the union's 16 bytes.
type iterLinkInfo struct {
	Tid, Pid, PidFD, _ uint32
}

// linkCreateIter is union bpf_attr's link_create as an iterator uses it.
type linkCreateIter struct {
	ProgFD, TargetFD, AttachType, Flags uint32
	IterInfo                            uint64
	IterInfoLen                         uint32
	_                                   uint32
}

// attachTaskIter attaches prog as an iterator over one task only (the
// thread tid, which for a process's group leader is its pid): the kernel
// then visits that task's files, not every task's. Linux 6.1 added the
// task member of bpf_iter_link_info; older kernels refuse it (EINVAL).
// cilium/ebpf's link.AttachIter takes a map only, hence the raw
// BPF_LINK_CREATE.
func attachTaskIter(prog *ebpf.Program, tid uint32) (*link.Iter, error) {
	info := iterLinkInfo{Tid: tid}
	attr := linkCreateIter{
		ProgFD:      uint32(prog.FD()),
		AttachType:  uint32(unix.BPF_TRACE_ITER),
		IterInfo:    uint64(uintptr(unsafe.Pointer(&info))),
		IterInfoLen: uint32(unsafe.Sizeof(info)),
	}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, uintptr(unix.BPF_LINK_CREATE), uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(&info)
	if errno != 0 {
		return nil, fmt.Errorf("attach the readahead iterator to task %d: %w (task-bound iterators need Linux 6.1 or later)", tid, errno)
	}
	l, err := link.NewFromFD(int(fd))
	if err != nil {
		unix.Close(int(fd))
		return nil, fmt.Errorf("wrap the readahead iterator link of task %d: %w", tid, err)
	}
	it, ok := l.(*link.Iter)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("link of task %d is a %T, not an iterator", tid, l)
	}
	return it, nil
}
