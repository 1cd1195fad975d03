package wavlm

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
)

// randomSource is a random-weight model of cfg's real tensor names and shapes, generated on
// demand (a real-size model never exists twice in memory).
type randomSource struct {
	shapes map[string][]int
	seed   uint64
}

func newRandomSource(cfg Config, seed uint64) *randomSource {
	s := &randomSource{shapes: map[string][]int{}, seed: seed}
	for _, t := range cfg.Tensors() {
		s.shapes[t.Name] = t.Shape
	}
	return s
}

func (s *randomSource) Has(name string) bool { _, ok := s.shapes[name]; return ok }

func (s *randomSource) Get(name string) ([]float32, []int, error) {
	shape, ok := s.shapes[name]
	if !ok {
		return nil, nil, fmt.Errorf("no tensor %q", name)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(s.seed, h.Sum64()))
	n := 1
	for _, d := range shape {
		n *= d
	}
	fan := float64(shape[len(shape)-1])
	if len(shape) == 3 {
		fan = float64(shape[1] * shape[2])
	}
	d := make([]float32, n)
	for i := range d {
		d[i] = float32(rng.NormFloat64() / math.Sqrt(fan))
		if len(shape) == 1 || name == "encoder.pos_conv.0.weight_g" {
			d[i] = 1 + 0.1*d[i]
		}
	}
	return d, shape, nil
}

// BenchmarkRealWidth10s runs real-width encoders with few layers on a 10 s clip (2 threads):
// the conv stack and positional conv at full size, and the per-layer cost.
//
//	go test ./models/wavlm/ -run '^$' -bench RealWidth -benchtime 1x
func BenchmarkRealWidth10s(b *testing.B) {
	for _, c := range []struct {
		name   string
		cfg    Config
		layers int
	}{
		{"base+/2-layers", RealBasePlus(), 2},
		{"large/2-layers", RealLarge(), 2},
		{"large/24-layers", RealLarge(), 24},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := c.cfg
			cfg.Layers = c.layers
			be, err := engine.NewCPU(2)
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			m, err := Load(newRandomSource(cfg, 7), be, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			wave := make([]float32, 160000)
			for i := range wave {
				wave[i] = float32(0.3 * math.Sin(float64(i)*0.07) * math.Sin(float64(i)*0.0011))
			}
			layers := []int{1, c.layers}
			st, err := m.ProgramStats(len(wave), layers)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: arena %.1f MB (naive %.1f MB), persistent %.1f MB, %d nodes", c.name,
				float64(st.ArenaBytes)/1e6, float64(st.NaiveBytes)/1e6, float64(st.PersistentBytes)/1e6, st.Nodes)
			// Front end alone (index 0), then with the layers.
			for _, ls := range [][]int{{0}, layers} {
				if _, _, err := m.Hidden(wave, ls); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if _, _, err := m.Hidden(wave, ls); err != nil {
					b.Fatal(err)
				}
				b.Logf("%s: states %v: %v", c.name, ls, time.Since(t0))
			}
		})
	}
}
