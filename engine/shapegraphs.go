package engine

import "fmt"

// ShapeBuffer is a buffer with a shape and no memory, for graphs built only to be planned:
// a model package builds its real graph over such buffers to measure the planner at real
// size without gigabytes of weights. Such a graph can be given to PlanStatsOf, never
// compiled or run, and its buffers are never freed.
func ShapeBuffer(name string, shape ...int64) *Buffer { return shapeOnly(name, shape...) }

// PlanStatsOf plans a graph's memory without compiling it for a device.
func PlanStatsOf(g *Graph) (PlanStats, error) {
	p, err := planMemory(g, false)
	if err != nil {
		return PlanStats{}, err
	}
	if err := p.validate(); err != nil {
		return PlanStats{}, fmt.Errorf("engine: %s: invalid plan: %w", g.name, err)
	}
	return PlanStats{Nodes: len(g.nodes), ArenaBytes: p.arenaBytes, NaiveBytes: p.naiveBytes, PersistentBytes: p.persistentBytes}, nil
}
