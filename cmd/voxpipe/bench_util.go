package main

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/voxpipe/voxpipe/engine"
)

// medianRun runs a compiled program n times and returns the median wall time of one run.
func medianRun(p engine.Program, n int) (time.Duration, error) {
	times := make([]time.Duration, n)
	for i := range times {
		t0 := time.Now()
		if err := p.Run(); err != nil {
			return 0, err
		}
		times[i] = time.Since(t0)
	}
	slices.Sort(times)
	return times[n/2], nil
}

// profiler prints where a bench's timed part spends its time, by kind of engine op (--profile);
// a nil profiler does nothing.
type profiler struct {
	be  engine.Profiler
	out io.Writer
	t0  time.Time
}

// newProfiler must come before the model is loaded: a GPU backend times only the programs
// compiled after it asks for timestamps.
func newProfiler(on bool, be engine.Backend, out io.Writer) (*profiler, error) {
	if !on {
		return nil, nil
	}
	p, ok := be.(engine.Profiler)
	if !ok {
		return nil, fmt.Errorf("--profile: %s cannot time its nodes", be.Name())
	}
	if v, ok := be.(*engine.Vulkan); ok {
		v.EnableTimestamps()
	}
	return &profiler{be: p, out: out}, nil
}

func (p *profiler) start() {
	if p != nil {
		p.be.StartProfile()
		p.t0 = time.Now()
	}
}

// stop prints each kind of op's time and share of the wall time since start, most first; the
// rest is time outside the engine's programs (Go code, waiting).
func (p *profiler) stop(what string) {
	if p == nil {
		return
	}
	wall := time.Since(p.t0)
	ops, shapes := p.be.StopProfile()
	var inOps time.Duration
	for _, o := range ops {
		inOps += o.Time
	}
	fmt.Fprintf(p.out, "profile of %s: %.1f ms wall, %.1f ms in engine ops\n", what, ms(wall), ms(inOps))
	fmt.Fprintf(p.out, "  %-16s %8s %10s %7s %10s\n", "op", "calls", "ms", "share", "µs/call")
	for _, o := range ops {
		fmt.Fprintf(p.out, "  %-16s %8d %10.2f %6.1f%% %10.2f\n", o.Op, o.Calls, ms(o.Time), 100*o.Time.Seconds()/wall.Seconds(),
			float64(o.Time.Microseconds())/float64(o.Calls))
	}
	fmt.Fprintf(p.out, "  %-16s %8s %10.2f %6.1f%%\n", "(outside ops)", "", ms(wall-inOps), 100*(wall-inOps).Seconds()/wall.Seconds())
	fmt.Fprintf(p.out, "  the %d costliest nodes by op and operand shapes:\n", min(profileTopShapes, len(shapes)))
	for _, s := range shapes[:min(profileTopShapes, len(shapes))] {
		fmt.Fprintf(p.out, "  %-16s %8d %10.2f %6.1f%% %10.2f  %v %v\n", s.Op, s.Calls, ms(s.Time), 100*s.Time.Seconds()/wall.Seconds(),
			float64(s.Time.Microseconds())/float64(s.Calls), s.In0, s.In1)
	}
}

// profileTopShapes is how many op-and-shape rows --profile prints.
const profileTopShapes = 20

// deviceMB sums the GPU memory the distinct backends among bes hold now and at their peak
// (0 for CPU backends, whose memory is the process's).
func deviceMB(bes ...engine.Backend) (inUse, peak float64) {
	seen := map[engine.Backend]bool{}
	for _, be := range bes {
		m, ok := be.(engine.MemoryReporter)
		if !ok || seen[be] {
			continue
		}
		seen[be] = true
		d, h := m.MemoryInUse()
		inUse += float64(d+h) / (1 << 20)
		peak += float64(m.MemoryPeak()) / (1 << 20)
	}
	return inUse, peak
}

// sampleDeviceMB samples the GPU memory the backends hold every 5 ms until the returned
// function is called, which gives the most seen (MB; 0 on the CPU): a level's memory with all
// its sessions open.
func sampleDeviceMB(bes ...engine.Backend) func() float64 {
	var most float64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			now, _ := deviceMB(bes...)
			most = max(most, now)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(done)
		<-stopped
		return most
	}
}

const fuseUsage = "fold elementwise chains into the Linear or LayerNorm before them on the CPU (false: every node on its own, for comparison)"

// setFusion applies --fuse to the CPU backends among bes (before any program is compiled).
func setFusion(on bool, bes ...engine.Backend) {
	for _, b := range bes {
		if c, ok := b.(*engine.CPU); ok {
			c.SetFusion(on)
		}
	}
}
