package meanvc2

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/batcher"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/vocos"
)

// The streams of a Model run their model work through its batch queue (internal/batcher):
// an ASR window, or a DiT step with its vocoder step, is a job. A job that finds the model
// idle runs at once, alone; jobs that arrive while a batch runs are batched with the queued
// jobs of the same kind and shape — a power of two of them, up to MaxBatch, so that five
// program sizes serve every batch: one program per stage reads each weight once for all of
// them, and each stream's results are bit for bit those it gets alone (the batched programs
// keep every stream's rows apart, see DiT.DenoiseBatch, conformer.ForwardBatch and
// vocos.PushBatch). The programs of each batch size are compiled when the open streams
// first reach it (NewStream), not in a stream's step.

type jobKind uint8

const (
	asrJob  jobKind = iota // one ASR window: frames at offset → bn
	stepJob                // one DiT step on x0, cond → mel, then the vocoder on it → wav
)

// job is one stream's request; a Stream has at most one in flight, so it reuses its own.
type job struct {
	kind jobKind
	key  int // jobs batch only with jobs of the same kind and key (ASR: frames; a traced step: −1, alone)
	s    *Stream

	frames []float32 // asrJob
	offset int
	bn     []float32

	x0, cond []float32 // stepJob
	target   Timbre
	mel, wav []float32
	ditErr   bool // err came from the DiT (else the vocoder)

	share time.Duration // the job's part of its batch's run time

	err error
}

// batchKey is what jobs must share to run in one batch: their kind and shape; a job with
// alone set batches with no other.
type batchKey struct {
	kind  jobKind
	key   int
	alone *job
}

// batchState is how a Model batches its streams' jobs.
type batchState struct {
	queue  *batcher.Queue[batchKey, *job]
	open   int // streams open (NewStream − Close), under the model's exec lock
	warmed int // the largest batch size whose programs warm compiled

	// Batch statistics: batches run and jobs in them, by kind; time spent running them.
	batches, jobs [2]atomic.Int64
	busy          atomic.Int64 // ns
}

// A stream's request waits for the batch that is running, then runs in one with other
// streams' requests, so its wall time is not what it costs. Its cost is its part of its
// batch's run time on the cores a run occupies; the rest is Overcharge, which the scheduler
// takes off the step that made the request when it measures load and learns the voice's cost.

// Overcharge is the total by which this stream's model requests took more wall time than
// their own work cost the cores: waiting for other streams' batches and running their rows,
// less the cores beyond one that the batch ran on (negative when that is the larger).
func (s *Stream) Overcharge() time.Duration { return time.Duration(s.overcharge.Load()) }

// coresHeld is how many cores a program run on b occupies: the thread pool of a CPU
// backend (up to the cores there are); one for a GPU's, the host thread that drives it
// (the device's own saturation shows in the runs' wall time).
func coresHeld(b engine.Backend) int {
	if t, ok := b.(interface{ Threads() int }); ok {
		return min(runtime.GOMAXPROCS(0), max(t.Threads(), 1))
	}
	return 1
}

// BatchStats reports how the model's streams shared programs since load: batches run and
// the jobs (stream requests) they held, for ASR windows and DiT+vocoder steps.
type BatchStats struct {
	ASRBatches, ASRWindows int64
	StepBatches, Steps     int64
	Busy                   time.Duration // running batches (the model's programs and the host work between them)
}

// BatchStats: see the type.
func (m *Model) BatchStats() BatchStats {
	b := &m.batch
	return BatchStats{ASRBatches: b.batches[asrJob].Load(), ASRWindows: b.jobs[asrJob].Load(),
		StepBatches: b.batches[stepJob].Load(), Steps: b.jobs[stepJob].Load(), Busy: time.Duration(b.busy.Load())}
}

// SetBatchLimit sets the most stream requests one batched program takes (1: no batching;
// n ≤ 0 or > MaxBatch: MaxBatch, the default). For comparisons: the outputs are the same.
func (m *Model) SetBatchLimit(n int) { m.batch.queue.SetLimit(n) }

// run queues j and returns once it has run (in a batch with other streams' jobs like it).
func (m *Model) run(j *job) error {
	k := batchKey{kind: j.kind, key: j.key}
	if j.key < 0 {
		k.alone = j
	}
	t0 := time.Now()
	m.batch.queue.Do(k, j)
	j.s.overcharge.Add(int64(time.Since(t0) - j.share*time.Duration(m.holds)))
	return j.err
}

// runBatch runs one batch of jobs of one kind and shape.
func (m *Model) runBatch(batch []*job) {
	b := &m.batch
	kind := batch[0].kind
	b.batches[kind].Add(1)
	b.jobs[kind].Add(int64(len(batch)))
	for _, j := range batch {
		j.err, j.ditErr = nil, false
	}
	t0 := time.Now()
	m.runJobs(batch)
	took := time.Since(t0)
	b.busy.Add(int64(took))
	for _, j := range batch {
		j.share = took / time.Duration(len(batch))
	}
}

// warm compiles the programs of a batch of n streams in the steady state (an ASR window, a
// DiT step, a vocoder step with its overlap frames) when n is a batch size not seen yet, so
// that the first batch of that size does not stall its streams on compiling. m.exec is held.
func (m *Model) warm(n int) error {
	b := &m.batch
	if n > MaxBatch || batcher.Size(n) != n || n <= b.warmed {
		return nil
	}
	if err := m.ASR.Warm(m.ASR.Config.Stream.Window, n); err != nil {
		return err
	}
	if err := m.DiT.warm(n); err != nil {
		return err
	}
	if err := m.Vocoder.Warm(m.Vocoder.Config.Overlap+m.Config.ChunkSize, n); err != nil {
		return err
	}
	b.warmed = n
	return nil
}

// runJobs runs one batch of jobs of one kind and records each job's result. A panic fails
// every job of the batch that has no error yet (the streams are then unusable until Reset,
// as after any failed step).
func (m *Model) runJobs(batch []*job) {
	m.exec.Lock()
	defer m.exec.Unlock()
	inDiT := false
	defer func() {
		if p := recover(); p != nil {
			at := panicSite()
			for _, j := range batch {
				if j.err == nil {
					j.err, j.ditErr = fmt.Errorf("meanvc2: panic in a batched run at %s: %v", at, p), inDiT
				}
			}
		}
	}()
	if batch[0].kind == asrJob {
		tryBatch(batch, m.runASR)
		return
	}
	inDiT = true
	tryBatch(batch, m.runDiT)
	inDiT = false
	var ok []*job
	for _, j := range batch {
		if j.err == nil {
			ok = append(ok, j)
		} else {
			j.ditErr = true
		}
	}
	// The vocoder batches by window length (a stream's first window has no overlap frames).
	for len(ok) > 0 {
		f := ok[0].s.voc.Frames(len(ok[0].mel))
		var same, rest []*job
		for _, j := range ok {
			if j.s.voc.Frames(len(j.mel)) == f {
				same = append(same, j)
			} else {
				rest = append(rest, j)
			}
		}
		tryBatch(same, m.runVocoder)
		ok = rest
	}
}

// panicSite is where the panic being recovered was raised: the innermost frame outside
// the runtime, as file:line (the stack is gone once the error reaches a log).
func panicSite() string {
	pc := make([]uintptr, 32)
	frames := runtime.CallersFrames(pc[:runtime.Callers(3, pc)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			return fmt.Sprintf("%s:%d", filepath.Base(f.File), f.Line)
		}
		if !more {
			return "?"
		}
	}
}

// tryBatch runs jobs through run, which changes no stream when it fails; a batch that fails
// runs again a job at a time, so one stream's bad request fails only that stream.
func tryBatch(jobs []*job, run func([]*job) error) {
	err := run(jobs)
	if err == nil {
		return
	}
	if len(jobs) == 1 {
		jobs[0].err = err
		return
	}
	for _, j := range jobs {
		if err := run([]*job{j}); err != nil {
			j.err = err
		}
	}
}

func (m *Model) runASR(batch []*job) error {
	states, windows, offsets := make([]*conformer.State, len(batch)), make([][]float32, len(batch)), make([]int, len(batch))
	for i, j := range batch {
		states[i], windows[i], offsets[i] = j.s.asr, j.frames, j.offset
	}
	out, err := m.ASR.ForwardBatch(states, windows, offsets)
	if err != nil {
		return err
	}
	for i, j := range batch {
		j.bn = out[i]
	}
	return nil
}

func (m *Model) runDiT(batch []*job) error {
	states, x0s, conds, targets := make([]*State, len(batch)), make([][]float32, len(batch)), make([][]float32, len(batch)), make([]Timbre, len(batch))
	for i, j := range batch {
		states[i], x0s[i], conds[i], targets[i] = j.s.dit, j.x0, j.cond, j.target
	}
	mels, err := m.DiT.DenoiseBatch(states, x0s, conds, targets)
	if err != nil {
		return err
	}
	for i, j := range batch {
		j.mel = mels[i]
	}
	return nil
}

func (m *Model) runVocoder(batch []*job) error {
	streams, mels := make([]*vocos.Stream, len(batch)), make([][]float32, len(batch))
	for i, j := range batch {
		streams[i], mels[i] = j.s.voc, j.mel
	}
	wavs, err := m.Vocoder.PushBatch(streams, mels)
	if err != nil {
		return err
	}
	for i, j := range batch {
		j.wav = wavs[i]
	}
	return nil
}
