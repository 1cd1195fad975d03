package main

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/models/miocodec"
	"github.com/voxpipe/voxpipe/models/miotts"
)

// goldenFamilies run every case of one family's golden folder against its model file.
var goldenFamilies = map[string]func(r *parity.Run, be engine.Backend) error{
	"miotts":   miotts.Golden,
	"miocodec": miocodec.Golden,
	"meanvc2":  meanvc2.Golden,
	// The 40 ms + 40 ms model: the same code and cases layout, its own folder.
	"meanvc2_40ms": meanvc2.Golden,
}

func goldenFamilyNames() string {
	var names []string
	for n := range goldenFamilies {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func runGolden(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("golden", "golden --family NAME [--dir GOLDEN_ROOT] [--model FILE.gguf [--min-tol REL]] [--threads N] [--backend cpu|vulkan[:N]]", stderr)
	family := fs.String("family", "", "model family: "+goldenFamilyNames())
	dir := fs.String("dir", golden.Root(), "golden root holding FAMILY/model.gguf and FAMILY/cases.gguf")
	threads := fs.Int("threads", min(runtime.NumCPU(), 4), "engine threads")
	backend := fs.String("backend", "cpu", "where the model runs: "+engine.BackendUsage)
	profile := fs.Bool("profile", false, "print where the run spends its time, by kind of op and by op and shapes (to stderr)")
	model := fs.String("model", "", "check this model file instead of FAMILY/model.gguf (an imported or re-encoded copy)")
	minTol := fs.Float64("min-tol", 0, "raise every stage's relative tolerance to at least this (a quantised model's stated error, e.g. 0.05)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	check, ok := goldenFamilies[*family]
	if !ok {
		fs.Usage()
		return fmt.Errorf("--family %q: use one of %s", *family, goldenFamilyNames())
	}
	if *dir == "" {
		return errors.New("--dir is required (no repository root found to default to ../shared/golden)")
	}
	r, err := parity.Open(*dir, *family)
	if err != nil {
		return err
	}
	defer r.Close()
	r.Model, r.MinTol = *model, *minTol
	be, _, closeBE, err := placement(*backend, "", "", *threads, stderr).Open()
	if err != nil {
		return err
	}
	defer closeBE()
	fmt.Fprintf(stdout, "%s on %s\n", *family, be.Name())
	prof, err := newProfiler(*profile, be, stderr)
	if err != nil {
		return err
	}
	start := time.Now()
	prof.start()
	err = check(r, be)
	prof.stop("golden " + *family)
	stages := r.Finish()
	failed := 0
	for _, s := range stages {
		fmt.Fprintln(stdout, s.String())
		if !s.OK() {
			failed++
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", *family, err)
	}
	fmt.Fprintf(stdout, "%s: %d stages, %d failed (%.1fs)\n", *family, len(stages), failed, time.Since(start).Seconds())
	if failed > 0 {
		return fmt.Errorf("%d of %d stages failed", failed, len(stages))
	}
	return nil
}
