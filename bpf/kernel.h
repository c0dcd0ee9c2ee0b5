/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The few kernel types the probe reads, declared by hand instead of a full
 * bpftool-generated vmlinux.h: small, reviewable, and identical on every
 * build machine (so `make generate` is reproducible). Every struct carries
 * preserve_access_index, so libbpf/cilium-ebpf relocate each field access
 * against the running kernel's BTF (CO-RE); only the fields named here must
 * exist, at whatever offset. Flavours (___old) cover renamed fields.
 */
#ifndef READAHEADD_KERNEL_H
#define READAHEADD_KERNEL_H

#include "types.h"
#define true 1
#define false 0

/* Map types and flags from uapi/linux/bpf.h that the program uses. */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_LRU_PERCPU_HASH = 10,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_RB_NO_WAKEUP = 1,
	BPF_RB_FORCE_WAKEUP = 2,
};

enum {
	BPF_RB_AVAIL_DATA = 0,
	BPF_RB_RING_SIZE = 1,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct gendisk {
	int major;
	int first_minor;
};

struct blk_mq_ctx {
	unsigned int cpu;
};

struct request_queue {
	struct gendisk *disk;
	struct blk_mq_ctx *queue_ctx; /* per CPU */
};

struct page;

struct bio_vec {
	struct page *bv_page;
	unsigned int bv_len;
	unsigned int bv_offset;
};

struct bvec_iter {
	unsigned int bi_idx;
	unsigned int bi_bvec_done;
};

struct bio {
	unsigned short bi_flags;
	struct bvec_iter bi_iter;
	struct bio_vec *bi_io_vec;
};

struct blk_mq_hw_ctx {
	unsigned short nr_ctx;
	struct blk_mq_ctx **ctxs;
};

struct block_device;

/* Request flag bits (include/linux/blk_types.h); the value is relocated
 * from the kernel's BTF, since bits were added between versions. */
enum req_flag_bits {
	__REQ_RAHEAD = 19,
};

struct request {
	struct request_queue *q;
	struct blk_mq_ctx *mq_ctx;
	struct blk_mq_hw_ctx *mq_hctx;
	unsigned int cmd_flags;
	unsigned int __data_len;
	unsigned long long __sector;
	struct bio *bio;
	struct block_device *part;
	unsigned long long start_time_ns;
	unsigned long long io_start_time_ns;
};

/* Kernels before 5.17 kept the disk in the request. */
struct request___old {
	struct gendisk *rq_disk;
};

/* local_t: one atomic long. */
typedef struct {
	long a;
} local_t;

/* Per-CPU I/O statistics of a block_device; in_flight[0] counts reads. */
struct disk_stats {
	local_t in_flight[2];
};

struct block_device {
	unsigned int bd_dev;
	struct gendisk *bd_disk;
	struct disk_stats *bd_stats;
};

struct super_block {
	unsigned int s_dev;
	struct block_device *s_bdev;
};

struct inode {
	unsigned short i_mode;
	struct super_block *i_sb;
	unsigned long i_ino;
};

struct address_space {
	struct inode *host;
};

/* 6.16+ renamed page->index to __folio_index. */
struct page {
	unsigned long compound_head;
	struct address_space *mapping;
	unsigned long __folio_index;
};

struct page___old {
	unsigned long index;
};

struct file_ra_state {
	unsigned int size;
	unsigned int async_size;
	unsigned int ra_pages;
};

#pragma clang attribute pop

#endif
