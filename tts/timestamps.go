package tts

import (
	"math"
	"strings"
	"time"
	"unicode"
)

// WordTimestamps are the words of a piece of text with their estimated start and end in
// seconds from the start of the context's audio (the layout Cartesia's add_timestamps uses).
type WordTimestamps struct {
	Words []string  `json:"words"`
	Start []float64 `json:"start"`
	End   []float64 `json:"end"`
}

// envFrame is the hop of the energy envelope the timer keeps: 10 ms.
const envFrame = 10 * time.Millisecond

// wordTimer estimates when each word of a piece of text is spoken. MioTTS writes speech
// tokens with no alignment to the text, so the estimate comes from the audio itself: the
// piece's voiced span (from its first to its last frame above a floor relative to its
// loudest) is shared among the words in proportion to their letters, with a pause after
// punctuation. It keeps a 10 ms energy envelope, not the audio, so a long text costs 100
// floats a second.
type wordTimer struct {
	rate    int
	hop     int       // samples per envelope frame
	env     []float32 // mean square per frame
	acc     float64
	accN    int
	samples int           // the current piece's
	base    time.Duration // the current piece's start in the context's audio
}

func newWordTimer(rate int) *wordTimer {
	return &wordTimer{rate: rate, hop: max(1, int(time.Duration(rate)*envFrame/time.Second))}
}

// add takes the next samples of the current piece.
func (w *wordTimer) add(samples []float32) {
	w.samples += len(samples)
	for _, x := range samples {
		w.acc += float64(x) * float64(x)
		if w.accN++; w.accN == w.hop {
			w.env = append(w.env, float32(w.acc/float64(w.hop)))
			w.acc, w.accN = 0, 0
		}
	}
}

// piece ends the current piece: it returns the timing of text's words over the audio added
// since the last call, and starts the next piece where this one's audio ended.
func (w *wordTimer) piece(text string) WordTimestamps {
	if w.accN > 0 {
		w.env = append(w.env, float32(w.acc/float64(w.accN)))
	}
	length := time.Duration(w.samples) * time.Second / time.Duration(w.rate)
	from, to := voicedSpan(w.env)
	ts := spreadWords(text, w.base+time.Duration(from)*envFrame, w.base+min(time.Duration(to)*envFrame, length))
	w.base += length
	w.env, w.acc, w.accN, w.samples = w.env[:0], 0, 0, 0
	return ts
}

// voicedSpan returns the frames [from, to) between the first and the last frame within
// 40 dB of the loudest; all of them when the audio is silent.
func voicedSpan(env []float32) (from, to int) {
	var peak float32
	for _, e := range env {
		peak = max(peak, e)
	}
	if peak == 0 {
		return 0, len(env)
	}
	floor := peak * 1e-4 // 40 dB below, in power
	from, to = 0, len(env)
	for from < to && env[from] < floor {
		from++
	}
	for to > from && env[to-1] < floor {
		to--
	}
	return from, to
}

// spreadWords splits text into words and shares [from, to) among them by weight: a word
// weighs its letters and digits (at least one), and punctuation after it adds a pause that
// belongs to no word.
func spreadWords(text string, from, to time.Duration) WordTimestamps {
	fields := strings.Fields(text)
	ts := WordTimestamps{Words: []string{}, Start: []float64{}, End: []float64{}}
	var words []string
	var speak, pause []float64
	var total float64
	for _, f := range fields {
		letters := 0
		for _, r := range f {
			if unicode.IsLetter(r) || unicode.IsDigit(r) {
				letters++
			}
		}
		if letters == 0 { // a lone dash or ellipsis: a pause after the previous word
			if n := len(pause); n > 0 {
				pause[n-1] += 2
				total += 2
			}
			continue
		}
		p := 0.0
		switch end := strings.TrimRightFunc(f, func(r rune) bool { return strings.ContainsRune(`"')»”’`, r) }); end[len(end)-1:] {
		case ",", ";", ":":
			p = 2
		case ".", "!", "?":
			p = 4
		}
		words = append(words, f)
		speak = append(speak, float64(letters))
		pause = append(pause, p)
		total += float64(letters) + p
	}
	if len(words) == 0 {
		return ts
	}
	total -= pause[len(pause)-1] // the span ends with the last word's sound
	span := max(0, (to - from).Seconds())
	at := from.Seconds()
	for i, word := range words {
		d := span * speak[i] / total
		ts.Words = append(ts.Words, word)
		ts.Start = append(ts.Start, round3(at))
		ts.End = append(ts.End, round3(at+d))
		at += d + span*pause[i]/total
	}
	return ts
}

func round3(s float64) float64 { return math.Round(s*1000) / 1000 }
