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
	lag := bestLag(sent, got.PCM, 0, rate/2) // latency is under 500 ms
	var out []time.Duration
	for _, at := range clicks {
		k := at / frameSize
		if k >= len(sendTimes) {
			break
		}
		captured := sendTimes[k].Add(-frameDur).Add(samples(at - k*frameSize))
		// Refine around the global lag: ±60 ms.
		lo, hi := at+lag-rate*60/1000, at+lag+rate*60/1000
		j, score := bestMatch(sent[at:at+burst], got.PCM, lo, hi)
		if score < 0.5 {
			continue // lost in transit or mangled past recognition
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

// bestMatch finds where template fits best in x within [lo, hi] by normalised
// cross-correlation, returning the position and the score (−1…1).
func bestMatch(template, x []float32, lo, hi int) (int, float64) {
	lo = max(lo, 0)
	hi = min(hi, len(x)-len(template))
	var tt float64
	for _, v := range template {
		tt += float64(v * v)
	}
	best, bestScore := -1, -1.0
	for j := lo; j <= hi; j++ {
		var xt, xx float64
		for i, v := range template {
			xt += float64(v * x[j+i])
			xx += float64(x[j+i] * x[j+i])
		}
		if xx == 0 {
			continue
		}
		if s := xt / math.Sqrt(tt*xx); s > bestScore {
			best, bestScore = j, s
		}
	}
	return best, bestScore
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
