package main

import (
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
