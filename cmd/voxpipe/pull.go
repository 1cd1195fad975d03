package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/voxpipe/voxpipe/internal/hub"
)

func runPull(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("pull", "pull NAME... [--dir DIR] [--hub URL] [--token TOKEN]   |   pull --list\n\n"+
		"Downloads published model files into the model cache; flags that take a model file (--vc-model, --tts-model,\n"+
		"--codec, --model) then take the NAME. Names: "+strings.Join(hub.Names(), ", "), stderr)
	list := fs.Bool("list", false, "print the catalog: name, file, size, what it is for, and whether it is in the cache")
	dir := fs.String("dir", "", "model cache `DIR` (default $VOXPIPE_MODELS, else voxpipe/models in the user cache directory; model flags look in $VOXPIPE_MODELS or the default only)")
	hubURL := fs.String("hub", "", "hub base `URL` (default $HF_ENDPOINT, else "+hub.DefaultHub+"); files are at URL/"+hub.Repo+"/resolve/main/PATH")
	token := fs.String("token", "", "Hugging Face token, sent to the hub as Authorization: Bearer (default $HF_TOKEN)")
	idle := fs.Duration("idle-timeout", 60*time.Second, "give up on a connection that sends nothing for this long (what arrived is kept; pull again resumes)")
	quiet := fs.Bool("quiet", false, "no progress output")
	names, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if *dir == "" {
		if *dir, err = hub.Dir(); err != nil {
			return err
		}
	}
	if *list {
		return pullList(stdout, *dir)
	}
	if len(names) == 0 {
		fs.Usage()
		return errors.New("name a model to pull (voxpipe pull --list shows them)")
	}
	for _, n := range names {
		if _, ok := hub.Lookup(n); !ok {
			return fmt.Errorf("unknown model %q: voxpipe pull --list shows the catalog (%s)", n, strings.Join(hub.Names(), ", "))
		}
	}
	c := &hub.Client{
		Hub:         firstNonEmpty(*hubURL, os.Getenv("HF_ENDPOINT"), hub.DefaultHub),
		Token:       firstNonEmpty(*token, os.Getenv("HF_TOKEN")),
		IdleTimeout: *idle,
		UserAgent:   "voxpipe",
		Logf:        func(format string, a ...any) { fmt.Fprintf(stdout, "  "+format+"\n", a...) },
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var notPulled []string
	for _, n := range names {
		m, _ := hub.Lookup(n)
		if !m.Published() {
			if st, err := os.Stat(m.CachePath(*dir)); err == nil && st.Mode().IsRegular() {
				fmt.Fprintf(stdout, "%s: in the cache already: %s\n", m.Name, m.CachePath(*dir))
				continue
			}
			printImportHint(stdout, m, *dir)
			notPulled = append(notPulled, m.Name)
			continue
		}
		if err := pullOne(ctx, c, m, *dir, stdout, stderr, *quiet); err != nil {
			return err
		}
	}
	if len(notPulled) > 0 {
		return fmt.Errorf("%s: not published as GGUF; build with the voxpipe import command above", strings.Join(notPulled, ", "))
	}
	return nil
}

func pullOne(ctx context.Context, c *hub.Client, m hub.Model, dir string, stdout, stderr io.Writer, quiet bool) error {
	if st, err := os.Stat(m.CachePath(dir)); err == nil && st.Mode().IsRegular() {
		fmt.Fprintf(stdout, "%s: in the cache already: %s\n", m.Name, m.CachePath(dir))
		return nil
	}
	fmt.Fprintf(stdout, "%s: %s (about %s) from %s\n", m.Name, m.Path, hub.MB(m.Size), m.URL(c.Hub))
	var bar *pullProgress
	if !quiet {
		bar = &pullProgress{w: stderr, name: m.Name, term: isTerminal(stderr), began: time.Now()}
		c.Progress = bar.update
	} else {
		c.Progress = nil
	}
	res, err := c.Pull(ctx, m, dir)
	bar.end()
	if err != nil {
		var ie *hub.InterruptedError
		if errors.As(err, &ie) {
			if ie.Have > 0 {
				return fmt.Errorf("%s: %w\n  run `voxpipe pull %s` again: it resumes from the %s already fetched", m.Name, err, m.Name, hub.MB(ie.Have))
			}
			return fmt.Errorf("%s: %w\n  check the network (or --hub / HF_ENDPOINT), then run `voxpipe pull %s` again", m.Name, err, m.Name)
		}
		return fmt.Errorf("%s: %w", m.Name, err)
	}
	if res.Checked {
		fmt.Fprintf(stdout, "  %s, sha256 %s matches the hub's\n", hub.MB(res.Bytes), res.SHA256)
	} else {
		fmt.Fprintf(stdout, "  %s; the hub offered no checksum, so only the size was checked\n", hub.MB(res.Bytes))
	}
	fmt.Fprintf(stdout, "  saved %s\n  use it: %s\n", res.Path, m.Use)
	return nil
}

func printImportHint(w io.Writer, m hub.Model, dir string) {
	fmt.Fprintf(w, "%s: %s.\n", m.Name, m.About)
	fmt.Fprintf(w, "  The original checkpoints are the only source. Fetch %s into %s, then run:\n", m.Import.Sources, m.Import.From)
	fmt.Fprintf(w, "    %s\n", m.ImportCommand(dir))
	fmt.Fprintf(w, "  and use it: %s\n", m.Use)
}

func pullList(w io.Writer, dir string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFILE\tSIZE\tIN CACHE\tFOR")
	for _, m := range hub.Catalog() {
		file := m.Path
		if !m.Published() {
			file = "(voxpipe import) " + m.File
		}
		size := fmt.Sprintf("%.2f GB", float64(m.Size)/1e9)
		if m.Size < 1e9 {
			size = fmt.Sprintf("%.0f MB", float64(m.Size)/1e6)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, file, size, cacheState(m, dir), m.About)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nSizes are approximate. Cache: %s (from the hub's %s)\n", dir, hub.Repo)
	return nil
}

func cacheState(m hub.Model, dir string) string {
	p := m.CachePath(dir)
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return "yes"
	}
	if st, err := os.Stat(p + ".part"); err == nil && st.Mode().IsRegular() {
		return "partial (" + hub.MB(st.Size()) + ")"
	}
	return "no"
}

// pullProgress draws a download's progress: a bar redrawn in place on a terminal, otherwise
// a line at every tenth.
type pullProgress struct {
	w      io.Writer
	name   string
	term   bool
	began  time.Time
	drawn  time.Time
	tenths int64 // the last tenth reported (plain output); -1 before the first update
	seen   bool
	line   bool // a bar is on the terminal line
}

func (p *pullProgress) update(pr hub.Progress) {
	now := time.Now()
	if !p.seen {
		p.seen, p.began = true, now
		p.tenths = -1
		if pr.Total > 0 {
			p.tenths = pr.Done * 10 / pr.Total
		}
	}
	secs := now.Sub(p.began).Seconds()
	speed := 0.0
	if secs > 0 {
		speed = float64(pr.Done-pr.Start) / secs
	}
	if !p.term {
		if pr.Total <= 0 {
			return
		}
		if t := pr.Done * 10 / pr.Total; t > p.tenths {
			p.tenths = t
			fmt.Fprintf(p.w, "%s: %3d%% (%.1f of %.1f MB, %.1f MB/s)\n", p.name, t*10, float64(pr.Done)/1e6, float64(pr.Total)/1e6, speed/1e6)
		}
		return
	}
	if now.Sub(p.drawn) < 100*time.Millisecond && pr.Done != pr.Total {
		return
	}
	p.drawn, p.line = now, true
	if pr.Total <= 0 {
		fmt.Fprintf(p.w, "\r%.1f MB  %.1f MB/s   ", float64(pr.Done)/1e6, speed/1e6)
		return
	}
	frac := float64(pr.Done) / float64(pr.Total)
	bar := progressCells(frac)
	eta := "--:--"
	if speed > 0 {
		s := int(float64(pr.Total-pr.Done) / speed)
		eta = fmt.Sprintf("%d:%02d", s/60, s%60)
	}
	fmt.Fprintf(p.w, "\r[%s] %3.0f%%  %.1f/%.1f MB  %.1f MB/s  ETA %s   ", bar, frac*100, float64(pr.Done)/1e6, float64(pr.Total)/1e6, speed/1e6, eta)
}

// end finishes the bar's line.
func (p *pullProgress) end() {
	if p != nil && p.line {
		fmt.Fprintln(p.w)
		p.line = false
	}
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// resolveModelFlags lets the named model-file flags of fs take a pulled model's name (see
// voxpipe pull): a value that is not an existing file but a catalog name becomes the cached
// file, or an error saying to pull it first. Call it after the flags (and any config file)
// are parsed.
func resolveModelFlags(fs *flag.FlagSet, names ...string) error {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if l, ok := f.Value.(*listFlag); ok {
			for i, v := range *l {
				p, err := hub.Resolve(v)
				if err != nil {
					return fmt.Errorf("--%s: %w", name, err)
				}
				(*l)[i] = p
			}
			continue
		}
		v := f.Value.String()
		p, err := hub.Resolve(v)
		if err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
		if p != v {
			if err := f.Value.Set(p); err != nil {
				return err
			}
		}
	}
	return nil
}
