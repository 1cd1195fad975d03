package engine

import "sync"

// Cache keeps compiled programs by key (usually the shapes they were built for), so a session
// compiles each shape once and reuses it; the least recently used is closed beyond max.
type Cache struct {
	mu      sync.Mutex
	backend Backend
	max     int
	entries map[string]Program
	order   []string // least recently used first
}

// NewCache holds up to max programs compiled by backend.
func NewCache(b Backend, max int) *Cache {
	return &Cache{backend: b, max: max, entries: map[string]Program{}}
}

// Get returns the program for key, building and compiling its graph on a miss.
func (c *Cache) Get(key string, build func() (*Graph, error)) (Program, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.entries[key]; ok {
		c.touch(key)
		return p, nil
	}
	g, err := build()
	if err != nil {
		return nil, err
	}
	p, err := c.backend.Compile(g)
	if err != nil {
		return nil, err
	}
	c.entries[key] = p
	c.order = append(c.order, key)
	for len(c.order) > c.max {
		old := c.order[0]
		c.order = c.order[1:]
		c.entries[old].Close()
		delete(c.entries, old)
	}
	return p, nil
}

func (c *Cache) touch(key string) {
	for i, k := range c.order {
		if k == key {
			c.order = append(append(c.order[:i:i], c.order[i+1:]...), key)
			return
		}
	}
}

// Remove closes and drops the programs whose key matches (those built over a buffer that is
// about to be freed).
func (c *Cache) Remove(match func(key string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.order[:0]
	for _, k := range c.order {
		if match(k) {
			c.entries[k].Close()
			delete(c.entries, k)
			continue
		}
		kept = append(kept, k)
	}
	c.order = kept
}

// Len is the number of cached programs.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Close closes every cached program.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.entries {
		p.Close()
	}
	c.entries, c.order = map[string]Program{}, nil
}
