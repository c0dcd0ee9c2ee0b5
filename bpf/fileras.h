/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The kernel types the open-file readahead iterator reads, declared by hand
 * (see kernel.h for why): every struct carries preserve_access_index, so
 * each field access is relocated against the running kernel's BTF.
 */
#ifndef READAHEADD_FILERAS_H
#define READAHEADD_FILERAS_H

#include "types.h"

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_LRU_HASH = 9,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct super_block {
	unsigned int s_dev;
};

struct inode {
	unsigned short i_mode;
	struct super_block *i_sb;
	unsigned long i_ino;
};

struct file_ra_state {
	unsigned long start;
	unsigned int size;
	unsigned int async_size;
	unsigned int ra_pages;
	long long prev_pos;
};

struct file {
	unsigned int f_mode;
	struct inode *f_inode;
	struct file_ra_state f_ra;
};

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
};

struct files_struct {
	struct fdtable *fdt;
};

struct task_struct {
	int pid;
	int tgid;
	struct files_struct *files;
};

/* The system call's number, by architecture (CO-RE picks the one that exists). */
struct pt_regs___x86 {
	unsigned long orig_ax;
};

struct pt_regs___arm64 {
	int syscallno;
};

struct pt_regs;

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
	u64 session_id;
	u64 seq_num;
};

struct bpf_iter__task_file {
	union {
		struct bpf_iter_meta *meta;
	};
	union {
		struct task_struct *task;
	};
	u32 fd;
	union {
		struct file *file;
	};
};

#pragma clang attribute pop

#endif
