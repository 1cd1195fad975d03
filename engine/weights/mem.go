package weights

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// Spec names a tensor and its shape (PyTorch order): the tables of published models that
// model packages list for random-weight generators and tests.
type Spec struct {
	Name  string
	Shape []int
	// Encoded: the tensor feeds only Linear or GatherRows, so a file may store it quantised
	// and the engine keeps it so.
	Encoded bool
}

// Mem is an in-memory Source (tests, random models).
type Mem map[string]Tensor

// Get returns a tensor of the map.
func (m Mem) Get(name string) ([]float32, []int, error) {
	t, ok := m[name]
	if !ok {
		return nil, nil, fmt.Errorf("no tensor %s", name)
	}
	return t.Data, t.Shape, nil
}

// Shape reports a tensor's shape.
func (m Mem) Shape(name string) ([]int, bool) {
	t, ok := m[name]
	return t.Shape, ok
}

// Has reports whether the map has the tensor.
func (m Mem) Has(name string) bool { _, ok := m[name]; return ok }

// Random fills a table like a freshly initialised model, deterministically from seed:
// vectors 1 + 0.1·N(0,1) (norm weights, biases), variances and windows kept positive,
// matrices and convolutions N(0, 1/fan_in), so activations keep their scale through deep
// stacks and real-size random models run without overflowing.
func Random(specs []Spec, seed uint64) Mem {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	m := Mem{}
	for _, s := range specs {
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		fan := 1
		if len(s.Shape) > 0 && s.Shape[0] > 0 {
			fan = max(1, n/s.Shape[0])
		}
		data := make([]float32, n)
		for i := range data {
			v := rng.NormFloat64()
			switch {
			case strings.HasSuffix(s.Name, "running_var"), strings.HasSuffix(s.Name, "window"):
				v = 1 + 0.1*math.Abs(v)
			case len(s.Shape) == 1:
				v = 1 + 0.1*v
			default:
				v /= math.Sqrt(float64(fan))
			}
			data[i] = float32(v)
		}
		m[s.Name] = Tensor{Data: data, Shape: s.Shape}
	}
	return m
}
