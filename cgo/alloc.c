/* Tensor memory: vx_alloc and vx_free.
 *
 * A streaming model step reads every weight it multiplies, tens of megabytes per chunk,
 * and on 4 KiB pages every page of it misses the TLB (under a hypervisor a miss walks two
 * page tables). On 2 MiB pages the same weights take a few dozen misses. So:
 *   - buffers of 2 MiB and more get their own mapping on a 2 MiB boundary, the whole huge
 *     pages advised for transparent huge pages (the tail stays on small pages, so no buffer
 *     holds more than it asked for);
 *   - buffers from SLAB_MIN up to 2 MiB (most weights of MeanVC2, the vocoder's 1.97 MB
 *     ones included) are runs of 64 KiB units in 32 MiB slabs mapped the same way, shared
 *     by every buffer of those sizes; a slab is unmapped when its last run is freed;
 *   - smaller buffers come from malloc.
 * Fresh mappings come zeroed from the kernel, so a run is cleared only over units an
 * earlier run used (a memset would write every byte of a model's weights once more at load,
 * only for the upload to overwrite it). Where the kernel has no transparent huge pages the
 * advice is ignored and everything still works on small pages. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "kern.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define UNIT ((size_t)64 << 10)
#define SLAB_UNITS 512 /* 32 MiB */
#define SLAB_BYTES (SLAB_UNITS * UNIT)
#define SLAB_MIN ((size_t)256 << 10)
#define WORDS (SLAB_UNITS / 64)

typedef struct slab {
	char *base;
	uint64_t used[WORDS];  /* units in a live run */
	uint64_t dirty[WORDS]; /* units some run has used since the mapping (not zero) */
	int runs;              /* live runs */
	struct slab *next;
} slab;

static pthread_mutex_t slab_mu = PTHREAD_MUTEX_INITIALIZER;
static slab *slabs;
static int n_slabs;

/* What vx_alloc and vx_free round a request to. */
static size_t alloc_size(size_t bytes) { return bytes == 0 ? 64 : (bytes + 63) & ~(size_t)63; }

/* len bytes (a multiple of 4 KiB) mapped on a 2 MiB boundary, its whole huge pages advised. */
static char *map_aligned(size_t len) {
	char *m = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
	if (p > m) /* the mapping's unaligned head and its tail beyond len */
		munmap(m, (size_t)(p - m));
	munmap(p + len, (size_t)(m + HUGE_PAGE - p));
#ifdef MADV_HUGEPAGE
	madvise(p, len & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
	return p;
}

static int bit(const uint64_t *w, int i) { return (int)(w[i / 64] >> (i % 64) & 1); }
static void set_bits(uint64_t *w, int i, int n, int v) {
	for (int k = i; k < i + n; k++) {
		if (v)
			w[k / 64] |= (uint64_t)1 << (k % 64);
		else
			w[k / 64] &= ~((uint64_t)1 << (k % 64));
	}
}

/* The first run of n free units in s, or -1. */
static int find_run(const slab *s, int n) {
	for (int i = 0, len = 0; i < SLAB_UNITS; i++) {
		len = bit(s->used, i) ? 0 : len + 1;
		if (len == n)
			return i - n + 1;
	}
	return -1;
}

static void *slab_alloc(size_t size) {
	int n = (int)((size + UNIT - 1) / UNIT);
	pthread_mutex_lock(&slab_mu);
	slab *s = slabs;
	int at = -1;
	for (; s; s = s->next)
		if ((at = find_run(s, n)) >= 0)
			break;
	if (!s) {
		s = calloc(1, sizeof *s);
		if (s && !(s->base = map_aligned(SLAB_BYTES))) {
			free(s);
			s = NULL;
		}
		if (!s) {
			pthread_mutex_unlock(&slab_mu);
			return NULL;
		}
		s->next = slabs;
		slabs = s;
		n_slabs++;
		at = 0;
	}
	int dirty_from = -1, dirty_to = -1; /* the run's units to clear: [from, to] */
	for (int i = at; i < at + n; i++)
		if (bit(s->dirty, i)) {
			if (dirty_from < 0)
				dirty_from = i;
			dirty_to = i;
		}
	set_bits(s->used, at, n, 1);
	set_bits(s->dirty, at, n, 1);
	s->runs++;
	pthread_mutex_unlock(&slab_mu);
	char *p = s->base + (size_t)at * UNIT;
	if (dirty_from >= 0) /* the run is ours now: clear it outside the lock */
		memset(s->base + (size_t)dirty_from * UNIT, 0, (size_t)(dirty_to - dirty_from + 1) * UNIT);
	return p;
}

/* Frees p's run if p is in a slab: 1, else 0. */
static int slab_free(void *p, size_t size) {
	char *c = p;
	pthread_mutex_lock(&slab_mu);
	for (slab **link = &slabs; *link; link = &(*link)->next) {
		slab *s = *link;
		if (c < s->base || c >= s->base + SLAB_BYTES)
			continue;
		set_bits(s->used, (int)((size_t)(c - s->base) / UNIT), (int)((size + UNIT - 1) / UNIT), 0);
		if (--s->runs == 0) {
			*link = s->next;
			n_slabs--;
			munmap(s->base, SLAB_BYTES);
			free(s);
		}
		pthread_mutex_unlock(&slab_mu);
		return 1;
	}
	pthread_mutex_unlock(&slab_mu);
	return 0;
}

void *vx_alloc(size_t bytes) {
	size_t size = alloc_size(bytes);
	if (size >= SLAB_MIN && size < HUGE_PAGE)
		return slab_alloc(size);
	if (size < HUGE_PAGE) {
		void *p = aligned_alloc(64, size);
		if (p)
			memset(p, 0, size);
		return p;
	}
	return map_aligned((size + 4095) & ~(size_t)4095);
}

void vx_free(void *p, size_t bytes) {
	size_t size = alloc_size(bytes);
	if (!p)
		return;
	if (size >= SLAB_MIN && size < HUGE_PAGE) {
		if (!slab_free(p, size))
			abort(); /* not from vx_alloc with this size: memory would be corrupted */
	} else if (size < HUGE_PAGE)
		free(p);
	else
		munmap(p, (size + 4095) & ~(size_t)4095);
}

int vx_alloc_slabs(void) {
	pthread_mutex_lock(&slab_mu);
	int n = n_slabs;
	pthread_mutex_unlock(&slab_mu);
	return n;
}
