/* Context and thread pool.
 *
 * A context owns n_threads-1 persistent worker threads; the thread that calls
 * vx_parallel_for is the n-th. One parallel_for publishes a job (fn, arg, n, chunk) and a
 * "ticket" word that packs the job's epoch (high 32 bits) with the next unclaimed chunk (low
 * 32 bits). Every thread, caller included, claims chunks with a compare-and-swap on the
 * ticket, so a worker that wakes late and still holds an old job's parameters cannot claim
 * anything: its CAS fails on the epoch. The caller returns once every chunk is *completed*
 * (a per-job counter), without waiting for sleeping workers to wake up, so tiny jobs never
 * pay a wakeup.
 *
 * Idle workers spin for a few microseconds watching the epoch, then block on a condition
 * variable. The Dekker-style pairing (worker: sleepers++ then re-check the epoch under the
 * mutex; caller: publish the epoch then check sleepers, broadcasting under the mutex) rules
 * out lost wakeups. The caller waiting for stragglers uses the same scheme in reverse.
 *
 * The context also owns scratch memory: one growable buffer per thread slot plus a shared
 * one (vx_scratch), so kernels do not malloc per call. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cblas.h>
#include "kern.h" /* vx.h, and VX_X86 */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker (or a caller waiting for stragglers) spins before blocking. A
 * streamed chunk runs several programs with Go work between them (features, the iSTFT,
 * batching hand-offs); with 20 us the worker was often asleep when the next program began,
 * so its first products ran on the caller alone until the wakeup landed. 100 us covers those
 * gaps: bench meanvc2 (F16, 2 threads) 5 % less wall time in 3 of 4 alternating rounds,
 * 8 real-time sessions unchanged; an idle pool still sleeps 100 us after its last job. */
#ifndef VX_SPIN_NS
#define VX_SPIN_NS 100000
#endif

typedef struct {
	void *p;
	size_t cap;
	char pad[64 - sizeof(void *) - sizeof(size_t)];
} scratch_slot;

struct vx_ctx {
	int n_threads;
	pthread_t *threads;
	scratch_slot *scratch; /* n_threads per-thread slots, then the shared slot */

	pthread_mutex_t mu;
	pthread_cond_t cv_work; /* workers wait for a new epoch */
	pthread_cond_t cv_done; /* the caller waits for the last chunk */

	/* the current job, written by the caller before the ticket is published; job_epoch is a
	 * sequence lock over the parameters (0 while they are being written) */
	_Atomic uint32_t job_epoch;
	_Atomic(vx_task_fn) fn;
	_Atomic(void *) arg;
	_Atomic int64_t n;
	_Atomic int64_t chunk;
	_Atomic uint32_t n_chunks;

	_Alignas(64) _Atomic uint64_t ticket; /* epoch << 32 | next chunk */
	_Alignas(64) _Atomic uint32_t done;   /* chunks completed in this job */
	_Atomic int caller_waiting;
	_Alignas(64) _Atomic int sleepers;
	_Atomic int stop;
	uint32_t epoch; /* caller's copy */
	vx_profile *profile; /* vx_ctx_set_profile; read by vx_execute on the caller's thread */
	vx_rope_memo *rope;  /* k_rope.c's cos/sin tables, freed with the context */
};

typedef struct {
	vx_ctx *ctx;
	int id;
} worker_arg;

static _Thread_local int tls_thread_id;

int vx_thread_id(void) { return tls_thread_id; }

/* ---- process setup ---- */

int vx_cpu_features;
static int detected = -1;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void do_init(void) {
	int f = 0;
#ifdef VX_X86 /* elsewhere no SIMD path is compiled in: f stays 0, every kernel is portable */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2"))
		f |= VX_CPU_AVX2;
	if (__builtin_cpu_supports("fma"))
		f |= VX_CPU_FMA;
	if (__builtin_cpu_supports("avx512f"))
		f |= VX_CPU_AVX512F;
#endif
	/* Our pool owns the cores: OpenBLAS runs single-threaded inside our tasks. */
	openblas_set_num_threads(1);
	vx_cpu_features = f;
	detected = f;
}

int vx_init(void) {
	pthread_once(&init_once, do_init);
	return detected;
}

void vx_force_portable(int on) {
	vx_init();
	vx_cpu_features = on ? 0 : detected;
}

int vx_limit_cpu_features(int mask) {
	vx_init();
	vx_cpu_features = detected & mask;
	return vx_cpu_features;
}

/* ---- timing helper ---- */

static inline int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- job execution ---- */

/* Claims and runs chunks of the job with the given epoch until none is left. fn..n_chunks
 * must be that job's parameters. */
static void run_chunks(vx_ctx *c, uint32_t epoch, vx_task_fn fn, void *arg, int64_t n,
                       int64_t chunk, uint32_t n_chunks) {
	uint64_t t = atomic_load_explicit(&c->ticket, memory_order_acquire);
	for (;;) {
		if ((uint32_t)(t >> 32) != epoch)
			return;
		uint32_t idx = (uint32_t)t;
		if (idx >= n_chunks)
			return;
		if (!atomic_compare_exchange_weak_explicit(&c->ticket, &t, t + 1, memory_order_acq_rel,
		                                           memory_order_acquire))
			continue;
		int64_t lo = (int64_t)idx * chunk, hi = lo + chunk;
		if (hi > n)
			hi = n;
		for (int64_t i = lo; i < hi; i++)
			fn(arg, i);
		uint32_t d = atomic_fetch_add(&c->done, 1) + 1; /* seq_cst: pairs with caller_waiting */
		if (d == n_chunks && atomic_load(&c->caller_waiting)) {
			pthread_mutex_lock(&c->mu);
			pthread_cond_signal(&c->cv_done);
			pthread_mutex_unlock(&c->mu);
		}
		t = atomic_load_explicit(&c->ticket, memory_order_acquire);
	}
}

static void *worker_main(void *p) {
	worker_arg *wa = p;
	vx_ctx *c = wa->ctx;
	tls_thread_id = wa->id;
	free(wa);
	uint32_t seen = 0;
	for (;;) {
		/* wait for a new epoch: spin briefly, then block */
		uint64_t t = atomic_load_explicit(&c->ticket, memory_order_acquire);
		if ((uint32_t)(t >> 32) == seen && !atomic_load_explicit(&c->stop, memory_order_relaxed)) {
			int64_t deadline = now_ns() + VX_SPIN_NS;
			for (int spins = 0;; spins++) {
				cpu_relax();
				t = atomic_load_explicit(&c->ticket, memory_order_acquire);
				if ((uint32_t)(t >> 32) != seen || atomic_load_explicit(&c->stop, memory_order_relaxed))
					break;
				if ((spins & 63) == 63 && now_ns() > deadline) {
					pthread_mutex_lock(&c->mu);
					atomic_fetch_add(&c->sleepers, 1);
					for (;;) {
						t = atomic_load(&c->ticket);
						if ((uint32_t)(t >> 32) != seen || atomic_load(&c->stop))
							break;
						pthread_cond_wait(&c->cv_work, &c->mu);
					}
					atomic_fetch_sub(&c->sleepers, 1);
					pthread_mutex_unlock(&c->mu);
					break;
				}
			}
		}
		if (atomic_load(&c->stop))
			return NULL;
		seen = (uint32_t)(t >> 32);
		/* Read the job's parameters under the sequence lock; if they are not (or no longer)
		 * the parameters of epoch `seen`, a later job has started: go round again. */
		if (atomic_load_explicit(&c->job_epoch, memory_order_acquire) != seen)
			continue;
		vx_task_fn fn = atomic_load_explicit(&c->fn, memory_order_relaxed);
		void *arg = atomic_load_explicit(&c->arg, memory_order_relaxed);
		int64_t n = atomic_load_explicit(&c->n, memory_order_relaxed);
		int64_t chunk = atomic_load_explicit(&c->chunk, memory_order_relaxed);
		uint32_t n_chunks = atomic_load_explicit(&c->n_chunks, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&c->job_epoch, memory_order_relaxed) != seen)
			continue;
		run_chunks(c, seen, fn, arg, n, chunk, n_chunks);
	}
}

void vx_parallel_for(vx_ctx *c, int64_t n, vx_task_fn fn, void *arg) {
	if (n <= 0)
		return;
	if (n == 1 || c == NULL || c->n_threads <= 1) {
		for (int64_t i = 0; i < n; i++)
			fn(arg, i);
		return;
	}
	tls_thread_id = 0;
	/* chunks: several per thread for balance under noisy neighbours */
	int64_t target = (int64_t)c->n_threads * 4;
	int64_t chunk = (n + target - 1) / target;
	if (chunk < 1)
		chunk = 1;
	int64_t nc = (n + chunk - 1) / chunk;
	while (nc > 0x7fffffff) { /* keep the chunk index within 31 bits */
		chunk *= 2;
		nc = (n + chunk - 1) / chunk;
	}
	uint32_t n_chunks = (uint32_t)nc;

	uint32_t epoch = c->epoch + 1;
	if (epoch == 0) /* 0 is the workers' initial "seen" value and the lock's busy value */
		epoch = 1;
	c->epoch = epoch;
	atomic_store_explicit(&c->job_epoch, 0, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&c->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&c->arg, arg, memory_order_relaxed);
	atomic_store_explicit(&c->n, n, memory_order_relaxed);
	atomic_store_explicit(&c->chunk, chunk, memory_order_relaxed);
	atomic_store_explicit(&c->n_chunks, n_chunks, memory_order_relaxed);
	atomic_store_explicit(&c->done, 0, memory_order_relaxed);
	atomic_store_explicit(&c->job_epoch, epoch, memory_order_release);
	atomic_store(&c->ticket, (uint64_t)epoch << 32); /* seq_cst: pairs with sleepers */
	if (atomic_load(&c->sleepers) > 0) {
		pthread_mutex_lock(&c->mu);
		pthread_cond_broadcast(&c->cv_work);
		pthread_mutex_unlock(&c->mu);
	}

	run_chunks(c, epoch, fn, arg, n, chunk, n_chunks);

	/* wait for chunks other threads are still running */
	if (atomic_load_explicit(&c->done, memory_order_acquire) == n_chunks)
		return;
	int64_t deadline = now_ns() + VX_SPIN_NS;
	for (int spins = 0;; spins++) {
		cpu_relax();
		if (atomic_load_explicit(&c->done, memory_order_acquire) == n_chunks)
			return;
		if ((spins & 63) == 63 && now_ns() > deadline)
			break;
	}
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->caller_waiting, 1);
	while (atomic_load(&c->done) != n_chunks)
		pthread_cond_wait(&c->cv_done, &c->mu);
	atomic_store(&c->caller_waiting, 0);
	pthread_mutex_unlock(&c->mu);
}

/* ---- contexts ---- */

static void ctx_destroy(vx_ctx *c, int started) {
	if (started > 0) {
		pthread_mutex_lock(&c->mu);
		atomic_store(&c->stop, 1);
		pthread_cond_broadcast(&c->cv_work);
		pthread_mutex_unlock(&c->mu);
		for (int i = 0; i < started; i++)
			pthread_join(c->threads[i], NULL);
	}
	if (c->scratch) {
		for (int i = 0; i <= c->n_threads; i++)
			free(c->scratch[i].p);
		free(c->scratch);
	}
	free(c->threads);
	vx_rope_memo_free(c->rope);
	pthread_cond_destroy(&c->cv_done);
	pthread_cond_destroy(&c->cv_work);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

vx_ctx *vx_ctx_new(int n_threads) {
	vx_init();
	if (n_threads < 1)
		n_threads = 1;
	if (n_threads > 256)
		n_threads = 256;
	vx_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->n_threads = n_threads;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv_work, NULL);
	pthread_cond_init(&c->cv_done, NULL);
	c->scratch = calloc((size_t)n_threads + 1, sizeof *c->scratch);
	c->threads = calloc((size_t)n_threads, sizeof *c->threads);
	if (!c->scratch || !c->threads) {
		ctx_destroy(c, 0);
		return NULL;
	}
	for (int i = 1; i < n_threads; i++) {
		worker_arg *wa = malloc(sizeof *wa);
		int err = wa ? 0 : ENOMEM;
		if (wa) {
			wa->ctx = c;
			wa->id = i;
			err = pthread_create(&c->threads[i - 1], NULL, worker_main, wa);
			if (err)
				free(wa);
		}
		if (err) {
			ctx_destroy(c, i - 1);
			return NULL;
		}
	}
	return c;
}

void vx_ctx_free(vx_ctx *c) {
	if (c)
		ctx_destroy(c, c->n_threads - 1);
}

int vx_ctx_threads(const vx_ctx *c) { return c->n_threads; }

void vx_ctx_set_profile(vx_ctx *c, vx_profile *p) { c->profile = p; }

vx_profile *vx_ctx_profile_of(const vx_ctx *c) { return c->profile; }

vx_rope_memo **vx_ctx_rope_memo(vx_ctx *c) { return &c->rope; }

/* ---- scratch ---- */

void *vx_scratch(vx_ctx *c, int slot, int64_t bytes) {
	if (slot < 0 || slot >= c->n_threads)
		slot = c->n_threads; /* shared */
	scratch_slot *s = &c->scratch[slot];
	if (bytes < 1)
		bytes = 1;
	if (s->cap < (size_t)bytes) {
		size_t cap = ((size_t)bytes + 4095) & ~(size_t)4095;
		if (cap < s->cap * 2 && s->cap * 2 < ((size_t)1 << 34))
			cap = s->cap * 2;
		void *p = aligned_alloc(64, cap);
		if (!p)
			return NULL;
		free(s->p);
		s->p = p;
		s->cap = cap;
	}
	return s->p;
}

/* ---- test and benchmark hooks ---- */

static void count_task(void *arg, int64_t i) {
	int32_t *counts = arg;
	__atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED);
}

void vx_test_parallel_for(vx_ctx *c, int64_t n, int32_t *counts, int32_t reps) {
	for (int32_t r = 0; r < reps; r++)
		vx_parallel_for(c, n, count_task, counts);
}

typedef struct {
	int32_t *by_thread;
} tid_arg;

static void tid_task(void *arg, int64_t i) {
	tid_arg *a = arg;
	(void)i;
	/* burn a little time so that late workers have something to claim */
	volatile int x = 0;
	for (int k = 0; k < 2000; k++)
		x += k;
	__atomic_fetch_add(&a->by_thread[vx_thread_id()], 1, __ATOMIC_RELAXED);
}

void vx_test_parallel_threads(vx_ctx *c, int64_t n, int32_t *by_thread) {
	tid_arg a = {by_thread};
	vx_parallel_for(c, n, tid_task, &a);
}

static void empty_task(void *arg, int64_t i) {
	(void)arg;
	(void)i;
}

void vx_bench_parallel_for(vx_ctx *c, int64_t n, int64_t iters) {
	for (int64_t r = 0; r < iters; r++)
		vx_parallel_for(c, n, empty_task, NULL);
}
