package buffers

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestFIFO(t *testing.T) {
	f := NewFIFO(4)
	f.Write([]float32{1, 2, 3})
	f.Write([]float32{4, 5, 6}) // grows
	dst := make([]float32, 4)
	if n := f.Read(dst); n != 4 || dst[0] != 1 || dst[3] != 4 {
		t.Fatalf("read %d %v", n, dst)
	}
	f.Write([]float32{7})
	if got := f.Peek(); len(got) != 3 || got[0] != 5 || got[2] != 7 {
		t.Fatalf("peek %v", got)
	}
	if n := f.Discard(10); n != 3 || f.Len() != 0 {
		t.Fatalf("discard %d, len %d", n, f.Len())
	}
}

func TestFIFOSteadyStateDoesNotAllocate(t *testing.T) {
	f := NewFIFO(2048)
	in, out := make([]float32, 960), make([]float32, 960)
	allocs := testing.AllocsPerRun(100, func() {
		f.Write(in)
		f.Read(out)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per write+read", allocs)
	}
}

func TestFIFODiscardCrossfadeIsSmooth(t *testing.T) {
	f := NewFIFO(100)
	x := make([]float32, 100)
	for i := range x {
		x[i] = 1
		if i >= 40 {
			x[i] = -1 // a jump the crossfade has to bridge
		}
	}
	f.Write(x)
	f.DiscardCrossfade(40, 10)
	q := f.Peek()
	for i := 1; i < 10; i++ {
		if d := q[i] - q[i-1]; d > 0.25 || d < -0.25 {
			t.Fatalf("step %d: jump %.2f in the crossfade", i, d)
		}
	}
	if q[0] < 0.8 || q[len(q)-1] != -1 {
		t.Fatalf("crossfade should start near the dropped audio and end on the kept audio: %v", q[:12])
	}
}

// feed pushes packets seq.. with the given arrival offsets (ms) relative to t0.
func pkt(j *JitterBuffer, seq uint16, t0 time.Time, arriveMs float64) {
	j.Push(seq, uint32(seq)*960, 48000, []byte{byte(seq)}, t0.Add(time.Duration(arriveMs*float64(time.Millisecond))))
}

func TestJitterReordersAndDetectsLoss(t *testing.T) {
	j := NewJitterBuffer(JitterConfig{Target: 40 * time.Millisecond})
	t0 := time.Now()
	pkt(j, 10, t0, 0)
	pkt(j, 12, t0, 1) // 11 arrives late, after 12
	pkt(j, 11, t0, 2)
	pkt(j, 14, t0, 3) // 13 is lost
	pkt(j, 15, t0, 4)
	var kinds []FrameKind
	var payloads []byte
	for i := 0; i < 6; i++ {
		f := j.Pop(t0.Add(time.Duration(40+20*i) * time.Millisecond))
		kinds = append(kinds, f.Kind)
		if f.Kind == Packet {
			payloads = append(payloads, f.Payload[0])
		}
		if f.Kind == Lost && (f.Next == nil || f.Next[0] != 14) {
			t.Fatalf("lost frame without the next packet for FEC: %+v", f)
		}
	}
	want := []FrameKind{Packet, Packet, Packet, Lost, Packet, Packet}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("kinds %v, want %v", kinds, want)
		}
	}
	if string(payloads) != string([]byte{10, 11, 12, 14, 15}) {
		t.Fatalf("payload order %v", payloads)
	}
	if s := j.Stats(); s.Lost != 1 || s.Received != 5 {
		t.Fatalf("stats %+v", s)
	}
	pkt(j, 9, t0, 200) // far too late
	if s := j.Stats(); s.Late != 1 {
		t.Fatalf("late packet not counted: %+v", s)
	}
}

func TestJitterSequenceWraps(t *testing.T) {
	j := NewJitterBuffer(JitterConfig{Target: 20 * time.Millisecond})
	t0 := time.Now()
	got := 0
	for i := 0; i < 10; i++ {
		seq := uint16(65530 + i)
		pkt(j, seq, t0, float64(20*i))
		if f := j.Pop(t0.Add(time.Duration(20*i+5) * time.Millisecond)); f.Kind == Packet {
			if f.Payload[0] != byte(seq) {
				t.Fatalf("wrong packet across wrap: %d", f.Payload[0])
			}
			got++
		}
	}
	if got != 10 {
		t.Fatalf("played %d of 10 packets across the sequence wrap", got)
	}
}

// TestJitterAdaptsAndStaysBounded drives the buffer with a steady sender whose packets
// carry random delay and checks that the delay settles near the jitter, never growing without
// bound, and that excess delay is shed.
func TestJitterAdaptsAndStaysBounded(t *testing.T) {
	for _, jitterMs := range []float64{1, 15, 60} {
		j := NewJitterBuffer(JitterConfig{})
		rng := rand.New(rand.NewPCG(1, 2))
		t0 := time.Now()
		type arrival struct {
			seq uint16
			at  float64
		}
		var queue []arrival
		for i := 0; i < 1000; i++ {
			queue = append(queue, arrival{uint16(i), float64(20*i) + rng.Float64()*jitterMs})
		}
		var waits []time.Duration
		played, underflows := 0, 0
		next := 0
		for tick := 0; tick < 1000; tick++ {
			now := float64(20*tick) + 7 // playout clock with its own phase
			for next < len(queue) && queue[next].at <= now {
				pkt(j, queue[next].seq, t0, queue[next].at)
				next++
			}
			f := j.Pop(t0.Add(time.Duration(now * float64(time.Millisecond))))
			switch f.Kind {
			case Packet:
				played++
				if tick > 500 {
					waits = append(waits, f.Wait)
				}
			case Empty:
				if tick > 10 {
					underflows++
				}
			}
		}
		var maxWait time.Duration
		for _, w := range waits {
			maxWait = max(maxWait, w)
		}
		st := j.Stats()
		t.Logf("jitter %2.0f ms: target %v, max wait %v, underflows %d, shed %d", jitterMs, st.Target, maxWait, underflows, st.Shed)
		if maxWait > time.Duration(jitterMs+50)*time.Millisecond {
			t.Errorf("jitter %.0f ms: packets waited up to %v: delay not bounded by the jitter", jitterMs, maxWait)
		}
		if underflows > 20 {
			t.Errorf("jitter %.0f ms: %d underflows in 20 s", jitterMs, underflows)
		}
		if played < 900 {
			t.Errorf("jitter %.0f ms: played only %d of 1000", jitterMs, played)
		}
	}
}

func TestJitterShedsBacklog(t *testing.T) {
	j := NewJitterBuffer(JitterConfig{Target: 20 * time.Millisecond})
	t0 := time.Now()
	// A burst of 10 packets at once (a stall upstream), then a steady stream.
	for i := 0; i < 10; i++ {
		pkt(j, uint16(i), t0, 0)
	}
	for tick := 0; tick < 200; tick++ {
		now := float64(20 * tick)
		if tick > 0 {
			pkt(j, uint16(9+tick), t0, now-1)
		}
		j.Pop(t0.Add(time.Duration(now * float64(time.Millisecond))))
	}
	st := j.Stats()
	if st.Shed == 0 || st.Depth > 3 {
		t.Fatalf("backlog of 10 frames not shed: %+v", st)
	}
}
