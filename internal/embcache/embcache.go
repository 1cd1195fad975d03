// Package embcache keeps speaker embeddings computed from reference clips, keyed by the
// clip's content and the model that embedded it, in memory and optionally in a directory,
// so a voice is embedded once and a restart does not recompute it.
package embcache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/internal/atomicfile"
)

// Cache maps keys to embeddings. The zero value is a memory-only cache.
type Cache struct {
	Dir string // "" keeps embeddings in memory only
	// Log gets failures to write Dir, which do not fail Get. nil: slog.Default().
	Log *slog.Logger

	mu       sync.Mutex
	mem      map[string][]float32
	inflight map[string]*call
}

type call struct {
	done chan struct{}
	emb  []float32
	err  error
}

// New makes a cache backed by dir ("" for memory only), creating dir if needed.
func New(dir string) (*Cache, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("embedding cache: %w", err)
		}
		removeLeftovers(dir)
	}
	return &Cache{Dir: dir}, nil
}

// removeLeftovers deletes temporary files a killed process left behind. A temporary is
// named after its writer's pid (.emb-PID-*): one whose writer is gone is removed, one of a
// live process (voxpipe tts beside a server) is not. Unnamed ones count when a minute old.
func removeLeftovers(dir string) {
	tmps, _ := filepath.Glob(filepath.Join(dir, ".emb-*"))
	for _, t := range tmps {
		pid, _, named := strings.Cut(strings.TrimPrefix(filepath.Base(t), ".emb-"), "-")
		n, err := strconv.Atoi(pid)
		switch {
		case named && err == nil && n > 0:
			if n != os.Getpid() && processGone(n) {
				os.Remove(t)
			}
		default:
			if fi, err := os.Stat(t); err == nil && time.Since(fi.ModTime()) > time.Minute {
				os.Remove(t)
			}
		}
	}
}

// Key identifies a clip for one model: a hash of the model id, the sample rate and the
// samples.
func Key(model string, samples []float32, rate int) string {
	h := sha256.New()
	var b [8]byte
	h.Write([]byte(model))
	h.Write([]byte{0})
	binary.LittleEndian.PutUint64(b[:], uint64(rate))
	h.Write(b[:])
	buf := make([]byte, 4*1024)
	for len(samples) > 0 {
		n := min(len(samples), len(buf)/4)
		for i, v := range samples[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		h.Write(buf[:4*n])
		samples = samples[n:]
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// Get returns the embedding stored under key, or computes, stores and returns it.
// Concurrent calls for the same key compute it once. A failure to store the file is logged,
// not returned: the embedding is still kept in memory.
func (c *Cache) Get(key string, compute func() ([]float32, error)) ([]float32, error) {
	c.mu.Lock()
	if e, ok := c.mem[key]; ok {
		c.mu.Unlock()
		return e, nil
	}
	if cl, ok := c.inflight[key]; ok {
		c.mu.Unlock()
		<-cl.done
		return cl.emb, cl.err
	}
	cl := &call{done: make(chan struct{})}
	if c.inflight == nil {
		c.inflight = map[string]*call{}
	}
	c.inflight[key] = cl
	c.mu.Unlock()

	cl.emb, cl.err = c.load(key)
	if cl.emb == nil && cl.err == nil {
		if cl.emb, cl.err = compute(); cl.err == nil {
			// The file only saves a recompute after a restart: a disk that is full or
			// read-only must not fail the synthesis that needed the embedding.
			if err := c.store(key, cl.emb); err != nil {
				c.log().Warn("embedding cache: not saved; it will be recomputed after a restart", "key", key, "err", err)
			}
		}
	}
	c.mu.Lock()
	delete(c.inflight, key)
	if cl.err == nil {
		if c.mem == nil {
			c.mem = map[string][]float32{}
		}
		c.mem[key] = cl.emb
	}
	c.mu.Unlock()
	close(cl.done)
	return cl.emb, cl.err
}

func (c *Cache) log() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}

func (c *Cache) path(key string) string { return filepath.Join(c.Dir, key+".emb") }

// load reads a stored embedding; (nil, nil) when there is none or the file is unusable
// (a damaged file is recomputed, not trusted).
func (c *Cache) load(key string) ([]float32, error) {
	if c.Dir == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.path(key))
	if err != nil || len(data) < 8 || string(data[:4]) != "VXEM" {
		return nil, nil
	}
	n := int(binary.LittleEndian.Uint32(data[4:8]))
	if len(data) != 8+4*n {
		return nil, nil
	}
	emb := make([]float32, n)
	for i := range emb {
		emb[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[8+4*i:]))
	}
	return emb, nil
}

// store writes atomically: a crash leaves either the old state or the whole file.
func (c *Cache) store(key string, emb []float32) error {
	if c.Dir == "" {
		return nil
	}
	data := make([]byte, 8+4*len(emb))
	copy(data, "VXEM")
	binary.LittleEndian.PutUint32(data[4:], uint32(len(emb)))
	for i, v := range emb {
		binary.LittleEndian.PutUint32(data[8+4*i:], math.Float32bits(v))
	}
	if err := atomicfile.Write(c.path(key), data, 0o600, fmt.Sprintf(".emb-%d-*", os.Getpid())); err != nil {
		return fmt.Errorf("embedding cache: %w", err)
	}
	return nil
}
