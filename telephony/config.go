package telephony

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/voxpipe/voxpipe/stream"
)

// Modes of a call.
const (
	ModeVC  = "vc"  // the caller's voice, converted, goes back into the call
	ModeTTS = "tts" // text to speech into the call
)

// callConfig is what a call runs. It comes from the URL's query and then from the start
// message's customParameters, which win (Twilio drops a <Stream> URL's query string, so
// its calls can only use customParameters).
type callConfig struct {
	mode      string
	voice     string // vc: a live voice (dsp, meanvc2…); tts: a voice library id or name
	ref       string // vc: the target voice of a voice that takes one
	model     string // tts: the model ("" when one is loaded)
	text      string // tts: a greeting spoken when the call starts
	seed      uint64
	maxTokens int
	params    map[string]float64 // vc: the voice's parameters (pitch_semitones…)
	token     string             // the API key, when it comes as a custom parameter
	// raw protocol only: encoding (mulaw or pcm_s16le) and sample rate.
	encoding string
	rate     int
	wide     bool // the encoding was named slin16: 16 kHz unless sample_rate says otherwise
}

// reserved names are not voice parameters.
var reserved = []string{"token", "mode", "voice", "ref", "model", "text", "seed", "max_tokens", "encoding", "sample_rate"}

// queryParams flattens a URL query (the first value of each name).
func queryParams(q url.Values) map[string]string {
	out := make(map[string]string, len(q))
	for k, vs := range q {
		if len(vs) > 0 {
			out[k] = vs[0]
		}
	}
	return out
}

// apply sets the parameters in kv on c.
func (c *callConfig) apply(kv map[string]string) error {
	if len(kv) > maxParams {
		return fmt.Errorf("more than %d parameters", maxParams)
	}
	for k, v := range kv {
		if len(v) > 4*MaxSpeakText || !utf8.ValidString(v) {
			return fmt.Errorf("parameter %q is too long or not UTF-8", trunc(k, 40))
		}
		switch k {
		case "token":
			c.token = v
		case "mode":
			if v != ModeVC && v != ModeTTS {
				return fmt.Errorf("mode %q: use vc or tts", trunc(v, 40))
			}
			c.mode = v
		case "voice":
			c.voice = v
		case "ref":
			c.ref = v
		case "model":
			c.model = v
		case "text":
			if n := utf8.RuneCountInString(v); n > MaxSpeakText {
				return fmt.Errorf("text has %d characters; the limit is %d", n, MaxSpeakText)
			}
			c.text = v
		case "seed":
			s, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return fmt.Errorf("seed %q: want an unsigned integer", trunc(v, 40))
			}
			c.seed = s
		case "max_tokens":
			n, err := strconv.Atoi(v)
			if err != nil || stream.CheckSynthOptions(0, n) != nil {
				return fmt.Errorf("max_tokens %q: use 0 (the model's default) to %d", trunc(v, 40), stream.MaxTokensLimit)
			}
			c.maxTokens = n
		case "encoding":
			switch v {
			case "mulaw", "ulaw":
				c.encoding = "mulaw"
			case "pcm_s16le", "slin":
				c.encoding = "pcm_s16le"
			case "slin16": // Asterisk's name for 16 kHz signed linear
				c.encoding, c.wide = "pcm_s16le", true
			default:
				return fmt.Errorf("encoding %q: use mulaw or pcm_s16le", trunc(v, 40))
			}
		case "sample_rate":
			r, err := strconv.Atoi(v)
			if err != nil || (r != 8000 && r != 16000) {
				return fmt.Errorf("sample_rate %q: use 8000 or 16000", trunc(v, 40))
			}
			c.rate = r
		default:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
				return fmt.Errorf("parameter %q is not a number (a voice parameter, e.g. pitch_semitones=4)", trunc(k, 40))
			}
			if c.params == nil {
				c.params = map[string]float64{}
			}
			c.params[k] = x
		}
	}
	return nil
}

// check validates the combination once every source has been applied, filling defaults.
func (c *callConfig) check(raw bool) error {
	if c.mode == "" {
		c.mode = ModeVC
	}
	switch c.mode {
	case ModeVC:
		if c.text != "" || c.model != "" {
			return fmt.Errorf("text and model are for mode=tts")
		}
	case ModeTTS:
		if len(c.params) > 0 {
			names := make([]string, 0, len(c.params))
			for k := range c.params {
				names = append(names, k)
			}
			slices.Sort(names)
			return fmt.Errorf("mode=tts takes no voice parameters (got %q)", trunc(names[0], 40))
		}
		if c.ref != "" {
			return fmt.Errorf("ref is for mode=vc")
		}
	}
	if !raw {
		if c.encoding != "" || c.rate != 0 {
			return fmt.Errorf("encoding and sample_rate are for the raw protocol: Twilio's media are 8 kHz μ-law")
		}
		c.encoding, c.rate = "mulaw", 8000
		return nil
	}
	if c.encoding == "" {
		c.encoding = "mulaw"
	}
	if c.rate == 0 {
		c.rate = 8000
		if c.wide {
			c.rate = 16000
		}
	}
	if c.encoding == "mulaw" && c.rate != 8000 {
		return fmt.Errorf("μ-law is 8000 Hz")
	}
	return nil
}
