package rtcclient

import (
	"math"
	"slices"
	"time"
)

// ClickTrain returns seconds of 48 kHz audio with a short click about every period (spacing
// varied by ±20% so no lag is ambiguous): a 2 ms Hann-windowed 3 kHz burst, sharp enough to
// locate within a sample or two after two Opus hops.
func ClickTrain(seconds float64, period time.Duration) (pcm []float32, clicks []int) {
	n := int(seconds * rate)
	pcm = make([]float32, n)
	step := int(period.Seconds() * rate)
	burst := rate * 2 / 1000
	for k, at := 0, step/2; at+burst < n; k, at = k+1, at+step*(8+(k*7)%5)/10 {
		for i := 0; i < burst; i++ {
			w := 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(burst-1))
			pcm[at+i] = float32(0.8 * w * math.Sin(2*math.Pi*3000*float64(i)/rate))
		}
		clicks = append(clicks, at)
	}
	return pcm, clicks
}

// ClickLatencies finds each sent click in the received audio by cross-correlation and
// returns, per click found, the time from its capture to its arrival back. A frame sent at
// time T holds the audio captured during the 20 ms before T; a received sample is playable
// when its packet arrives.
func ClickLatencies(sent []float32, clicks []int, sendTimes []time.Time, got Received) []time.Duration {
	if len(sendTimes) == 0 || len(got.PCM) == 0 {
		return nil
	}
	burst := rate * 2 / 1000
	// Global lag first: correlate the whole click train at a coarse resolution.
	// The server sends from the moment it connects, so the received stream may start long
	// before the first frame was sent: search from the audio that arrived after it.
	base := len(got.PCM)
	for _, p := range got.Packets {
		if !p.At.Before(sendTimes[0]) {
			base = p.Start
			break
		}
	}
	lag := bestLag(sent, got.PCM, base, base+rate/2) // latency is under 500 ms
	var out []time.Duration
	for _, at := range clicks {
		k := at / frameSize
		if k >= len(sendTimes) {
			break
		}
		captured := sendTimes[k].Add(-frameDur).Add(samples(at - k*frameSize))
		// Refine around the global lag (±60 ms): the click is where the short-time energy
		// peaks. Energy, not waveform: two Opus hops keep a click's energy, not its phase.
		j, snr := energyPeak(got.PCM, at+lag-rate*60/1000, at+lag+rate*60/1000, burst)
		if snr < 10 {
			continue // lost in transit or buried in noise
		}
		p := packetAt(got.Packets, j)
		if p < 0 {
			continue
		}
		played := got.Packets[p].At.Add(samples(j - got.Packets[p].Start))
		out = append(out, played.Sub(captured))
	}
	return out
}

func samples(n int) time.Duration { return time.Duration(n) * time.Second / rate }

// bestLag is the shift of got against sent with the highest correlation of envelopes,
// searched over [lo, hi] samples with a 1 ms envelope.
func bestLag(sent, got []float32, lo, hi int) int {
	const hop = rate / 1000
	env := func(x []float32) []float64 {
		e := make([]float64, len(x)/hop)
		for i := range e {
			for _, v := range x[i*hop : (i+1)*hop] {
				e[i] += float64(v * v)
			}
		}
		return e
	}
	a, b := env(sent), env(got)
	best, bestScore := 0, math.Inf(-1)
	for l := lo / hop; l <= hi/hop && l < len(b); l++ {
		s := 0.0
		for i := range a {
			if i+l >= 0 && i+l < len(b) {
				s += a[i] * b[i+l]
			}
		}
		if s > bestScore {
			best, bestScore = l, s
		}
	}
	return best * hop
}

// energyPeak returns the start of the width-sample window with the most energy in [lo, hi]
// and how far that energy stands above the median window's.
func energyPeak(x []float32, lo, hi, width int) (int, float64) {
	lo, hi = max(lo, 0), min(hi, len(x)-width)
	if hi <= lo {
		return -1, 0
	}
	var e float64
	for _, v := range x[lo : lo+width] {
		e += float64(v * v)
	}
	energies := make([]float64, 0, hi-lo+1)
	best, bestE := lo, e
	for j := lo; ; j++ {
		energies = append(energies, e)
		if e > bestE {
			best, bestE = j, e
		}
		if j == hi {
			break
		}
		e += float64(x[j+width]*x[j+width]) - float64(x[j]*x[j])
	}
	slices.Sort(energies)
	return best, bestE / (energies[len(energies)/2] + 1e-12)
}

func packetAt(ps []ReceivedPacket, j int) int {
	i, _ := slices.BinarySearchFunc(ps, j, func(p ReceivedPacket, j int) int {
		switch {
		case p.Start+p.N <= j:
			return -1
		case p.Start > j:
			return 1
		}
		return 0
	})
	if i < len(ps) && ps[i].Start <= j && j < ps[i].Start+ps[i].N {
		return i
	}
	return -1
}

// Percentile returns the p-th percentile (0–100) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Round(p/100*float64(len(s)-1))))]
}
