package miocodec

import (
	"fmt"
	"sync/atomic"
)

// The streams of a Decoder decode their windows through its batch queue (internal/batcher):
// a window that finds the decoder idle runs at once, alone; windows of the same geometry
// that come due while a run is in progress — every stream's steady windows have the same
// length and statistics split — run together as one program, which reads each weight once
// for all of them and keeps every stream's rows apart, so that each stream gets the samples
// it gets alone.

// MaxBatch is the most windows one decode program takes.
const MaxBatch = 8

// BatchStats are the decode runs of a Decoder's streams since load and the windows they held
// (Windows/Runs is the mean batch size).
type BatchStats struct {
	Runs, Windows int64
}

// batchCounts are a Decoder's BatchStats.
type batchCounts struct {
	runs, windows atomic.Int64
}

// BatchStats reports how the decoder's streams shared decode runs.
func (d *Decoder) BatchStats() BatchStats {
	return BatchStats{Runs: d.counts.runs.Load(), Windows: d.counts.windows.Load()}
}

// SetBatchLimit sets the most stream windows one run decodes (1: no batching; n ≤ 0 or
// > MaxBatch: MaxBatch, the default). For comparisons: the samples are the same.
func (d *Decoder) SetBatchLimit(n int) { d.queue.SetLimit(n) }

// decodeQueued decodes w (plan pl) in a batch with the other streams' windows of that plan
// (frozen statistics, a test mode, run alone).
func (d *Decoder) decodeQueued(pl plan, w *window) error {
	if pl.gn == gnFrozen {
		return d.runWindows(pl, []*window{w})
	}
	w.pl = pl
	d.queue.Do(pl, w)
	return w.err
}

// runQueued runs one batch of windows of one plan. A batch that fails runs again a window
// at a time (a failed run changes no stream), so one stream's failure is its own.
func (d *Decoder) runQueued(ws []*window) {
	d.counts.runs.Add(1)
	d.counts.windows.Add(int64(len(ws)))
	err := d.runGuarded(ws)
	if err == nil || len(ws) == 1 {
		for _, w := range ws {
			w.err = err
		}
		return
	}
	for _, w := range ws {
		w.err = d.runGuarded([]*window{w})
	}
}

// runGuarded is runWindows with a panic turned into the batch's error: the queue's runs may
// be on a goroutine of their own, outside any request's guard.
func (d *Decoder) runGuarded(ws []*window) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("miocodec: panic in a decode run: %v", p)
		}
	}()
	return d.runWindows(ws[0].pl, ws)
}
