// SPDX-License-Identifier: GPL-2.0
/*
 * readaheadd's block-read probe.
 *
 * block_rq_complete, the only program a block request runs: for a read on
 * a watched disk, per-disk per-CPU totals and latency histogram for every
 * request (latency from the request's own io_start_time_ns, set by the
 * kernel at issue when the queue keeps statistics); for a sampled request
 * only: depth (the kernel's own in-flight count of the request's block
 * device), attribution to a file through its first page
 * (bio->bi_io_vec[0].bv_page->mapping->host), per-file totals weighted by
 * the sampling rate, one struct rec in the ring.
 * page_cache_sync_ra / page_cache_async_ra: stream which process runs
 * readahead on which file, with the open file's window.
 *
 * Cost matters (this runs for every block read): above a per-disk rate set
 * by user space (sampling[]), only 1 in N of the requests the daemon does
 * not follow one by one (small ones, and any that is no readahead for a
 * file: direct I/O, metadata) is streamed, while counts, bytes and the latency
 * histogram stay exact;
 * pointers are followed with direct BTF loads, and ring-buffer submissions
 * do not wake the reader unless the ring is filling; user space polls.
 */
#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

#define REQ_OP_MASK 0xff
#define REQ_OP_READ 0
#define S_IFMT 00170000
#define S_IFBLK 0060000
#define PAGE_SHIFT 12
#define MINORBITS 20
#define MKDEV(ma, mi) (((u32)(ma) << MINORBITS) | (u32)(mi))

#define MAX_FILTER_DEVS 16
/* Latency histogram: bucket i counts latencies in [2^i, 2^(i+1)) microseconds,
 * bucket 0 also counts everything under 1 us, the last bucket everything above. */
#define HIST_BUCKETS 28

enum event_type {
	EVENT_READ = 1,
	EVENT_READAHEAD = 2,
};

enum kind {
	KIND_FILE = 0,
	KIND_ANON = 1,
	KIND_META = 2,
	KIND_UNKNOWN = 3,
	KIND_DIRECT = 4,
};

/* Indexes of the `lost` counters. */
enum lost_reason {
	LOST_RINGBUF = 0,     /* ring buffer full: record dropped (aggregates still counted) */
	LOST_INFLIGHT = 1,    /* unused (a former in-flight table) */
	LOST_DEVSTATS = 2,    /* per-disk map full: disk not aggregated */
	LOST_FILESTATS = 3,   /* per-file map insert failed */
	LOST_RA_RINGBUF = 4,  /* ring buffer full: readahead event dropped */
	LOST_STALE = 5,       /* unused (a former in-flight table) */
	LOST_MAX = 8,
};

/* One completed read request, as streamed through the ring buffer. */
struct rec {
	u8 type; /* EVENT_READ */
	u8 kind;
	u8 error;
	u8 samplable; /* 1: numbered among the samplable requests (streamed 1 in N) */
	u32 dev; /* whole disk */
	u64 sector;
	u32 bytes;
	u32 depth;
	u64 issue_ns;
	u64 latency_ns;
	u32 file_dev;
	u32 weight; /* requests this record stands for: the sampling period N */
	u64 ino;
	u64 offset;
};

struct ra_event {
	u8 type; /* EVENT_READAHEAD */
	u8 async;
	u8 around; /* 1: an mmap read-around on a watched trimmed file (page_cache_ra_order) */
	u8 _pad0;
	u32 tgid;
	u32 dev; /* whole disk of the file's filesystem, 0 if none */
	u32 file_dev;
	u64 ino;
	u64 index;
	u64 time_ns;
	u32 req_count;
	u32 size;
	u32 async_size;
	u32 ra_pages;
	char comm[16];
};

/*
 * One program per request, at completion: the request carries its own
 * timestamps (io_start_time_ns, set at issue when the queue collects
 * statistics; start_time_ns, at allocation under I/O accounting) and the
 * kernel counts its disk's requests in flight (per-CPU in_flight of the
 * request's block_device, kept by blk_account_io_start/done), so nothing
 * has to be remembered between issue and completion. Everything a request
 * writes is per CPU: no line is shared between the CPUs that complete
 * requests.
 */

/* Requests smaller than this are sampled whatever they read; larger ones
 * only when they are no readahead for a file (pkg/probe SampleBelow). */
#define SAMPLE_BELOW (32 << 10)

#define DEV_BITS 6
#define DEV_SLOTS (1 << DEV_BITS)
#define DEV_PROBES 8

/* Per disk: its identity (written by user space before attach with a device
 * list, claimed at first sight without). Read-only per request. */
struct dev_slot {
	u64 dev; /* whole disk; 0 = free slot (64 bits for cmpxchg) */
};

/* Per disk and per CPU: totals, added without atomics on CPU-local lines;
 * user space sums the CPUs. */
struct dev_stats {
	u64 requests;
	u64 bytes;
	u64 latency_ns;
	u64 errors;
	u64 hist[HIST_BUCKETS];
	u64 sampled;  /* requests streamed as records */
	u64 untimed;  /* requests without a latency (not in hist or latency_ns) */
	u64 alloc_timed; /* requests timed from start_time_ns (no io_start_time_ns) */
	u64 samplable; /* requests streamed 1 in N: under SAMPLE_BELOW, or not a file's */
	u64 pick;      /* which of the current block of N samplable requests is streamed */
};

struct file_key {
	u32 dev;
	u32 _pad;
	u64 ino;
};

struct file_stats {
	u64 requests;
	u64 bytes;
	u64 latency_ns;
	u64 depth_sum;
	u64 last_ns;
	u32 disk;
	u32 _pad;
};

/* Set by the loader before load: the disks to watch (empty = all). */
const volatile u32 filter_devs[MAX_FILTER_DEVS] = {};
const volatile u32 n_filter_devs = 0;
/* Force a reader wake-up once this many bytes wait in the ring. */
const volatile u64 wakeup_bytes = 1 << 20;
/* A stream's first readahead (a synchronous read from the file's head: a
 * file just opened and read) wakes the reader at once: the daemon pins a
 * prior on it from the event path, and the reader's poll would add up to
 * its interval (100 ms) to the fresh open's first window. At most one such
 * wake-up per HEAD_WAKE_GAP_NS, so that opens of many small files are not
 * a wake-up each; a later one waits for the next poll or wake-up. */
#define HEAD_WAKE_GAP_NS (5 * 1000 * 1000ULL)
u64 last_head_wake = 0;
/* Possible CPUs (set by the loader): the per-CPU in-flight counters summed. */
const volatile u32 nr_cpus = 1;
/* bio->bi_flags bit BIO_PAGE_PINNED (Linux 6.5+: the bio's pages are the
 * reader's own memory, pinned for direct I/O), as a mask; 0 where the
 * loader does not know it (the page walk then tells). Set by the loader. */
const volatile u16 bio_pinned_mask = 0;

#define MAX_CPUS 1024

/* Each CPU's per-CPU offset (the kernel's __per_cpu_offset[cpu], which is
 * no symbol BPF can read on kernels without KALLSYMS_ALL), learnt from the
 * block layer's per-CPU software queues: a request queue's queue_ctx is a
 * per-CPU pointer, and each hardware queue lists the per-CPU contexts it
 * serves (ctxs[], each with its cpu), at queue_ctx + offset of that CPU.
 * Offsets never change; cpu_known[c] says cpu_off[c] is set. */
u64 cpu_off[MAX_CPUS];
u8 cpu_known[MAX_CPUS];
u32 cpus_all_known;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DEV_SLOTS);
	__type(key, u32);
	__type(value, struct dev_slot);
} devslots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DEV_SLOTS);
	__type(key, u32);
	__type(value, struct dev_stats);
} devstats SEC(".maps");

/* Per disk slot, written by user space: sampling period minus one (a power
 * of two minus one). A CPU numbers the disk's samplable requests (its
 * dev_stats.samplable) in blocks of N and streams one of each block, at a
 * position drawn at random when the block starts (skip_sample). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DEV_SLOTS);
	__type(key, u32);
	__type(value, u32);
} sampling SEC(".maps");

/* Per-file totals since load, per CPU (no atomics); LRU keeps the active
 * files when more than max_entries files are read. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 16384); /* set by the loader (Config.FileEntries) */
	__type(key, struct file_key);
	__type(value, struct file_stats);
} filestats SEC(".maps");

struct file_cache_entry {
	struct file_key key;
	struct file_stats delta; /* not yet in filestats */
};

#define FILE_CACHE_WAYS 4

struct file_cache {
	struct file_cache_entry e[FILE_CACHE_WAYS];
	u32 next; /* round-robin victim */
	u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct file_cache);
} filecache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LOST_MAX);
	__type(key, u32);
	__type(value, u64);
} lost SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20); /* resized by the loader */
} events SEC(".maps");

/* Files under a read-around trim, written by user space: an mmap
 * read-around on one of them by an open file whose window is above the
 * trim (ra_pages) is a descriptor the trim has not reached (the reader
 * opened the file again since), and is reported at once. last_ns bounds
 * the reports to one per AROUND_GAP_NS per file: the faults of one
 * descriptor come faster than user space can trim it. */
struct around_val {
	u32 ra_pages;
	u32 _pad;
	u64 last_ns;
};

#define AROUND_GAP_NS (10 * 1000 * 1000ULL)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct file_key);
	__type(value, struct around_val);
} around SEC(".maps");

/* Types exported to Go by bpf2go. */
const struct rec *unused_rec __attribute__((unused));
const struct ra_event *unused_ra __attribute__((unused));

static __always_inline void count_lost(u32 reason)
{
	u64 *v = bpf_map_lookup_elem(&lost, &reason);
	if (v)
		(*v)++;
}

static __always_inline bool watched(u32 dev)
{
	u32 n = n_filter_devs;
	if (n == 0)
		return true;
	for (int i = 0; i < MAX_FILTER_DEVS; i++) {
		if (i >= n)
			break;
		if (filter_devs[i] == dev)
			return true;
	}
	return false;
}

static __always_inline u32 rq_disk_dev(struct request *rq)
{
	struct gendisk *disk;

	if (bpf_core_field_exists(rq->q->disk)) {
		disk = rq->q->disk;
	} else {
		struct request___old *old = (void *)rq;
		disk = BPF_CORE_READ(old, rq_disk);
	}
	if (!disk)
		return 0;
	return MKDEV(disk->major, disk->first_minor);
}

/* Multiplicative hash: the top bits of the product are the well-mixed ones. */
static __always_inline u32 hash_bits(u64 v, u32 bits)
{
	return (u32)((v * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

/* Finds or claims dev's slot in devslots (no device list only). */
static __always_inline int dev_slot_of(u32 dev)
{
	u32 h = hash_bits(dev, DEV_BITS);
	for (u32 i = 0; i < DEV_PROBES; i++) {
		u32 k = (h + i) & (DEV_SLOTS - 1);
		struct dev_slot *ds = bpf_map_lookup_elem(&devslots, &k);
		if (!ds)
			return -1;
		u64 cur = ds->dev;
		if (cur == 0) {
			cur = __sync_val_compare_and_swap(&ds->dev, 0, (u64)dev);
			if (cur == 0)
				cur = dev;
		}
		if (cur == dev)
			return k;
	}
	count_lost(LOST_DEVSTATS);
	return -1;
}

/*
 * The disk slot of a watched disk, or -1. With a device list the slot is
 * the disk's index in it (user space wrote its devslots entry before
 * attaching): a few compares against verifier-known constants, the
 * cheapest filter there is for the handful of disks a daemon watches.
 */
static __always_inline int disk_slot(u32 dev)
{
	u32 n = n_filter_devs;
	if (!n)
		return dev_slot_of(dev);
	for (int i = 0; i < MAX_FILTER_DEVS; i++) {
		if (i >= n)
			return -1;
		if (filter_devs[i] == dev)
			return i;
	}
	return -1;
}

/* Learns the per-CPU offsets of the CPUs rq's hardware queue serves. */
static __always_inline void learn_cpu_offsets(struct request *rq)
{
	struct request_queue *q = rq->q;
	struct blk_mq_hw_ctx *h = rq->mq_hctx;
	if (!q || !h)
		return;
	/* Read as plain numbers: the verifier forbids arithmetic on its pointers. */
	u64 base = 0, ctxs = 0;
	if (bpf_core_read(&base, sizeof(base), &q->queue_ctx) ||
	    bpf_core_read(&ctxs, sizeof(ctxs), &h->ctxs) || !base || !ctxs)
		return;
	/* A hardware queue serves at most every possible CPU. Bounding by
	 * nr_cpus (a constant at load) rather than only by nr_ctx (a value the
	 * verifier cannot know) keeps it from walking all MAX_CPUS iterations:
	 * that was 197k instructions and 0.2 s of every start. */
	u32 n = h->nr_ctx;
	for (u32 i = 0; i < MAX_CPUS; i++) {
		if (i >= n || i >= nr_cpus)
			break;
		u64 c = 0;
		if (bpf_probe_read_kernel(&c, sizeof(c), (const void *)(ctxs + i * sizeof(void *))) || !c)
			continue;
		u32 cpu = BPF_CORE_READ((struct blk_mq_ctx *)c, cpu);
		if (cpu >= MAX_CPUS || cpu_known[cpu])
			continue;
		cpu_off[cpu] = c - base;
		cpu_known[cpu] = 1;
	}
}

/*
 * Read requests of the request's block_device in flight now, this one
 * included (completion runs before blk_account_io_done): the kernel's own
 * per-CPU in_flight[READ] counters, summed over the CPUs whose offset is
 * known. Kept for request-based disks by recent kernels (6.18 here; older
 * ones counted them by walking tags and leave these at 0) while I/O
 * accounting is on (the request's part is set); 0 when unknown. Called for
 * sampled requests only.
 */
static __always_inline u32 kernel_inflight(struct request *rq)
{
	if (!bpf_core_field_exists(rq->part) || !bpf_core_field_exists(rq->mq_ctx))
		return 0;
	struct block_device *part = rq->part;
	if (!part || !bpf_core_field_exists(part->bd_stats))
		return 0;
	u64 stats = 0;
	if (bpf_core_read(&stats, sizeof(stats), &part->bd_stats) || !stats)
		return 0;
	stats += bpf_core_field_offset(struct disk_stats, in_flight);
	if (!cpus_all_known) {
		learn_cpu_offsets(rq);
		u32 k = 0;
		for (u32 c = 0; c < MAX_CPUS; c++) {
			if (c >= nr_cpus)
				break;
			k += cpu_known[c];
		}
		if (k >= nr_cpus)
			cpus_all_known = 1;
	}
	s64 sum = 0;
	for (u32 c = 0; c < MAX_CPUS; c++) {
		if (c >= nr_cpus)
			break;
		if (!cpu_known[c])
			continue;
		long v = 0;
		if (bpf_probe_read_kernel(&v, sizeof(v), (const void *)(stats + cpu_off[c])))
			continue;
		sum += v;
	}
	return sum > 0 ? (u32)sum : 0;
}

static __always_inline u32 log2_bucket(u64 v)
{
	u32 r = 0;
	if (v >= (1ULL << 16)) { v >>= 16; r += 16; }
	if (v >= (1ULL << 8)) { v >>= 8; r += 8; }
	if (v >= (1ULL << 4)) { v >>= 4; r += 4; }
	if (v >= (1ULL << 2)) { v >>= 2; r += 2; }
	if (v >= (1ULL << 1)) { r += 1; }
	return r;
}

/*
 * Reads a page's compound_head and mapping as plain words (the verifier types
 * both as pointers, but they carry tag bits): one bpf_probe_read_kernel when
 * they lie within 32 bytes of each other, as on every kernel since 4.x.
 */
static __always_inline int page_words(struct page *page, unsigned long *head, unsigned long *mapping)
{
	u32 oh = bpf_core_field_offset(page->compound_head);
	u32 om = bpf_core_field_offset(page->mapping);
	if (om > oh && om - oh <= 24 && ((om - oh) & 7) == 0) {
		unsigned long w[4] = {};
		if (bpf_probe_read_kernel(w, sizeof(w), (void *)page + oh))
			return -1;
		*head = w[0];
		*mapping = w[((om - oh) >> 3) & 3];
		return 0;
	}
	if (bpf_core_read(head, sizeof(*head), &page->compound_head))
		return -1;
	return bpf_core_read(mapping, sizeof(*mapping), &page->mapping);
}

/*
 * Fills kind/file_dev/ino/offset from the request's first page: the page at
 * the bio's current iterator position (a split bio shares its parent's
 * bi_io_vec), resolved to its folio's head page, whose mapping is the file's
 * address_space (or an anon_vma with bit 0 set).
 *
 * Fast path (the common case: first vector, head page): typed BTF loads,
 * which compile to plain loads, plus one probe read for the tagged words.
 * Otherwise the page address is computed, so every read goes through
 * bpf_probe_read_kernel (CO-RE).
 */
static __always_inline void attribute(struct request *rq, struct rec *r)
{
	r->kind = KIND_UNKNOWN;
	struct bio *bio = rq->bio;
	if (!bio)
		return;
	/* Direct I/O into the reader's memory: no page-cache page to name a
	 * file by, known from the bio alone. The page walk below reads lines
	 * the completing CPU has not seen (after a 1 MiB copy, none it had):
	 * 200-300 ns of such a read here. A bio the block layer split off
	 * another is a clone without the flag: its page is walked. */
	if (bio_pinned_mask && (bio->bi_flags & bio_pinned_mask)) {
		r->kind = KIND_DIRECT;
		return;
	}
	u32 idx = bio->bi_iter.bi_idx;
	u32 done = bio->bi_iter.bi_bvec_done;
	struct bio_vec *vec = bio->bi_io_vec;
	if (!vec)
		return;
	unsigned long head = 0, mapping = 0;

	if (idx == 0 && done == 0 && vec->bv_offset < (1 << PAGE_SHIFT)) {
		struct page *page = vec->bv_page;
		if (!page || page_words(page, &head, &mapping))
			return;
		if (!(head & 1)) {
			if (!mapping)
				return;
			if (mapping & 1) {
				r->kind = KIND_ANON;
				return;
			}
			struct inode *host = page->mapping->host;
			if (!host)
				return;
			if ((host->i_mode & S_IFMT) == S_IFBLK) {
				r->kind = KIND_META;
				return;
			}
			u64 index;
			if (bpf_core_field_exists(page->__folio_index)) {
				index = page->__folio_index;
			} else {
				struct page___old *op = (void *)page;
				index = BPF_CORE_READ(op, index);
			}
			r->kind = KIND_FILE;
			r->file_dev = host->i_sb->s_dev;
			r->ino = host->i_ino;
			r->offset = (index << PAGE_SHIFT) + vec->bv_offset;
			return;
		}
	}

	struct bio_vec bv = {};
	if (bpf_core_read(&bv, sizeof(bv), vec + idx))
		return;
	if (!bv.bv_page)
		return;
	u64 in = (u64)bv.bv_offset + done;
	u64 psize = bpf_core_type_size(struct page);
	struct page *page = (struct page *)((u64)bv.bv_page + (in >> PAGE_SHIFT) * psize);
	in &= (1 << PAGE_SHIFT) - 1;
	if (page_words(page, &head, &mapping))
		return;
	u64 sub = 0;
	if (head & 1) {
		/* A tail page of a large folio: mapping and index live in the head. */
		struct page *hp = (struct page *)(head - 1);
		sub = ((u64)page - (u64)hp) / psize;
		page = hp;
		if (bpf_core_read(&mapping, sizeof(mapping), &page->mapping))
			return;
	}
	if (!mapping)
		return;
	if (mapping & 1) {
		r->kind = KIND_ANON;
		return;
	}
	struct inode *host = BPF_CORE_READ((struct address_space *)mapping, host);
	if (!host)
		return;
	if ((BPF_CORE_READ(host, i_mode) & S_IFMT) == S_IFBLK) {
		r->kind = KIND_META;
		return;
	}
	u64 index;
	if (bpf_core_field_exists(page->__folio_index)) {
		index = BPF_CORE_READ(page, __folio_index);
	} else {
		struct page___old *op = (void *)page;
		index = BPF_CORE_READ(op, index);
	}
	r->kind = KIND_FILE;
	r->file_dev = BPF_CORE_READ(host, i_sb, s_dev);
	r->ino = BPF_CORE_READ(host, i_ino);
	r->offset = ((index + sub) << PAGE_SHIFT) + in;
}

/* Adds a cached per-CPU delta to the file's totals in filestats. */
static __always_inline void flush_file(struct file_cache_entry *fc)
{
	struct file_stats *fs = bpf_map_lookup_elem(&filestats, &fc->key);
	if (!fs) {
		struct file_stats init = { .disk = fc->delta.disk };
		bpf_map_update_elem(&filestats, &fc->key, &init, BPF_NOEXIST);
		fs = bpf_map_lookup_elem(&filestats, &fc->key);
		if (!fs) {
			count_lost(LOST_FILESTATS);
			return;
		}
	}
	fs->requests += fc->delta.requests;
	fs->bytes += fc->delta.bytes;
	fs->latency_ns += fc->delta.latency_ns;
	fs->depth_sum += fc->delta.depth_sum;
	fs->last_ns = fc->delta.last_ns;
}

/*
 * Per-file totals. A hash lookup per request was the largest single cost of
 * the completion program (~270 ns here: cold lines), so each CPU accumulates
 * the requests of the last FILE_CACHE_WAYS files it saw in filecache and
 * folds an entry into filestats when it is evicted for another file:
 * consecutive requests mostly belong to a few sequential readers (and a
 * loop device's file sits on a disk's file). User space adds the pending
 * deltas when it reads.
 */
/* REQ_RAHEAD as a mask of rq->cmd_flags (the bit moved between kernel
 * versions: relocated), 0 where the kernel does not name it. */
static __always_inline u32 rahead_mask(void)
{
	if (!bpf_core_enum_value_exists(enum req_flag_bits, __REQ_RAHEAD))
		return 0;
	return 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_RAHEAD);
}

/* Whether to skip this samplable request: one of every block of N = m + 1
 * consecutive ones (per CPU) is streamed, at a random position in the
 * block. A fixed position (the first of each block) would be biased by any
 * pattern with a period dividing N, such as a large direct read split into
 * a long and a short request: every record would be the long one. */
static __always_inline bool skip_sample(struct dev_stats *st, u32 m)
{
	u64 n = st->samplable++;
	if (!m)
		return false;
	if ((n & m) == 0)
		st->pick = bpf_get_prandom_u32() & m;
	return (n & m) != (st->pick & m);
}

static __always_inline void count_file(struct rec *r, u32 dev, u32 len, u64 lat, u32 depth, u64 now, u32 w)
{
	u32 zero = 0;
	struct file_cache *fc = bpf_map_lookup_elem(&filecache, &zero);
	if (!fc)
		return;
	struct file_cache_entry *e = 0;
	for (u32 i = 0; i < FILE_CACHE_WAYS; i++) {
		if (fc->e[i].key.ino == r->ino && fc->e[i].key.dev == r->file_dev) {
			e = &fc->e[i];
			break;
		}
	}
	if (!e) {
		u32 v = fc->next & (FILE_CACHE_WAYS - 1);
		fc->next = v + 1;
		e = &fc->e[v];
		if (e->delta.requests)
			flush_file(e);
		e->key.dev = r->file_dev;
		e->key._pad = 0;
		e->key.ino = r->ino;
		e->delta.requests = 0;
		e->delta.bytes = 0;
		e->delta.latency_ns = 0;
		e->delta.depth_sum = 0;
		e->delta.disk = dev;
	}
	/* Weighted by the sampling period: unbiased estimates of the file's
	 * totals (exact when every request is sampled). */
	e->delta.requests += w;
	e->delta.bytes += (u64)len * w;
	e->delta.latency_ns += lat * w;
	e->delta.depth_sum += (u64)depth * w;
	e->delta.last_ns = now;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	if ((rq->cmd_flags & REQ_OP_MASK) != REQ_OP_READ)
		return 0;
	unsigned int len = rq->__data_len;
	/* A partial completion: a driver completed the request's head and more
	 * calls follow for the rest (a loop device on a short read of its
	 * backing file updates the request by what it read and requeues it).
	 * Those bytes were read: they are a record of their own, from the
	 * request's head, where its sector and bio still point. The request is
	 * counted once, at its last call, and timed there. */
	bool last = nr_bytes >= len;
	if (!last) {
		if (!nr_bytes)
			return 0;
		len = nr_bytes;
	}
	u32 dev = rq_disk_dev(rq);
	if (!dev)
		return 0;
	int slot = disk_slot(dev);
	if (slot < 0)
		return 0;
	u32 dslot = slot;
	struct dev_stats *st = bpf_map_lookup_elem(&devstats, &dslot);
	if (!st)
		return 0;
	u64 now = bpf_ktime_get_ns();
	/* The kernel's stamps: io_start_time_ns is the issue time when the queue
	 * collects statistics; else start_time_ns (allocation, so it includes
	 * time queued before issue) when it keeps I/O accounting. */
	u64 issue = 0;
	if (bpf_core_field_exists(rq->io_start_time_ns))
		issue = rq->io_start_time_ns;
	if (!issue && bpf_core_field_exists(rq->start_time_ns)) {
		issue = rq->start_time_ns;
		if (issue)
			st->alloc_timed++;
	}
	st->bytes += len;
	if (last) {
		st->requests++;
		if (error)
			st->errors++;
	}
	u64 lat = 0;
	if (issue && issue <= now) {
		lat = now - issue;
		if (last) {
			st->latency_ns += lat;
			u32 b = log2_bucket(lat / 1000);
			if (b >= HIST_BUCKETS)
				b = HIST_BUCKETS - 1;
			st->hist[b]++;
		}
	} else {
		if (last)
			st->untimed++;
		issue = now;
	}
	u32 m = 0;
	u32 *mask = bpf_map_lookup_elem(&sampling, &dslot);
	if (mask)
		m = *mask;
	/*
	 * Which requests are streamed (1 in N = m + 1 of the samplable ones,
	 * numbered per CPU, independently of what they read):
	 * - under SAMPLE_BELOW, or SAMPLE_BELOW or more and no readahead
	 *   (REQ_RAHEAD clear: direct I/O, a folio read on its own, most
	 *   metadata): decided before attribution, so an unsampled one costs
	 *   no pointer walk (for the split-off part of a direct read, which
	 *   has no pinned flag, a walk of lines this CPU has not seen:
	 *   200-300 ns);
	 * - SAMPLE_BELOW or more, readahead, and read for a file (the streams
	 *   the detector follows request by request): always;
	 * - SAMPLE_BELOW or more, readahead, not a file's (a block device's
	 *   own readahead), or any large request where the kernel does not
	 *   name REQ_RAHEAD: decided after attribution.
	 */
	u32 ra = rahead_mask();
	bool early = len < SAMPLE_BELOW || (ra && !(rq->cmd_flags & ra));
	u32 w = 1;
	if (early) {
		if (skip_sample(st, m))
			return 0;
		w = m + 1;
	}

	/* Built on the stack and copied with bpf_ringbuf_output: the per-file
	 * counters need the attribution even when the ring is full. */
	struct rec rr, *r = &rr;
	r->type = EVENT_READ;
	r->error = error != 0;
	r->samplable = early;
	r->dev = dev;
	r->sector = rq->__sector;
	r->bytes = len;
	r->depth = 0;
	r->issue_ns = issue;
	r->latency_ns = lat;
	r->file_dev = 0;
	r->weight = 1;
	r->ino = 0;
	r->offset = 0;
	attribute(rq, r);
	if (!early && r->kind != KIND_FILE) {
		if (skip_sample(st, m))
			return 0;
		w = m + 1;
		r->samplable = 1;
	}
	st->sampled++;
	u32 depth = kernel_inflight(rq);
	r->depth = depth;
	r->weight = w;

	if (r->kind == KIND_FILE)
		count_file(r, dev, len, lat, depth, now, w);

	u64 flags = BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&events, r, sizeof(*r), flags))
		count_lost(LOST_RINGBUF);
	return 0;
}

/* The whole disk holding a filesystem, 0 if it has no block device. */
static __always_inline u32 sb_disk(struct super_block *sb)
{
	struct block_device *bdev = sb->s_bdev;
	if (!bdev)
		return 0;
	struct gendisk *disk = bdev->bd_disk;
	return disk ? MKDEV(disk->major, disk->first_minor) : 0;
}

static __always_inline int readahead(struct inode *inode, unsigned long index,
				     struct file_ra_state *ra, unsigned long req_count, u8 async)
{
	if (!inode)
		return 0;
	struct super_block *sb = inode->i_sb;
	u32 dev = sb_disk(sb);
	if (n_filter_devs && !watched(dev))
		return 0;

	struct ra_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost(LOST_RA_RINGBUF);
		return 0;
	}
	e->type = EVENT_READAHEAD;
	e->async = async;
	e->around = 0;
	e->_pad0 = 0;
	e->tgid = bpf_get_current_pid_tgid() >> 32;
	e->dev = dev;
	e->file_dev = sb->s_dev;
	e->ino = inode->i_ino;
	e->index = index;
	e->time_ns = bpf_ktime_get_ns();
	e->req_count = req_count;
	if (ra) {
		e->size = ra->size;
		e->async_size = ra->async_size;
		e->ra_pages = ra->ra_pages;
	} else {
		e->size = 0;
		e->async_size = 0;
		e->ra_pages = 0;
	}
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	u64 flags = BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	if (!async && index == 0 && e->time_ns - last_head_wake >= HEAD_WAKE_GAP_NS) {
		/* Racy across CPUs by design: two wake-ups instead of one. */
		last_head_wake = e->time_ns;
		flags = BPF_RB_FORCE_WAKEUP;
	}
	bpf_ringbuf_submit(e, flags);
	return 0;
}

SEC("tp_btf/page_cache_sync_ra")
int BPF_PROG(page_cache_sync_ra, struct inode *inode, unsigned long index,
	     struct file_ra_state *ra, unsigned long req_count)
{
	return readahead(inode, index, ra, req_count, 0);
}

SEC("tp_btf/page_cache_async_ra")
int BPF_PROG(page_cache_async_ra, struct inode *inode, unsigned long index,
	     struct file_ra_state *ra, unsigned long req_count)
{
	return readahead(inode, index, ra, req_count, 1);
}

/*
 * mmap read-around (do_sync_mmap_readahead: a fault reads the window around
 * the faulting page) runs page_cache_ra_order without the sync/async
 * tracepoints above. Buffered readahead runs it too, after those. Only
 * files in `around` are looked at, and only a window above their trim is
 * reported: the first instructions are one hash lookup.
 */
SEC("tp_btf/page_cache_ra_order")
int BPF_PROG(page_cache_ra_order, struct inode *inode, unsigned long index,
	     struct file_ra_state *ra)
{
	if (!inode || !ra)
		return 0;
	struct super_block *sb = inode->i_sb;
	struct file_key k = {};
	k.dev = sb->s_dev;
	k.ino = inode->i_ino;
	struct around_val *v = bpf_map_lookup_elem(&around, &k);
	if (!v || ra->ra_pages <= v->ra_pages)
		return 0;
	u64 now = bpf_ktime_get_ns();
	if (now - v->last_ns < AROUND_GAP_NS)
		return 0;
	v->last_ns = now; /* racy across CPUs: at worst two reports */

	struct ra_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost(LOST_RA_RINGBUF);
		return 0;
	}
	e->type = EVENT_READAHEAD;
	e->async = 0;
	e->around = 1;
	e->_pad0 = 0;
	e->tgid = bpf_get_current_pid_tgid() >> 32;
	e->dev = sb_disk(sb);
	e->file_dev = k.dev;
	e->ino = k.ino;
	e->index = index;
	e->time_ns = now;
	e->req_count = 0;
	e->size = ra->size;
	e->async_size = ra->async_size;
	e->ra_pages = ra->ra_pages;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	/* The trim is due now: the reader faults again within milliseconds. */
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}
