package cgo

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func newCtx(t testing.TB, threads int) *Context {
	t.Helper()
	c, err := NewContext(threads)
	if err != nil {
		t.Fatal(err)
	}
	if c.Threads() != threads {
		t.Fatalf("Threads() = %d, want %d", c.Threads(), threads)
	}
	return c
}

func allocI32(t testing.TB, n int) *Buffer {
	t.Helper()
	b, err := Alloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkCounts fails unless every one of the first n counters equals want.
func checkCounts(t *testing.T, what string, counts []int32, n int, want int32) {
	t.Helper()
	for i := 0; i < n; i++ {
		if counts[i] != want {
			t.Fatalf("%s: index %d ran %d times, want %d", what, i, counts[i], want)
		}
	}
}

func TestParallelForCoversEveryIndexOnce(t *testing.T) {
	sizes := []int{0, 1, 2, 3, 5, 7, 8, 9, 16, 31, 63, 64, 65, 100, 1000, 4097, 100003}
	for _, threads := range []int{1, 2, 3, 4, 8} {
		c := newCtx(t, threads)
		buf := allocI32(t, 100003+1)
		counts := buf.Int32s()
		for _, n := range sizes {
			clear(counts)
			const reps = 7
			c.testParallelFor(n, buf, reps)
			checkCounts(t, "threads "+strconv.Itoa(threads)+" n "+strconv.Itoa(n), counts, n, reps)
			if counts[n] != 0 {
				t.Fatalf("threads %d n %d: index %d (out of range) was run", threads, n, n)
			}
		}
		buf.Free()
		c.Close()
	}
}

func TestParallelForBackToBack(t *testing.T) {
	for _, threads := range []int{2, 4} {
		c := newCtx(t, threads)
		buf := allocI32(t, 64)
		counts := buf.Int32s()
		// Many tiny calls in a row: no lost wakeups, no double runs.
		for _, n := range []int{2, 3, 17} {
			clear(counts)
			c.testParallelFor(n, buf, 20000)
			checkCounts(t, "back-to-back", counts, n, 20000)
		}
		// With pauses long enough for the workers to go to sleep between calls, so that the
		// blocking path and the wakeup are exercised too.
		clear(counts)
		for i := 0; i < 300; i++ {
			c.testParallelFor(5, buf, 1)
			if i%3 == 0 {
				time.Sleep(time.Duration(50+i%7*40) * time.Microsecond)
			}
		}
		checkCounts(t, "with pauses", counts, 5, 300)
		buf.Free()
		c.Close()
	}
}

func TestParallelForWorkersParticipate(t *testing.T) {
	c := newCtx(t, 2)
	defer c.Close()
	buf := allocI32(t, 2)
	defer buf.Free()
	by := buf.Int32s()
	total := 0
	// On a busy machine a worker may not get a core for one call; over a few calls it must.
	worker := 0
	for try := 0; try < 50 && worker == 0; try++ {
		clear(by)
		c.testParallelThreads(2000, buf)
		if int(by[0]+by[1]) != 2000 {
			t.Fatalf("tasks run: %d + %d, want 2000", by[0], by[1])
		}
		total += int(by[0] + by[1])
		worker += int(by[1])
	}
	if worker == 0 {
		t.Fatalf("the worker thread never ran a task in %d tasks", total)
	}
}

func TestParallelForConcurrentContexts(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			c, err := NewContext(2 + g%2)
			if err != nil {
				errs <- err.Error()
				return
			}
			defer c.Close()
			buf, err := Alloc(4 * 257)
			if err != nil {
				errs <- err.Error()
				return
			}
			defer buf.Free()
			counts := buf.Int32s()
			for round := 0; round < 200; round++ {
				n := 1 + (round*37+g)%257
				clear(counts)
				c.testParallelFor(n, buf, 3)
				for i := 0; i < n; i++ {
					if counts[i] != 3 {
						errs <- "context " + strconv.Itoa(g) + ": wrong count"
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// osThreads is this process's thread count (Linux), or -1.
func osThreads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err == nil {
				return n
			}
		}
	}
	return -1
}

func TestContextCreateFreeLoop(t *testing.T) {
	before := osThreads()
	buf := allocI32(t, 16)
	defer buf.Free()
	for i := 0; i < 300; i++ {
		c := newCtx(t, 1+i%4)
		if i%2 == 0 { // half of them never run anything: Close must not hang either way
			clear(buf.Int32s())
			c.testParallelFor(16, buf, 2)
			checkCounts(t, "create/free", buf.Int32s(), 16, 2)
		}
		c.Close()
		c.Close() // idempotent
	}
	if before > 0 {
		after := osThreads()
		// 300 contexts with up to 3 workers each would leave hundreds of threads behind if
		// workers were not joined; allow a little slack for Go's own threads.
		if after > before+8 {
			t.Fatalf("threads: %d before, %d after 300 create/free cycles (workers leaked?)", before, after)
		}
	}
}

// Tensor memory: zeroed to its last byte at every size, 64-byte aligned, and buffers of 2 MiB
// and more on a 2 MiB boundary (the start of their huge pages).
func TestAllocZeroedAndAligned(t *testing.T) {
	sizes := []int{0, 1, 63, 4097, 256<<10 - 1, 256 << 10, 300001, 2<<20 - 1, 2 << 20, 3<<20 + 5, 9 << 20}
	// Twice over: memory freed dirty must come back zeroed.
	for _, n := range append(sizes, sizes...) {
		b, err := Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		p := uintptr(b.Ptr())
		if p%64 != 0 || n >= 2<<20 && p%(2<<20) != 0 {
			t.Errorf("Alloc(%d) at %#x: want 64-byte alignment, and 2 MiB from 2 MiB on", n, p)
		}
		bytes := unsafe.Slice((*byte)(b.Ptr()), max(n, 1))
		for i, v := range bytes[:n] {
			if v != 0 {
				t.Fatalf("Alloc(%d): byte %d is %d, want 0", n, i, v)
			}
		}
		for i := range bytes {
			bytes[i] = 0xa5 // writable to the end
		}
		b.Free()
	}
}

// Buffers from 256 KiB to 2 MiB share slabs: live runs never overlap, a run freed dirty comes
// back zeroed, and a slab is unmapped once its last run is freed.
func TestAllocSlabs(t *testing.T) {
	before := allocSlabs()
	rng := uint64(7)
	next := func(n int) int { rng = rng*6364136223846793005 + 1442695040888963407; return int(rng>>33) % n }
	type live struct {
		b    *Buffer
		fill byte
	}
	var bufs []live
	check := func() {
		t.Helper()
		for _, l := range bufs {
			p := unsafe.Slice((*byte)(l.b.Ptr()), l.b.Bytes())
			if p[0] != l.fill || p[len(p)/2] != l.fill || p[len(p)-1] != l.fill {
				t.Fatalf("a live %d-byte buffer was overwritten", l.b.Bytes())
			}
		}
	}
	for round := range 6 {
		for range 40 { // ~45 MB: more than one slab
			n := 256<<10 + next(2<<20-256<<10)
			b, err := Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			p := unsafe.Slice((*byte)(b.Ptr()), n)
			if uintptr(b.Ptr())%64 != 0 {
				t.Fatalf("Alloc(%d) at %#x: want 64-byte alignment", n, b.Ptr())
			}
			for i := 0; i < n; i += 4093 {
				if p[i] != 0 || p[n-1] != 0 {
					t.Fatalf("round %d: Alloc(%d) is not zeroed", round, n)
				}
			}
			fill := byte(len(bufs)%250 + 1)
			for i := range p {
				p[i] = fill
			}
			bufs = append(bufs, live{b, fill})
		}
		check()
		if allocSlabs() < before+2 {
			t.Fatalf("%d slabs for %d buffers, want at least 2 more than %d", allocSlabs(), len(bufs), before)
		}
		for range len(bufs) / 2 { // free half, in a scattered order
			i := next(len(bufs))
			bufs[i].b.Free()
			bufs = append(bufs[:i], bufs[i+1:]...)
		}
		check()
	}
	for _, l := range bufs {
		l.b.Free()
	}
	if got := allocSlabs(); got != before {
		t.Errorf("%d slabs after every buffer was freed, want %d", got, before)
	}
}

// Sessions allocate and free their buffers from several goroutines at once: each keeps a few
// live buffers filled with its own byte and checks them before freeing.
func TestAllocSlabsConcurrent(t *testing.T) {
	before := allocSlabs()
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fill := byte(g + 1)
			var held []*Buffer
			for i := range 300 {
				b, err := Alloc(256<<10 + (i*7919+g*104729)%(1<<20))
				if err != nil {
					errs <- err.Error()
					return
				}
				p := unsafe.Slice((*byte)(b.Ptr()), b.Bytes())
				if p[0] != 0 || p[len(p)-1] != 0 {
					errs <- "a new buffer is not zeroed"
					return
				}
				for j := range p {
					p[j] = fill
				}
				held = append(held, b)
				if len(held) > 3 {
					old := held[0]
					q := unsafe.Slice((*byte)(old.Ptr()), old.Bytes())
					if q[0] != fill || q[len(q)/2] != fill || q[len(q)-1] != fill {
						errs <- "a live buffer was overwritten by another goroutine's"
						return
					}
					old.Free()
					held = held[1:]
				}
			}
			for _, b := range held {
				b.Free()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if got := allocSlabs(); got != before {
		t.Errorf("%d slabs after every buffer was freed, want %d", got, before)
	}
}

// TestLastRunLeavesOutTheWait: a plan's LastRun is its own run, not the time Execute waited
// for the context while another caller had it (what a run costs that context's other users).
func TestLastRunLeavesOutTheWait(t *testing.T) {
	ctx := newCtx(t, 1)
	defer ctx.Close()
	buf, err := Alloc(4 * 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	p, err := NewPlan([]Node{{Op: OpUnary, Src: []int{0}, Dst: 0, IP: [8]int64{UReLU}}}, []Tensor{tensorOf(buf, 1024)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free()
	const hold = 50 * time.Millisecond
	ctx.mu.Lock() // another caller has the context
	done := make(chan time.Duration)
	go func() {
		t0 := time.Now()
		if err := ctx.Execute(p); err != nil {
			t.Error(err)
		}
		done <- time.Since(t0)
	}()
	time.Sleep(hold)
	ctx.mu.Unlock()
	wall := <-done
	if wall < hold || p.LastRun() <= 0 || p.LastRun() >= hold {
		t.Errorf("Execute took %v (waiting %v for the context), LastRun %v: want more than 0 and less than the wait", wall, hold, p.LastRun())
	}
}
