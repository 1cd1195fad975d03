package batcher

import (
	"slices"
	"sync"
	"testing"
	"time"
)

type job struct {
	id, key int
	batch   []int // the ids of the batch it ran in
}

// TestQueueBatchesByKey: a job that finds the queue idle runs alone at once; jobs queued
// meanwhile run in batches of one key, oldest first, a power of two of them within the limit.
func TestQueueBatchesByKey(t *testing.T) {
	gate, started := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var batches [][]int
	var q *Queue[int, *job]
	q = New[int](4, func(b []*job) {
		ids := make([]int, len(b))
		for i, j := range b {
			ids[i] = j.id
			if j.key != b[0].key {
				t.Errorf("batch %v mixes keys", ids)
			}
		}
		for _, j := range b {
			j.batch = ids
		}
		mu.Lock()
		batches = append(batches, ids)
		mu.Unlock()
		if ids[0] == 0 {
			started <- struct{}{}
			<-gate // hold the first batch while the others queue
		}
	})
	// Job 0 runs; jobs 1..7 queue: keys 1,1,2,1,1,1,2.
	keys := []int{0, 1, 1, 2, 1, 1, 1, 2}
	jobs := make([]*job, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		jobs[i] = &job{id: i, key: k}
		wg.Go(func() { q.Do(k, jobs[i]) })
		if i == 0 {
			<-started
		}
		for q.Pending() < i { // queue in order
			time.Sleep(time.Millisecond)
		}
	}
	close(gate)
	wg.Wait()
	want := [][]int{{0}, {1, 2, 4, 5}, {3, 7}, {6}}
	if !slices.EqualFunc(batches, want, slices.Equal) {
		t.Errorf("batches %v, want %v", batches, want)
	}
	if q.Pending() != 0 {
		t.Errorf("%d jobs left queued", q.Pending())
	}
	// Idle again: the next job runs alone at once on the caller's goroutine.
	j := &job{id: 8, key: 1}
	q.Do(1, j)
	if !slices.Equal(j.batch, []int{8}) {
		t.Errorf("idle queue ran %v", j.batch)
	}
}

// TestQueueLimit: with limit 1 nothing batches.
func TestQueueLimit(t *testing.T) {
	gate, started := make(chan struct{}), make(chan struct{})
	var sizes []int
	q := New[int](8, func(b []*job) {
		sizes = append(sizes, len(b)) // batches run one at a time
		if b[0].id == 0 {
			started <- struct{}{}
			<-gate
		}
	})
	q.SetLimit(1)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { q.Do(0, &job{id: i}) })
		if i == 0 {
			<-started
		}
		for q.Pending() < i {
			time.Sleep(time.Millisecond)
		}
	}
	close(gate)
	wg.Wait()
	if !slices.Equal(sizes, []int{1, 1, 1, 1}) {
		t.Errorf("batch sizes %v with limit 1", sizes)
	}
}

func TestSize(t *testing.T) {
	for n, want := range map[int]int{1: 1, 2: 2, 3: 2, 7: 4, 8: 8, 15: 8, 16: 16} {
		if got := Size(n); got != want {
			t.Errorf("Size(%d) = %d, want %d", n, got, want)
		}
	}
}
