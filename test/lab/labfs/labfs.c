// labfs: a FUSE file system that serves one RAM-backed image file behaving
// like an SSD whose latency regimes can be switched at run time.
//
// A loop device with direct I/O on the image turns it into a block device
// with controllable per-request latency (see test/lab and docs/lab.md).
//
// Device model, per read request:
//   1. wait for one of SLOTS internal parallel units (the drive's dies);
//   2. wait the base latency plus any extra a regime adds (in parallel
//      with the other slots);
//   3. move size/bandwidth through ONE shared transfer channel (serialised,
//      modelled as a virtual-time queue so sleep overshoot never piles up).
// Writes are served at memory speed so test setup is quick.
//
// Regimes (control socket, one text command per line, one reply per line):
//   model LAT_US BW_MBPS SLOTS
//   permanent EXTRA_US OFF:LEN [OFF:LEN ...] [# label]
//   temporal PERIOD_MS DURATION_MS FRACTION EXTRA_US [# label]
//   intrinsic N EXTRA_US OFF:LEN [OFF:LEN ...] [# label]   (one file's extents)
//   device EXTRA_US [# label]  (every read of the whole device waits EXTRA_US
//                               more: a fail-slow drive; adds to the others)
//   mark NAME [# label]        (records an event, e.g. contention-start)
//   clear [all|permanent|temporal|intrinsic] [# label]
//   stats                      (JSON counters)
//   flush                      (flushes the request log)
// Every state change is written to the ground-truth file as a JSON line with
// CLOCK_MONOTONIC and wall-clock nanoseconds.
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define IMAGE_INO 2
#define IMAGE_NAME "image"
#define MAX_RANGES 65536
#define MAX_IFILES 64
#define MAX_SLOTS 1024

struct range {
	uint64_t off, len, extra_ns;
};

struct ifile { // one file registered for the intrinsic regime
	uint64_t *starts, *lens;
	int n;
	uint64_t extra_ns;
	int first_n;
	int cur;       // extent the last read fell in, -1 for none
	int remaining; // slowed requests left in the current extent
};

static struct {
	uint64_t size;
	char *img;

	pthread_mutex_t mu; // model, regimes, channel, counters
	uint64_t lat_ns;
	double bw_bytes_per_ns;
	int slots;
	sem_t slot_sem;
	int sem_slots; // slots the semaphore was created with
	uint64_t chan_free_ns;

	struct range *perm;
	int nperm;

	uint64_t dev_extra_ns; // whole-device slowdown

	int temporal_on;
	uint64_t t_start_ns, t_period_ns, t_dur_ns, t_extra_ns;
	double t_frac;

	struct ifile ifiles[MAX_IFILES];
	int nifiles;

	uint64_t reads, read_bytes, writes, write_bytes;
	uint64_t hits_perm, hits_temporal, hits_intrinsic, hits_device;
	int inflight, max_inflight;
	uint64_t rng;

	pthread_mutex_t logmu;
	FILE *truth;
	FILE *reqlog;
	char *ctl_path;
} g;

static uint64_t now_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t deadline)
{
	struct timespec ts = {.tv_sec = deadline / 1000000000ull, .tv_nsec = deadline % 1000000000ull};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

// xorshift64*: cheap, good enough to pick the slowed fraction of requests.
static double rnd01(void)
{
	g.rng ^= g.rng >> 12;
	g.rng ^= g.rng << 25;
	g.rng ^= g.rng >> 27;
	return (double)((g.rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static void json_escape(char *dst, size_t n, const char *src)
{
	size_t j = 0;
	for (; src && *src && j + 7 < n; src++) {
		unsigned char c = (unsigned char)*src;
		if (c == '"' || c == '\\') {
			dst[j++] = '\\';
			dst[j++] = (char)c;
		} else if (c < 0x20) {
			j += (size_t)snprintf(dst + j, n - j, "\\u%04x", c);
		} else {
			dst[j++] = (char)c;
		}
	}
	dst[j] = 0;
}

// truth writes one ground-truth event; body is extra JSON members.
static void truth(const char *event, const char *label, const char *fmt, ...)
{
	char body[8192] = "", lab[1024] = "";
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(body, sizeof body, fmt, ap);
		va_end(ap);
	}
	json_escape(lab, sizeof lab, label);
	pthread_mutex_lock(&g.logmu);
	if (g.truth) {
		fprintf(g.truth, "{\"mono_ns\":%" PRIu64 ",\"wall_ns\":%" PRIu64 ",\"event\":\"%s\",\"label\":\"%s\"%s%s}\n",
			now_ns(CLOCK_MONOTONIC), now_ns(CLOCK_REALTIME), event, lab, body[0] ? "," : "", body);
		fflush(g.truth);
	}
	pthread_mutex_unlock(&g.logmu);
}

// extra_for decides, under g.mu, how much latency the regimes add to a read
// of [off, off+len), and why ('p', 't', 'i' flags).
static uint64_t extra_for(uint64_t off, uint64_t len, uint64_t now, char *why)
{
	uint64_t extra = 0;
	int w = 0;
	for (int i = 0; i < g.nperm; i++) {
		struct range *r = &g.perm[i];
		if (off < r->off + r->len && r->off < off + len) {
			if (r->extra_ns > extra)
				extra = r->extra_ns;
		}
	}
	if (extra) {
		why[w++] = 'p';
		g.hits_perm++;
	}
	if (g.dev_extra_ns) {
		extra += g.dev_extra_ns;
		why[w++] = 'd';
		g.hits_device++;
	}
	if (g.temporal_on && now >= g.t_start_ns && (now - g.t_start_ns) % g.t_period_ns < g.t_dur_ns && rnd01() < g.t_frac) {
		extra += g.t_extra_ns;
		why[w++] = 't';
		g.hits_temporal++;
	}
	for (int f = 0; f < g.nifiles; f++) {
		struct ifile *fl = &g.ifiles[f];
		for (int e = 0; e < fl->n; e++) {
			if (off < fl->starts[e] || off >= fl->starts[e] + fl->lens[e])
				continue;
			if (e != fl->cur) { // a read crossed into another extent
				fl->cur = e;
				fl->remaining = fl->first_n;
			}
			if (fl->remaining > 0) {
				fl->remaining--;
				extra += fl->extra_ns;
				why[w++] = 'i';
				g.hits_intrinsic++;
			}
			goto done;
		}
	}
done:
	why[w] = 0;
	return extra;
}

static int image_attr(struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_ino = IMAGE_INO;
	st->st_mode = S_IFREG | 0600;
	st->st_nlink = 1;
	st->st_size = (off_t)g.size;
	st->st_blksize = 4096;
	st->st_blocks = (blkcnt_t)(g.size / 512);
	return 0;
}

static void root_attr(struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_ino = FUSE_ROOT_ID;
	st->st_mode = S_IFDIR | 0700;
	st->st_nlink = 2;
}

static void op_init(void *ud, struct fuse_conn_info *conn)
{
	(void)ud;
	conn->max_write = 1 << 20;
	conn->max_read = 1 << 20;
	conn->max_readahead = 1 << 20;
	if (conn->capable & FUSE_CAP_ASYNC_DIO)
		conn->want |= FUSE_CAP_ASYNC_DIO;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	if (parent != FUSE_ROOT_ID || strcmp(name, IMAGE_NAME) != 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	memset(&e, 0, sizeof e);
	e.ino = IMAGE_INO;
	e.attr_timeout = 3600;
	e.entry_timeout = 3600;
	image_attr(&e.attr);
	fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	struct stat st;
	if (ino == FUSE_ROOT_ID)
		root_attr(&st);
	else if (ino == IMAGE_INO)
		image_attr(&st);
	else {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fuse_reply_attr(req, &st, 3600);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi)
{
	(void)attr;
	(void)fi;
	if (ino != IMAGE_INO) {
		fuse_reply_err(req, EPERM);
		return;
	}
	if ((to_set & FUSE_SET_ATTR_SIZE) && (uint64_t)attr->st_size != g.size) {
		fuse_reply_err(req, EPERM); // the image has a fixed size
		return;
	}
	struct stat st;
	image_attr(&st);
	fuse_reply_attr(req, &st, 3600);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	char buf[512];
	size_t n = 0;
	struct stat st;
	const char *names[] = {".", "..", IMAGE_NAME};
	fuse_ino_t inos[] = {FUSE_ROOT_ID, FUSE_ROOT_ID, IMAGE_INO};
	for (off_t i = off; i < 3; i++) {
		memset(&st, 0, sizeof st);
		st.st_ino = inos[i];
		st.st_mode = i < 2 ? S_IFDIR : S_IFREG;
		size_t need = fuse_add_direntry(req, buf + n, sizeof buf - n, names[i], &st, i + 1);
		if (n + need > size || n + need > sizeof buf)
			break;
		n += need;
	}
	fuse_reply_buf(req, buf, n);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino != IMAGE_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	fi->keep_cache = 0;
	fuse_reply_open(req, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	if ((uint64_t)off >= g.size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if ((uint64_t)off + size > g.size)
		size = (size_t)(g.size - (uint64_t)off);

	uint64_t t0 = now_ns(CLOCK_MONOTONIC);
	sem_wait(&g.slot_sem);
	uint64_t t1 = now_ns(CLOCK_MONOTONIC);
	char why[8];
	pthread_mutex_lock(&g.mu);
	uint64_t extra = extra_for((uint64_t)off, size, t1, why);
	uint64_t lat = g.lat_ns + extra;
	double bw = g.bw_bytes_per_ns;
	g.inflight++;
	if (g.inflight > g.max_inflight)
		g.max_inflight = g.inflight;
	pthread_mutex_unlock(&g.mu);

	sleep_until(t1 + lat);
	sem_post(&g.slot_sem);

	// The shared transfer channel: book the next free interval, then sleep
	// to its end. Booking in virtual time keeps the channel exact even
	// when a thread wakes late.
	uint64_t xfer = bw > 0 ? (uint64_t)((double)size / bw) : 0;
	pthread_mutex_lock(&g.mu);
	uint64_t now = now_ns(CLOCK_MONOTONIC);
	uint64_t start = g.chan_free_ns > now ? g.chan_free_ns : now;
	uint64_t end = start + xfer;
	g.chan_free_ns = end;
	pthread_mutex_unlock(&g.mu);
	sleep_until(end);

	fuse_reply_buf(req, g.img + off, size);
	uint64_t t2 = now_ns(CLOCK_MONOTONIC);

	pthread_mutex_lock(&g.mu);
	g.inflight--;
	g.reads++;
	g.read_bytes += size;
	pthread_mutex_unlock(&g.mu);

	if (g.reqlog) {
		pthread_mutex_lock(&g.logmu);
		fprintf(g.reqlog, "{\"t\":%" PRIu64 ",\"off\":%" PRIu64 ",\"len\":%zu,\"lat_ns\":%" PRIu64 ",\"extra_ns\":%" PRIu64 ",\"why\":\"%s\"}\n",
			t0, (uint64_t)off, size, t2 - t0, extra, why);
		pthread_mutex_unlock(&g.logmu);
	}
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	if ((uint64_t)off >= g.size) {
		fuse_reply_err(req, ENOSPC);
		return;
	}
	if ((uint64_t)off + size > g.size)
		size = (size_t)(g.size - (uint64_t)off);
	memcpy(g.img + off, buf, size);
	pthread_mutex_lock(&g.mu);
	g.writes++;
	g.write_bytes += size;
	pthread_mutex_unlock(&g.mu);
	fuse_reply_write(req, size);
}

static void op_ok(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	op_ok(req, ino, fi);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	if (!(mode & FALLOC_FL_PUNCH_HOLE)) {
		fuse_reply_err(req, 0); // the whole image is always allocated
		return;
	}
	if ((uint64_t)off >= g.size) {
		fuse_reply_err(req, 0);
		return;
	}
	if ((uint64_t)(off + len) > g.size)
		len = (off_t)(g.size - (uint64_t)off);
	// Zero the range; give whole pages back to the kernel (discard frees RAM).
	long ps = sysconf(_SC_PAGESIZE);
	uint64_t a = ((uint64_t)off + (uint64_t)ps - 1) / (uint64_t)ps * (uint64_t)ps;
	uint64_t b = ((uint64_t)(off + len)) / (uint64_t)ps * (uint64_t)ps;
	if (b > a) {
		memset(g.img + off, 0, a - (uint64_t)off);
		madvise(g.img + a, b - a, MADV_DONTNEED);
		memset(g.img + b, 0, (uint64_t)(off + len) - b);
	} else {
		memset(g.img + off, 0, (size_t)len);
	}
	fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	struct statvfs s;
	memset(&s, 0, sizeof s);
	s.f_bsize = 4096;
	s.f_frsize = 4096;
	s.f_blocks = g.size / 4096;
	s.f_files = 2;
	s.f_namemax = 255;
	fuse_reply_statfs(req, &s);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.flush = op_ok,
	.release = op_ok,
	.fsync = op_fsync,
	.fallocate = op_fallocate,
	.statfs = op_statfs,
};

// ---- control socket ----

static int parse_ranges(char **tok, int ntok, uint64_t **offs, uint64_t **lens)
{
	*offs = calloc((size_t)ntok + 1, sizeof **offs);
	*lens = calloc((size_t)ntok + 1, sizeof **lens);
	for (int i = 0; i < ntok; i++) {
		char *colon = strchr(tok[i], ':');
		if (!colon)
			return -1;
		*colon = 0;
		char *e1, *e2;
		(*offs)[i] = strtoull(tok[i], &e1, 10);
		(*lens)[i] = strtoull(colon + 1, &e2, 10);
		int bad = *e1 || *e2 || (*lens)[i] == 0;
		*colon = ':';
		if (bad)
			return -1;
	}
	return 0;
}

static void ranges_json(char *dst, size_t n, uint64_t *offs, uint64_t *lens, int k)
{
	size_t j = (size_t)snprintf(dst, n, "[");
	for (int i = 0; i < k && j + 64 < n; i++)
		j += (size_t)snprintf(dst + j, n - j, "%s[%" PRIu64 ",%" PRIu64 "]", i ? "," : "", offs[i], lens[i]);
	snprintf(dst + j, n - j, "]");
}

static void clear_intrinsic(void)
{
	for (int i = 0; i < g.nifiles; i++) {
		free(g.ifiles[i].starts);
		free(g.ifiles[i].lens);
	}
	g.nifiles = 0;
}

// command handles one control line and writes the reply into out.
static void command(char *line, char *out, size_t outn)
{
	line[strcspn(line, "\r\n")] = 0;
	char *label = strstr(line, " #");
	if (label) {
		*label = 0;
		label += 2;
		while (*label == ' ')
			label++;
	} else {
		label = "";
	}
	char *tok[MAX_RANGES + 8];
	int nt = 0;
	for (char *s = strtok(line, " \t\r\n"); s && nt < MAX_RANGES + 8; s = strtok(NULL, " \t\r\n"))
		tok[nt++] = s;
	if (nt == 0) {
		snprintf(out, outn, "err empty command");
		return;
	}
	const char *cmd = tok[0];
	static char rj[MAX_RANGES * 44 + 16];

	if (!strcmp(cmd, "model") && nt == 4) {
		double lat_us = atof(tok[1]), bw = atof(tok[2]);
		int slots = atoi(tok[3]);
		if (lat_us < 0 || bw <= 0 || slots < 1 || slots > g.sem_slots) {
			snprintf(out, outn, "err model: need LAT_US>=0 BW_MBPS>0 1<=SLOTS<=%d", g.sem_slots);
			return;
		}
		pthread_mutex_lock(&g.mu);
		g.lat_ns = (uint64_t)(lat_us * 1000);
		g.bw_bytes_per_ns = bw * 1e6 / 1e9;
		pthread_mutex_unlock(&g.mu);
		// Shrink the parallelism by holding back slots, grow it by posting.
		// Not under g.mu: a reader holding a slot may need g.mu to give it back.
		// Only this (single) control thread changes g.slots.
		while (g.slots > slots) {
			sem_wait(&g.slot_sem);
			g.slots--;
		}
		while (g.slots < slots) {
			sem_post(&g.slot_sem);
			g.slots++;
		}
		truth("model", label, "\"lat_us\":%g,\"bw_mbps\":%g,\"slots\":%d", lat_us, bw, slots);
		snprintf(out, outn, "ok");
	} else if (!strcmp(cmd, "permanent") && nt >= 3) {
		double extra_us = atof(tok[1]);
		uint64_t *offs, *lens;
		int k = nt - 2;
		if (extra_us < 0 || parse_ranges(tok + 2, k, &offs, &lens) != 0) {
			free(offs);
			free(lens);
			snprintf(out, outn, "err permanent: need EXTRA_US OFF:LEN...");
			return;
		}
		pthread_mutex_lock(&g.mu);
		if (g.nperm + k > MAX_RANGES) {
			pthread_mutex_unlock(&g.mu);
			free(offs);
			free(lens);
			snprintf(out, outn, "err permanent: more than %d ranges; clear first", MAX_RANGES);
			return;
		}
		for (int i = 0; i < k; i++)
			g.perm[g.nperm++] = (struct range){offs[i], lens[i], (uint64_t)(extra_us * 1000)};
		pthread_mutex_unlock(&g.mu);
		ranges_json(rj, sizeof rj, offs, lens, k);
		truth("permanent", label, "\"extra_us\":%g,\"ranges\":%s", extra_us, rj);
		free(offs);
		free(lens);
		snprintf(out, outn, "ok");
	} else if (!strcmp(cmd, "temporal") && nt == 5) {
		double period_ms = atof(tok[1]), dur_ms = atof(tok[2]), frac = atof(tok[3]), extra_us = atof(tok[4]);
		if (period_ms <= 0 || dur_ms <= 0 || dur_ms > period_ms || frac < 0 || frac > 1 || extra_us < 0) {
			snprintf(out, outn, "err temporal: need PERIOD_MS>0 0<DURATION_MS<=PERIOD_MS 0<=FRACTION<=1 EXTRA_US>=0");
			return;
		}
		pthread_mutex_lock(&g.mu);
		g.temporal_on = 1;
		g.t_start_ns = now_ns(CLOCK_MONOTONIC);
		g.t_period_ns = (uint64_t)(period_ms * 1e6);
		g.t_dur_ns = (uint64_t)(dur_ms * 1e6);
		g.t_frac = frac;
		g.t_extra_ns = (uint64_t)(extra_us * 1000);
		uint64_t start = g.t_start_ns;
		pthread_mutex_unlock(&g.mu);
		truth("temporal", label, "\"period_ms\":%g,\"duration_ms\":%g,\"fraction\":%g,\"extra_us\":%g,\"windows_from_mono_ns\":%" PRIu64,
		      period_ms, dur_ms, frac, extra_us, start);
		snprintf(out, outn, "ok %" PRIu64, start);
	} else if (!strcmp(cmd, "intrinsic") && nt >= 4) {
		int n = atoi(tok[1]);
		double extra_us = atof(tok[2]);
		uint64_t *offs, *lens;
		int k = nt - 3;
		if (n < 1 || extra_us < 0 || parse_ranges(tok + 3, k, &offs, &lens) != 0) {
			free(offs);
			free(lens);
			snprintf(out, outn, "err intrinsic: need N>=1 EXTRA_US OFF:LEN...");
			return;
		}
		pthread_mutex_lock(&g.mu);
		if (g.nifiles >= MAX_IFILES) {
			pthread_mutex_unlock(&g.mu);
			free(offs);
			free(lens);
			snprintf(out, outn, "err intrinsic: more than %d files; clear first", MAX_IFILES);
			return;
		}
		g.ifiles[g.nifiles++] = (struct ifile){offs, lens, k, (uint64_t)(extra_us * 1000), n, -1, 0};
		pthread_mutex_unlock(&g.mu);
		ranges_json(rj, sizeof rj, offs, lens, k);
		truth("intrinsic", label, "\"first_n\":%d,\"extra_us\":%g,\"extents\":%s", n, extra_us, rj);
		snprintf(out, outn, "ok");
	} else if (!strcmp(cmd, "device") && nt == 2) {
		char *e;
		double extra_us = strtod(tok[1], &e);
		if (*e || extra_us < 0) {
			snprintf(out, outn, "err device: need EXTRA_US>=0");
			return;
		}
		pthread_mutex_lock(&g.mu);
		g.dev_extra_ns = (uint64_t)(extra_us * 1000);
		pthread_mutex_unlock(&g.mu);
		truth("device", label, "\"extra_us\":%g", extra_us);
		snprintf(out, outn, "ok");
	} else if (!strcmp(cmd, "mark") && nt == 2) {
		char name[128];
		json_escape(name, sizeof name, tok[1]);
		truth(name, label, NULL);
		snprintf(out, outn, "ok");
	} else if (!strcmp(cmd, "clear") && nt <= 2) {
		const char *what = nt == 2 ? tok[1] : "all";
		int all = !strcmp(what, "all");
		if (!all && strcmp(what, "permanent") && strcmp(what, "temporal") && strcmp(what, "intrinsic") && strcmp(what, "device")) {
			snprintf(out, outn, "err clear: give all, permanent, temporal, intrinsic or device");
			return;
		}
		pthread_mutex_lock(&g.mu);
		if (all || !strcmp(what, "permanent"))
			g.nperm = 0;
		if (all || !strcmp(what, "temporal"))
			g.temporal_on = 0;
		if (all || !strcmp(what, "intrinsic"))
			clear_intrinsic();
		if (all || !strcmp(what, "device"))
			g.dev_extra_ns = 0;
		pthread_mutex_unlock(&g.mu);
		truth("clear", label, "\"what\":\"%s\"", what);
		snprintf(out, outn, "ok");
	} else if (!strcmp(cmd, "stats") && nt == 1) {
		pthread_mutex_lock(&g.mu);
		snprintf(out, outn,
			 "{\"reads\":%" PRIu64 ",\"read_bytes\":%" PRIu64 ",\"writes\":%" PRIu64 ",\"write_bytes\":%" PRIu64
			 ",\"hits_permanent\":%" PRIu64 ",\"hits_temporal\":%" PRIu64 ",\"hits_intrinsic\":%" PRIu64 ",\"hits_device\":%" PRIu64 ",\"device_extra_us\":%g"
			 ",\"inflight\":%d,\"max_inflight\":%d,\"lat_us\":%g,\"bw_mbps\":%g,\"slots\":%d,\"permanent_ranges\":%d,\"temporal\":%d,\"intrinsic_files\":%d}",
			 g.reads, g.read_bytes, g.writes, g.write_bytes, g.hits_perm, g.hits_temporal, g.hits_intrinsic, g.hits_device, (double)g.dev_extra_ns / 1000,
			 g.inflight, g.max_inflight, (double)g.lat_ns / 1000, g.bw_bytes_per_ns * 1e3, g.slots, g.nperm,
			 g.temporal_on, g.nifiles);
		pthread_mutex_unlock(&g.mu);
	} else if (!strcmp(cmd, "flush") && nt == 1) {
		pthread_mutex_lock(&g.logmu);
		if (g.reqlog)
			fflush(g.reqlog);
		pthread_mutex_unlock(&g.logmu);
		snprintf(out, outn, "ok");
	} else {
		snprintf(out, outn, "err unknown command or wrong arguments: %s (see labfs.c header)", cmd);
	}
}

static void *control_loop(void *arg)
{
	int lfd = (int)(intptr_t)arg;
	static char line[MAX_RANGES * 44 + 256];
	char out[2048];
	for (;;) {
		int c = accept(lfd, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			return NULL;
		}
		FILE *f = fdopen(c, "r+");
		if (!f) {
			close(c);
			continue;
		}
		while (fgets(line, sizeof line, f)) {
			command(line, out, sizeof out);
			fprintf(f, "%s\n", out);
			fflush(f);
		}
		fclose(f);
	}
}

static int control_listen(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof a.sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(a.sun_path, path);
	unlink(path);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 16) < 0)
		return -1;
	chmod(path, 0600);
	return fd;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: labfs MOUNTPOINT --size=BYTES --ctl=SOCKET --truth=FILE [--reqlog=FILE]\n"
		"             [--lat-us=150] [--bw-mbps=150] [--slots=16] [--threads=64] [--nice=-10]\n"
		"Serves MOUNTPOINT/image, a RAM-backed file with an SSD-like latency model.\n");
}

static const char *opt(const char *arg, const char *name)
{
	size_t n = strlen(name);
	return strncmp(arg, name, n) == 0 && arg[n] == '=' ? arg + n + 1 : NULL;
}

int main(int argc, char **argv)
{
	const char *mnt = NULL, *ctl = NULL, *truthp = NULL, *reqlogp = NULL, *v;
	double lat_us = 150, bw = 150;
	int slots = 16, threads = 64, nice_v = -10;
	for (int i = 1; i < argc; i++) {
		if ((v = opt(argv[i], "--size")))
			g.size = strtoull(v, NULL, 10);
		else if ((v = opt(argv[i], "--ctl")))
			ctl = v;
		else if ((v = opt(argv[i], "--truth")))
			truthp = v;
		else if ((v = opt(argv[i], "--reqlog")))
			reqlogp = v;
		else if ((v = opt(argv[i], "--lat-us")))
			lat_us = atof(v);
		else if ((v = opt(argv[i], "--bw-mbps")))
			bw = atof(v);
		else if ((v = opt(argv[i], "--slots")))
			slots = atoi(v);
		else if ((v = opt(argv[i], "--threads")))
			threads = atoi(v);
		else if ((v = opt(argv[i], "--nice")))
			nice_v = atoi(v);
		else if (argv[i][0] != '-' && !mnt)
			mnt = argv[i];
		else {
			usage();
			return 2;
		}
	}
	if (!mnt || !ctl || !truthp || g.size < (1 << 20) || g.size % 4096 || bw <= 0 || slots < 1 || slots > MAX_SLOTS || threads < 2) {
		usage();
		return 2;
	}
	g.img = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (g.img == MAP_FAILED) {
		perror("labfs: mmap image");
		return 1;
	}
	pthread_mutex_init(&g.mu, NULL);
	pthread_mutex_init(&g.logmu, NULL);
	g.lat_ns = (uint64_t)(lat_us * 1000);
	g.bw_bytes_per_ns = bw * 1e6 / 1e9;
	g.slots = slots;
	g.sem_slots = MAX_SLOTS;
	sem_init(&g.slot_sem, 0, (unsigned)slots);
	g.perm = calloc(MAX_RANGES, sizeof *g.perm);
	g.rng = now_ns(CLOCK_MONOTONIC) | 1;
	g.truth = fopen(truthp, "a");
	if (!g.truth) {
		perror("labfs: open ground-truth file");
		return 1;
	}
	if (reqlogp) {
		g.reqlog = fopen(reqlogp, "a");
		if (!g.reqlog) {
			perror("labfs: open request log");
			return 1;
		}
		setvbuf(g.reqlog, NULL, _IOFBF, 1 << 20);
	}
	// Sleep precision matters at 150 us: drop the default 50 us timer slack
	// (inherited by the worker threads created below).
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	// A real drive keeps its timing when the host is busy; the emulation
	// needs the CPU promptly to do the same. Inherited by the workers.
	if (setpriority(PRIO_PROCESS, 0, nice_v) != 0)
		perror("labfs: setpriority (continuing at normal priority)");

	int lfd = control_listen(ctl);
	if (lfd < 0) {
		perror("labfs: control socket");
		return 1;
	}
	pthread_t ct;
	pthread_create(&ct, NULL, control_loop, (void *)(intptr_t)lfd);

	char *fargv[] = {argv[0], "-o", "max_read=1048576,fsname=readaheadd-lab,subtype=labfs", NULL};
	struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
	struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
	if (!se) {
		fprintf(stderr, "labfs: fuse_session_new failed\n");
		return 1;
	}
	if (fuse_set_signal_handlers(se) != 0) {
		fprintf(stderr, "labfs: cannot set signal handlers\n");
		return 1;
	}
	if (fuse_session_mount(se, mnt) != 0) {
		fprintf(stderr, "labfs: cannot mount FUSE at %s (is /dev/fuse there, are we root?)\n", mnt);
		return 1;
	}
	truth("start", "", "\"size\":%" PRIu64 ",\"lat_us\":%g,\"bw_mbps\":%g,\"slots\":%d,\"threads\":%d,\"pid\":%d", g.size, lat_us, bw,
	      slots, threads, (int)getpid());

	struct fuse_loop_config *cfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(cfg, (unsigned)threads);
	fuse_loop_cfg_set_idle_threads(cfg, (unsigned)(threads / 2));
	fuse_loop_cfg_set_clone_fd(cfg, 0);
	int ret = fuse_session_loop_mt(se, cfg);
	fuse_loop_cfg_destroy(cfg);

	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	truth("stop", "", NULL);
	if (g.reqlog)
		fflush(g.reqlog);
	unlink(ctl);
	return ret ? 1 : 0;
}
