// Package batcher runs the model requests of many streams in batches.
//
// A request that finds the queue idle runs at once on its caller's goroutine, alone:
// batching adds no wait. Requests that arrive while a batch runs queue up, and the next
// batch takes the oldest one with every queued request of its key — a power of two of them,
// up to the limit, so that a few program sizes serve every batch. So the busier the model,
// the larger its batches, and the cheaper each stream's share of the weight reads. The
// caller that started running keeps running batches until its own request is done, then
// hands what is left to a new goroutine.
package batcher

import "sync"

// Queue batches jobs of type J by key K.
type Queue[K comparable, J any] struct {
	run func(batch []J) // runs one batch of jobs of one key; must not panic
	max int

	mu      sync.Mutex
	queue   []pending[K, J]
	running bool // a goroutine is running batches
	limit   int
}

type pending[K comparable, J any] struct {
	key  K
	job  J
	done chan struct{}
}

// New makes a queue whose batches hold at most max jobs and run through run, which records
// each job's result in the job itself and recovers its own panics.
func New[K comparable, J any](max int, run func(batch []J)) *Queue[K, J] {
	return &Queue[K, J]{run: run, max: max, limit: max}
}

// SetLimit sets the most jobs one batch takes (1: no batching; n ≤ 0 or above the queue's
// maximum: the maximum).
func (q *Queue[K, J]) SetLimit(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n <= 0 || n > q.max {
		n = q.max
	}
	q.limit = n
}

// Pending is the number of jobs waiting for a batch (not those of the batch running).
func (q *Queue[K, J]) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// Do queues job under key and returns once it has run.
func (q *Queue[K, J]) Do(key K, job J) {
	done := make(chan struct{}, 1)
	q.mu.Lock()
	q.queue = append(q.queue, pending[K, J]{key: key, job: job, done: done})
	if q.running {
		q.mu.Unlock()
		<-done
		return
	}
	q.running = true
	q.mu.Unlock()
	for {
		q.runBatch()
		select {
		case <-done:
			q.handOff()
			return
		default:
		}
	}
}

// handOff lets a new goroutine run the jobs still queued, or marks the queue idle.
func (q *Queue[K, J]) handOff() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) == 0 {
		q.running = false
		return
	}
	go func() {
		for {
			q.runBatch()
			q.mu.Lock()
			if len(q.queue) == 0 {
				q.running = false
				q.mu.Unlock()
				return
			}
			q.mu.Unlock()
		}
	}()
}

// runBatch takes the oldest job and the queued jobs of its key (up to a power of two within
// the limit) and runs them.
func (q *Queue[K, J]) runBatch() {
	q.mu.Lock()
	if len(q.queue) == 0 {
		q.mu.Unlock()
		return
	}
	key := q.queue[0].key
	like := 0
	for _, p := range q.queue {
		if p.key == key {
			like++
		}
	}
	size := Size(min(like, q.limit))
	var batch []pending[K, J]
	rest := q.queue[:0]
	for _, p := range q.queue {
		if p.key == key && len(batch) < size {
			batch = append(batch, p)
		} else {
			rest = append(rest, p)
		}
	}
	clear(q.queue[len(rest):])
	q.queue = rest
	q.mu.Unlock()

	jobs := make([]J, len(batch))
	for i, p := range batch {
		jobs[i] = p.job
	}
	q.run(jobs)
	for _, p := range batch {
		p.done <- struct{}{}
	}
}

// Size is the largest power of two ≤ n (n ≥ 1): the batch sizes a queue runs.
func Size(n int) int {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	return p
}
