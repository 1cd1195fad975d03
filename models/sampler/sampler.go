// Package sampler picks the next token from a language model's logits: Hugging Face style
// repetition penalty, OpenAI style presence/frequency penalties, temperature, top-k, top-p
// and an inverse-CDF draw, or greedy argmax.
//
// One step, for logits l over the candidates and a history of token ids:
//
//  1. Penalties, once per DISTINCT candidate id in the history: repetition penalty r
//     (l·r if l < 0, else l/r), then l −= presence + frequency·count, where count is the
//     number of times the id occurs in the history.
//  2. Greedy (Temperature ≤ 0 or Greedy): the best candidate by the order of step 4.
//  3. Temperature: s = l / T.
//  4. Top-k: candidates sorted by s descending, ties broken by the smaller token id; the
//     first k are kept (k ≤ 0 or k ≥ n keeps all).
//  5. Softmax over the kept candidates in float64: p_i = exp(s_i − s_0) / Σ_j exp(s_j − s_0).
//  6. Top-p (0 < p < 1): with c_i the cumulative sums of p in that order, the first m
//     candidates are kept, m the smallest count with c_{m−1} ≥ p (the candidate that
//     crosses p is kept); the kept probabilities are renormalised to sum 1.
//  7. Draw: with C_i the cumulative sums of the renormalised probabilities and u uniform in
//     [0,1), the first i with u < C_i (the last kept candidate if none, by rounding).
//
// All arithmetic after reading the float32 logits is float64.
package sampler

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Config holds the sampling settings. The zero value is greedy decoding without penalties.
type Config struct {
	// Temperature divides the logits; ≤ 0 selects greedy decoding.
	Temperature float64
	// TopK keeps the K most likely candidates; ≤ 0 disables it.
	TopK int
	// TopP keeps the smallest prefix of the sorted candidates whose probability reaches P;
	// values outside (0, 1) disable it.
	TopP float64
	// RepetitionPenalty (Hugging Face semantics) divides positive and multiplies negative
	// logits of every candidate already in the history, once per distinct id; ≤ 0 or 1
	// disables it.
	RepetitionPenalty float64
	// PresencePenalty is subtracted once from the logit of every candidate in the history.
	PresencePenalty float64
	// FrequencyPenalty is subtracted from a candidate's logit once per occurrence in the
	// history.
	FrequencyPenalty float64
	// Seed seeds the random generator of Sample.
	Seed uint64
	// Greedy forces argmax decoding (generation_config.json do_sample false).
	Greedy bool
}

// DefaultConfig is the Hugging Face GenerationConfig default (greedy, temperature 1,
// top_k 50, top_p 1, no penalty).
func DefaultConfig() Config {
	return Config{Temperature: 1, TopK: 50, TopP: 1, RepetitionPenalty: 1, Greedy: true}
}

// ConfigFromGenerationJSON reads a Hugging Face generation_config.json. Keys it does not hold
// keep the DefaultConfig values (so do_sample absent means greedy); presence_penalty,
// frequency_penalty and seed are read when present. Unknown keys are ignored.
func ConfigFromGenerationJSON(data []byte) (Config, error) {
	c := DefaultConfig()
	var g struct {
		DoSample          *bool    `json:"do_sample"`
		Temperature       *float64 `json:"temperature"`
		TopK              *int     `json:"top_k"`
		TopP              *float64 `json:"top_p"`
		RepetitionPenalty *float64 `json:"repetition_penalty"`
		PresencePenalty   *float64 `json:"presence_penalty"`
		FrequencyPenalty  *float64 `json:"frequency_penalty"`
		Seed              *uint64  `json:"seed"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		return c, fmt.Errorf("sampler: generation_config.json: %w", err)
	}
	if g.DoSample != nil {
		c.Greedy = !*g.DoSample
	}
	if g.Temperature != nil {
		c.Temperature = *g.Temperature
	}
	if g.TopK != nil {
		c.TopK = *g.TopK
	}
	if g.TopP != nil {
		c.TopP = *g.TopP
	}
	if g.RepetitionPenalty != nil {
		c.RepetitionPenalty = *g.RepetitionPenalty
	}
	if g.PresencePenalty != nil {
		c.PresencePenalty = *g.PresencePenalty
	}
	if g.FrequencyPenalty != nil {
		c.FrequencyPenalty = *g.FrequencyPenalty
	}
	if g.Seed != nil {
		c.Seed = *g.Seed
	}
	for _, v := range []float64{c.Temperature, c.TopP, c.RepetitionPenalty, c.PresencePenalty, c.FrequencyPenalty} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return c, fmt.Errorf("sampler: generation_config.json: non-finite setting %v", v)
		}
	}
	return c, nil
}

// IsGreedy reports whether the config decodes by argmax.
func (c Config) IsGreedy() bool { return c.Greedy || !(c.Temperature > 0) }

// Sampler draws tokens with one Config. It keeps scratch buffers sized by the logits, so after
// the first call with a given logits length Sample does not allocate. Not safe for concurrent
// use.
type Sampler struct {
	cfg Config
	rng *rand.Rand

	// Candidate ↔ token id mapping (nil: logit index i is token id i).
	ids   []int32 // logit index → token id
	index []int32 // token id → logit index, −1 when not a candidate

	// Scratch, sized by the logits length.
	s     []float64 // penalised, temperature-scaled logits
	stamp []uint32  // stamp[i] == gen: candidate i is in the current history
	count []int32   // occurrences of candidate i in the current history (valid when stamped)
	seen  []int32   // distinct candidates of the current history
	order []int32   // kept candidates, best first
	cum   []float64 // cumulative probabilities of order
	gen   uint32
	kept  int
}

// New returns a Sampler for cfg whose generator is seeded with cfg.Seed.
func New(cfg Config) *Sampler {
	return &Sampler{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
}

// Config is the sampler's configuration.
func (s *Sampler) Config() Config { return s.cfg }

// Reseed restarts the generator of Sample from seed.
func (s *Sampler) Reseed(seed uint64) {
	s.cfg.Seed = seed
	s.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// SetCandidates declares that logit i belongs to token ids[i] (for example MioTTS's restricted
// head: the speech tokens, then EOS). History ids that are not candidates are then ignored,
// ties are broken by the token id, and Sample returns token ids rather than logit indices.
// nil restores the identity mapping. ids must be non-negative and distinct; the logits passed
// afterwards must have len(ids) entries.
func (s *Sampler) SetCandidates(ids []int32) error {
	if ids == nil {
		s.ids, s.index = nil, nil
		return nil
	}
	var top int32 = -1
	for _, id := range ids {
		if id < 0 {
			return fmt.Errorf("sampler: negative candidate id %d", id)
		}
		top = max(top, id)
	}
	index := make([]int32, int(top)+1)
	for i := range index {
		index[i] = -1
	}
	for i, id := range ids {
		if index[id] >= 0 {
			return fmt.Errorf("sampler: candidate id %d listed twice", id)
		}
		index[id] = int32(i)
	}
	s.ids, s.index = slices.Clone(ids), index
	return nil
}

// Kept is the number of candidates left after top-k and top-p in the last call (1 for greedy).
func (s *Sampler) Kept() int { return s.kept }

// Sample draws the next token for logits given the history (prompt and generated ids), using
// the sampler's own seeded generator. It returns a token id (a logit index unless
// SetCandidates was called).
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	if s.cfg.IsGreedy() {
		return s.SampleWithUniform(logits, history, 0)
	}
	return s.SampleWithUniform(logits, history, s.rng.Float64())
}

// SampleWithUniform is Sample with the uniform number u in [0,1) given by the caller.
func (s *Sampler) SampleWithUniform(logits []float32, history []int32, u float64) int32 {
	n := len(logits)
	if n == 0 {
		panic("sampler: no logits")
	}
	if s.ids != nil && len(s.ids) != n {
		panic(fmt.Sprintf("sampler: %d logits for %d candidates", n, len(s.ids)))
	}
	s.grow(n)
	x := s.s[:n]
	for i, v := range logits {
		x[i] = float64(v)
	}
	s.penalise(x, history)

	if s.cfg.IsGreedy() {
		best := 0
		for i := 1; i < n; i++ {
			if s.better(x, int32(i), int32(best)) {
				best = i
			}
		}
		s.kept = 1
		return s.tokenOf(int32(best))
	}

	t := s.cfg.Temperature
	if t != 1 {
		for i := range x {
			x[i] /= t
		}
	}
	order := s.topK(x)

	// Softmax over the kept candidates: cum[i] = Σ_{j ≤ i} p_j.
	cum := s.cum[:len(order)]
	s0 := x[order[0]]
	var z float64
	for i, c := range order {
		e := math.Exp(x[c] - s0)
		z += e
		cum[i] = e
	}
	var acc float64
	for i := range cum {
		acc += cum[i] / z
		cum[i] = acc
	}

	m := len(order)
	if p := s.cfg.TopP; p > 0 && p < 1 {
		for i, c := range cum {
			if c >= p {
				m = i + 1
				break
			}
		}
	}
	s.kept = m

	// Renormalise the kept prefix and draw by inverse CDF.
	total := cum[m-1]
	prev := 0.0
	acc = 0
	for i := range m {
		acc += (cum[i] - prev) / total
		prev = cum[i]
		if u < acc {
			return s.tokenOf(order[i])
		}
	}
	return s.tokenOf(order[m-1])
}

// grow sizes the scratch buffers for n logits.
func (s *Sampler) grow(n int) {
	if len(s.s) == n {
		return
	}
	s.s = make([]float64, n)
	s.stamp = make([]uint32, n)
	s.count = make([]int32, n)
	s.seen = make([]int32, 0, n)
	s.order = make([]int32, 0, n)
	s.cum = make([]float64, n)
	s.gen = 0
}

// penalise applies the repetition, presence and frequency penalties to x.
func (s *Sampler) penalise(x []float64, history []int32) {
	rp, pp, fp := s.cfg.RepetitionPenalty, s.cfg.PresencePenalty, s.cfg.FrequencyPenalty
	if (rp <= 0 || rp == 1) && pp == 0 && fp == 0 {
		return
	}
	s.gen++
	if s.gen == 0 { // wrapped: clear the stamps
		clear(s.stamp)
		s.gen = 1
	}
	seen := s.seen[:0]
	for _, id := range history {
		c := s.indexOf(id, len(x))
		if c < 0 {
			continue
		}
		if s.stamp[c] != s.gen {
			s.stamp[c] = s.gen
			s.count[c] = 0
			seen = append(seen, c)
		}
		s.count[c]++
	}
	s.seen = seen
	for _, c := range seen {
		v := x[c]
		if rp > 0 && rp != 1 {
			if v < 0 {
				v *= rp
			} else {
				v /= rp
			}
		}
		v -= pp + fp*float64(s.count[c])
		x[c] = v
	}
}

// indexOf maps a token id to its logit index, or −1.
func (s *Sampler) indexOf(id int32, n int) int32 {
	if s.index == nil {
		if id < 0 || int(id) >= n {
			return -1
		}
		return id
	}
	if id < 0 || int(id) >= len(s.index) {
		return -1
	}
	return s.index[id]
}

func (s *Sampler) tokenOf(c int32) int32 {
	if s.ids == nil {
		return c
	}
	return s.ids[c]
}

// better reports whether candidate a ranks before b: larger score, then smaller token id.
// NaN scores rank last.
func (s *Sampler) better(x []float64, a, b int32) bool {
	va, vb := x[a], x[b]
	if va != vb {
		if math.IsNaN(vb) {
			return !math.IsNaN(va)
		}
		return va > vb
	}
	return s.tokenOf(a) < s.tokenOf(b)
}

// topK returns the kept candidates, best first (all of them, sorted, when top-k is off).
func (s *Sampler) topK(x []float64) []int32 {
	n := len(x)
	k := s.cfg.TopK
	order := s.order[:0]
	if k <= 0 || k >= n {
		for i := range n {
			order = append(order, int32(i))
		}
		slices.SortFunc(order, func(a, b int32) int {
			if s.better(x, a, b) {
				return -1
			}
			if s.better(x, b, a) {
				return 1
			}
			return 0
		})
		s.order = order
		return order
	}
	// Keep a sorted buffer of the k best so far; most candidates fail the first comparison.
	for i := range n {
		c := int32(i)
		if len(order) == k {
			if !s.better(x, c, order[k-1]) {
				continue
			}
			order = order[:k-1]
		}
		j := len(order)
		order = append(order, c)
		for j > 0 && s.better(x, c, order[j-1]) {
			order[j] = order[j-1]
			j--
		}
		order[j] = c
	}
	s.order = order
	return order
}
