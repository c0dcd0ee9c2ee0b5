// SPDX-License-Identifier: GPL-2.0
/*
 * The kernel's own per-file readahead state: a task_file iterator that
 * writes, for every regular file open on a watched device, who holds it
 * (tgid, fd), which file it is (s_dev, inode), its mode and its struct
 * file_ra_state (ra_pages, start, size, async_size, prev_pos). User space
 * reads it with read(2) on an iterator descriptor; nothing runs between
 * reads.
 *
 * filter[0] (struct fileras_filter) narrows the walk: one process only
 * (tgid, 0 for every process), one file (dev, ino; ino 0 for any), and
 * watched devices only (the watch map) unless all_devs is set. The filter only chooses what is written: the
 * kernel still visits every file of every task the link covers, so a walk
 * of one process goes through a link bound to that task (user space), and
 * visited[0] counts the files visited, to keep that cost in sight.
 *
 * note_open (on sys_exit, attached only for the instant a device holds a
 * temporary read_ahead_kb, as it runs at every system call's exit) notes
 * the regular files opened on an armed device by open(2), openat(2),
 * openat2(2) and creat(2), with their descriptor and the window they got:
 * what the daemon must repair, found without walking every process's files.
 */
#include "fileras.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

#define S_IFMT 00170000
#define S_IFREG 0100000

struct fileras_filter {
	u32 tgid;
	u32 all_devs;
	u64 ino; /* with dev: that file only; 0: any */
	u32 dev;
	u32 pad;
};

struct ra_file {
	u64 file; /* identity of the open file description while it lives */
	u64 ino;
	u64 start;
	s64 prev_pos;
	u32 tgid;
	u32 fd;
	u32 dev;
	u32 mode;
	u32 ra_pages;
	u32 size;
	u32 async_size;
	u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct fileras_filter);
} filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, u8);
} watch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} visited SEC(".maps");

struct opened {
	u64 ino;
	u32 tgid;
	u32 fd;
	u32 dev;
	u32 ra_pages;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, u8);
} arm SEC(".maps");

/* Keyed by the open file's identity (struct ra_file's file). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);
	__type(value, struct opened);
} opens SEC(".maps");

const struct opened *unused_opened __attribute__((unused));

/* Keeps struct ra_file in the BTF for bpf2go's -type. */
const struct ra_file *unused_ra_file __attribute__((unused));

SEC("iter/task_file")
int dump_ra(struct bpf_iter__task_file *ctx)
{
	struct task_struct *task = ctx->task;
	struct file *file = ctx->file;
	struct inode *inode;
	struct ra_file rec = {};
	u32 zero = 0;
	struct fileras_filter *flt;
	u64 *n;

	if (!task || !file)
		return 0;
	n = bpf_map_lookup_elem(&visited, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
	flt = bpf_map_lookup_elem(&filter, &zero);
	if (!flt)
		return 0;
	/* Threads share the descriptor table: the group leader lists it. */
	if (task->pid != task->tgid)
		return 0;
	if (flt->tgid && (u32)task->tgid != flt->tgid)
		return 0;
	inode = file->f_inode;
	if (!inode || (inode->i_mode & S_IFMT) != S_IFREG)
		return 0;
	rec.dev = inode->i_sb->s_dev;
	if (flt->ino && (flt->ino != inode->i_ino || flt->dev != rec.dev))
		return 0;
	if (!flt->all_devs && !bpf_map_lookup_elem(&watch, &rec.dev))
		return 0;
	rec.file = (u64)file;
	rec.ino = inode->i_ino;
	rec.tgid = task->tgid;
	rec.fd = ctx->fd;
	rec.mode = file->f_mode;
	/*
	 * f_ra shares a union with f_task_work (6.12+): the verifier's typed
	 * walk resolves the offset to the callback head, so copy the fields.
	 */
	rec.ra_pages = BPF_CORE_READ(file, f_ra.ra_pages);
	rec.start = BPF_CORE_READ(file, f_ra.start);
	rec.size = BPF_CORE_READ(file, f_ra.size);
	rec.async_size = BPF_CORE_READ(file, f_ra.async_size);
	rec.prev_pos = BPF_CORE_READ(file, f_ra.prev_pos);
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}

static __always_inline int is_open(struct pt_regs *regs)
{
	struct pt_regs___x86 *x86 = (void *)regs;
	struct pt_regs___arm64 *arm64 = (void *)regs;
	long nr;

	if (bpf_core_field_exists(x86->orig_ax)) {
		nr = BPF_CORE_READ(x86, orig_ax);
		return nr == 2 || nr == 85 || nr == 257 || nr == 437;
	}
	if (bpf_core_field_exists(arm64->syscallno)) {
		nr = BPF_CORE_READ(arm64, syscallno);
		return nr == 56 || nr == 437;
	}
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(note_open, struct pt_regs *regs, long ret)
{
	struct task_struct *task;
	struct fdtable *fdt;
	struct file **fds, *file = 0;
	struct inode *inode;
	struct opened o = {};
	u64 key;

	if (ret < 0 || !is_open(regs))
		return 0;
	task = (struct task_struct *)bpf_get_current_task_btf();
	fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || ret >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&file, sizeof(file), &fds[ret]) || !file)
		return 0;
	inode = BPF_CORE_READ(file, f_inode);
	if (!inode)
		return 0;
	o.dev = BPF_CORE_READ(inode, i_sb, s_dev);
	if (!bpf_map_lookup_elem(&arm, &o.dev))
		return 0;
	if ((BPF_CORE_READ(inode, i_mode) & S_IFMT) != S_IFREG)
		return 0;
	o.ino = BPF_CORE_READ(inode, i_ino);
	o.tgid = BPF_CORE_READ(task, tgid);
	o.fd = ret;
	o.ra_pages = BPF_CORE_READ(file, f_ra.ra_pages);
	key = (u64)file;
	bpf_map_update_elem(&opens, &key, &o, 0 /* BPF_ANY */);
	return 0;
}
