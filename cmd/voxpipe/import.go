package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/engine/ckpt"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/internal/atomicfile"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/ecapa"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/models/miocodec"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/models/vocos"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// `voxpipe import` packages a model's original checkpoints (safetensors, torch.save zips,
// TorchScript archives, legacy torch.save files, read by engine/ckpt without executing
// anything) into the single audio.cpp-style GGUF the engine loads: the published tensor
// names and shapes (the ones mkmodel writes and the golden files have), the sidecar files
// the loaders read, the metadata and the package spec. Tensors are streamed one at a time
// (engine/ggufpack), so memory stays near one tensor's chunk, not the model.

const importSynopsis = "import --family meanvc2|miotts|miocodec --from PATH [--from PATH…] --out FILE.gguf [--dtype f32|f16|bf16|q8_0|q4_k] [--variant 120ms|40ms] [--name NAME]"

// importFlags are import's settings.
type importFlags struct {
	family, variant, name string
	from                  []string
	dtype                 string
}

// importSource is one tensor of the output and where it comes from.
type importSource struct {
	t         *ckpt.Tensor
	file      string // source file (base name), for messages and tensor_sources
	transpose bool   // swap the last two dims (MLX conv layout → PyTorch)
	pos       int    // index in its checkpoint: the output keeps the source order
}

// importPlan is everything the writer needs: metadata, spec, table, sources, files.
type importPlan struct {
	kv      gguf.KV
	spec    gguf.ModelSpec
	table   []ggufpack.Tensor
	src     []importSource
	files   []gguf.EmbeddedFile
	skipped []string // source tensors the engine does not use
	desc    string
	ckpts   []*ckpt.Checkpoint
}

func (p *importPlan) close() {
	for _, c := range p.ckpts {
		c.Close()
	}
}

type importFromList []string

func (s *importFromList) String() string     { return strings.Join(*s, ",") }
func (s *importFromList) Set(v string) error { *s = append(*s, v); return nil }

func runImport(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("import", importSynopsis, stderr)
	var f importFlags
	var from importFromList
	fs.StringVar(&f.family, "family", "", "model family: meanvc2, miotts or miocodec")
	fs.Var(&from, "from", "an original checkpoint file, a folder holding them, or ROLE=FILE (meanvc2 roles: vc, asr, vocos, speaker, speaker_wavlm, speaker_ecapa; miocodec: weights, wavlm_weights, config, wavlm_config; miotts: weights); repeatable")
	out := fs.String("out", "", "output GGUF file")
	fs.StringVar(&f.dtype, "dtype", "f32", "stored type of the matrices the engine keeps encoded: f32, f16, bf16, q8_0 or q4_k (norms, biases, convolutions and small tensors stay F32)")
	fs.StringVar(&f.variant, "variant", "", "meanvc2: 120ms or 40ms (default: from the file names, else 120ms)")
	fs.StringVar(&f.name, "name", "", "general.name of the file (default: the published model's name)")
	quiet := fs.Bool("quiet", false, "no progress output")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	f.from = from
	if *out == "" || len(f.from) == 0 || f.family == "" {
		fs.Usage()
		return errors.New("--family, --from and --out are required")
	}
	dt, err := importDType(f.dtype)
	if err != nil {
		return err
	}
	if f.family != "meanvc2" && f.variant != "" {
		return fmt.Errorf("--variant is for --family meanvc2, not %s", f.family)
	}
	start := time.Now()
	var log io.Writer = stderr // what was found, what is left out, progress
	if *quiet {
		log = io.Discard
	}
	var plan *importPlan
	switch f.family {
	case "meanvc2":
		plan, err = planMeanVC2(f, log)
	case "miocodec":
		plan, err = planMioCodec(f, log)
	case "miotts":
		plan, err = planMioTTS(f, log)
	default:
		return fmt.Errorf("unknown family %q (meanvc2, miotts or miocodec)", f.family)
	}
	if plan != nil {
		defer plan.close()
	}
	if err != nil {
		return err
	}
	if err := plan.finish(f, dt); err != nil {
		return err
	}
	if len(plan.skipped) > 0 {
		fmt.Fprintf(log, "not packaged (unused by the engine): %d tensors: %s\n", len(plan.skipped), importSummarize(plan.skipped, 12))
	}
	if err := writeImport(*out, plan, log, !*quiet && isTerminal(stderr)); err != nil {
		return err
	}
	st, _ := os.Stat(*out)
	fmt.Fprintf(stdout, "wrote %s: %s, %d tensors, %.1f MB in %.1f s\n", *out, plan.desc, len(plan.table),
		float64(st.Size())/1e6, time.Since(start).Seconds())
	return nil
}

// importDType parses --dtype.
func importDType(s string) (gguf.DType, error) {
	switch strings.ToLower(s) {
	case "f32":
		return gguf.F32, nil
	case "f16":
		return gguf.F16, nil
	case "bf16":
		return gguf.BF16, nil
	case "q8_0":
		return gguf.Q8_0, nil
	case "q4_k":
		return gguf.Q4_K, nil
	}
	return 0, fmt.Errorf("--dtype %q: use f32, f16, bf16, q8_0 or q4_k", s)
}

// importStoredType is the type a tensor is written as: matrices the engine keeps encoded
// (Linear weights, embedding tables: weights.Spec.Encoded) take dt when their rows are
// whole blocks of it (Q4_K rows that are not fall back to Q8_0); everything else is F32.
func importStoredType(encoded bool, shape []int, dt gguf.DType) gguf.DType {
	if dt == gguf.F32 || !encoded || len(shape) != 2 {
		return gguf.F32
	}
	cols := shape[1]
	switch dt {
	case gguf.Q4_K:
		if cols%256 == 0 {
			return gguf.Q4_K
		}
		if cols%32 == 0 {
			return gguf.Q8_0
		}
		return gguf.F32
	case gguf.Q8_0:
		if cols%32 == 0 {
			return gguf.Q8_0
		}
		return gguf.F32
	}
	return dt
}

// importUnusedBranches are the parts of the originals the engine has no use for: Fast-U2++'s
// non-streaming conv, global CMVN (audio.cpp applies none), positional table, attention
// decoder and CTC head; MeanVC's DiT cache_embed.
var importUnusedBranches = []string{"non_streaming_conv", "global_cmvn", "pos_enc", "decoder", "ctc", "cache_embed"}

// importSummarize groups names that differ only in their numbers (layer indices) and lists
// up to n groups: "encoder.encoders.N.conv_module.non_streaming_conv.norm.weight ×6, …".
func importSummarize(names []string, n int) string {
	var order []string
	count := map[string]int{}
	for _, name := range names {
		var b strings.Builder
		digits := false
		for _, r := range name {
			if r >= '0' && r <= '9' {
				if !digits {
					b.WriteByte('N')
				}
				digits = true
				continue
			}
			digits = false
			b.WriteRune(r)
		}
		k := b.String()
		parts := strings.Split(k, ".")
		if parts[len(parts)-1] == "num_batches_tracked" {
			k = "*.num_batches_tracked"
		} else {
			for i, seg := range parts {
				if slices.Contains(importUnusedBranches, seg) {
					k = strings.Join(parts[:i+1], ".") + ".*"
					break
				}
			}
		}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		if count[k] > 1 {
			k = fmt.Sprintf("%s ×%d", k, count[k])
		}
		out = append(out, k)
	}
	return importListSome(out, n)
}

// importListSome lists up to n names, then how many more.
func importListSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:n], ", ") + fmt.Sprintf(", … (%d more)", len(names)-n)
}

// finish fixes stored types, the metadata and the spec, and checks the spec against the
// table and the files.
func (p *importPlan) finish(f importFlags, dt gguf.DType) error {
	p.applyDType(dt)
	orig := true
	for i := range p.table {
		if sd := p.src[i].t.DType; sd != ckpt.F32 || p.table[i].Type != gguf.F32 {
			orig = orig && (sd == ckpt.F16 && p.table[i].Type == gguf.F16 || sd == ckpt.BF16 && p.table[i].Type == gguf.BF16 ||
				sd == ckpt.F32 && p.table[i].Type == gguf.F32)
		}
	}
	wt := "orig"
	if !orig {
		wt = strings.ToLower(dt.String())
	}
	for k, v := range map[string]any{
		"general.architecture":        "audiocpp",
		"audiocpp.tensor_name_format": "native",
		"audiocpp.weight_type":        wt,
		gguf.KeyAlignment:             uint32(gguf.DefaultAlignment),
	} {
		if err := p.kv.Set(k, v); err != nil {
			return err
		}
	}
	if f.name != "" {
		if err := p.kv.Set("general.name", f.name); err != nil {
			return err
		}
	}
	names := make([]string, len(p.table))
	for i, t := range p.table {
		names[i] = t.Name
	}
	files := make([]string, len(p.files))
	for i, e := range p.files {
		files[i] = e.Name
	}
	if err := p.spec.Embed(p.kv, names, files); err != nil {
		return fmt.Errorf("%s: %w", f.family, err)
	}
	return nil
}

// writeImport streams the plan to path, whole or not at all (a temporary file, synced and
// renamed at the end).
func writeImport(path string, p *importPlan, progress io.Writer, bar bool) error {
	return atomicfile.WriteFunc(path, 0o644, "."+filepath.Base(path)+".*", func(out io.Writer) error {
		return writePlan(out, path, p, progress, bar)
	})
}

// writePlan streams the plan's tensors into out, with progress by namespace (or a bar).
func writePlan(out io.Writer, path string, p *importPlan, progress io.Writer, bar bool) error {
	w, err := ggufpack.New(out, p.kv, p.table, p.files)
	if err != nil {
		return err
	}
	var total, done int64
	for _, s := range p.src {
		total += s.t.Bytes()
	}
	group, groupStart, groupN, groupBytes := "", time.Now(), 0, int64(0)
	flushGroup := func() {
		if group != "" && !bar {
			fmt.Fprintf(progress, "  %-16s %4d tensors  %8.1f MB  %.1f s\n", cmp.Or(group, "(root)"), groupN,
				float64(groupBytes)/1e6, time.Since(groupStart).Seconds())
		}
	}
	fmt.Fprintf(progress, "writing %s…\n", path)
	feed := startImportFeed(p.table, p.src)
	defer feed.stop()
	for i, t := range p.table {
		g := gguf.Namespace(t.Name)
		if g == "" {
			g = "weights"
		}
		if g != group {
			flushGroup()
			group, groupStart, groupN, groupBytes = g, time.Now(), 0, 0
		}
		if err := feed.copy(w, i); err != nil {
			return fmt.Errorf("%s (from %s): %w", t.Name, p.src[i].file, err)
		}
		groupN++
		groupBytes += p.src[i].t.Bytes()
		done += p.src[i].t.Bytes()
		if bar && (i%8 == 0 || i == len(p.table)-1) {
			pct := float64(done) / float64(max(total, 1))
			fmt.Fprintf(progress, "\r  [%s] %3.0f%%  %-40.40s", progressCells(pct), 100*pct, t.Name)
		}
	}
	flushGroup()
	if bar {
		fmt.Fprintln(progress)
	}
	return w.Close()
}

// copyTensor streams one tensor into the writer (importFeed over that one tensor).
func copyTensor(w *ggufpack.Writer, t ggufpack.Tensor, s importSource) error {
	f := startImportFeed([]ggufpack.Tensor{t}, []importSource{s})
	defer f.stop()
	return f.copy(w, 0)
}

// importChunkBytes is about how much of a tensor is read and converted at a time (1, 2 and
// 4 MB measured the same; the kernel's read-ahead, not this, keeps the disk busy).
const importChunkBytes = 1 << 20

// importAhead is how many chunks the feed's reader may have read or be reading while the
// writer converts one: 4 MB of buffers in all.
const importAhead = 4

// importFeed reads the sources' bytes, a chunk of whole rows at a time, on a goroutine of its
// own, up to importAhead chunks before the writer needs them: the disk reads while the
// previous chunk is converted and written. Transposed tensors are left to the writer.
type importFeed struct {
	table  []ggufpack.Tensor
	srcs   []importSource
	chunks chan importChunk
	free   chan []byte
	done   chan struct{}
	ended  sync.WaitGroup
}

// importChunk is one chunk of tensor i (or why it cannot be read).
type importChunk struct {
	i   int
	buf []byte
	err error
}

// importSameType reports whether tensor t stores its source's bytes as they are.
func importSameType(t ggufpack.Tensor, s importSource) bool {
	g, ok := importFileType(s.t.DType)
	return !s.transpose && ok && g == t.Type
}

// importFileType is the GGUF type of a checkpoint's float type (F32, F16, BF16).
func importFileType(d ckpt.DType) (gguf.DType, bool) {
	switch d {
	case ckpt.F32:
		return gguf.F32, true
	case ckpt.F16:
		return gguf.F16, true
	case ckpt.BF16:
		return gguf.BF16, true
	}
	return 0, false
}

func startImportFeed(table []ggufpack.Tensor, srcs []importSource) *importFeed {
	f := &importFeed{table: table, srcs: srcs, chunks: make(chan importChunk, importAhead),
		free: make(chan []byte, importAhead), done: make(chan struct{})}
	for range importAhead {
		f.free <- nil
	}
	f.ended.Add(1)
	go f.read()
	return f
}

// stop ends the reader (when the writer gives up early) and waits for it.
func (f *importFeed) stop() {
	close(f.done)
	f.ended.Wait()
}

// read is the feed's goroutine.
func (f *importFeed) read() {
	defer f.ended.Done()
	defer close(f.chunks)
	send := func(c importChunk) bool {
		select {
		case f.chunks <- c:
			return true
		case <-f.done:
			return false
		}
	}
	for i, t := range f.table {
		s := f.srcs[i]
		if s.transpose {
			continue
		}
		if s.t.Bytes() == 0 { // (the plan let only F32, F16 and BF16 sources through)
			continue
		}
		rc, err := s.t.Open()
		if err != nil {
			send(importChunk{i: i, err: err})
			return
		}
		// Block types are converted whole rows at a time.
		row := int64(1)
		if len(t.Shape) > 0 && t.Type.BlockSize() > 1 && !importSameType(t, s) {
			row = int64(max(t.Shape[len(t.Shape)-1], 1))
		}
		rowBytes := row * int64(s.t.DType.Size())
		chunk := min(max(1, importChunkBytes/rowBytes)*rowBytes, s.t.Bytes())
		for left := s.t.Bytes(); left > 0; {
			var buf []byte
			select {
			case buf = <-f.free:
			case <-f.done:
				rc.Close()
				return
			}
			n := min(chunk, left)
			if int64(cap(buf)) < n {
				buf = make([]byte, chunk)
			}
			buf = buf[:n]
			if _, err := io.ReadFull(rc, buf); err != nil { // a short source names itself (ckpt)
				rc.Close()
				send(importChunk{i: i, err: err})
				return
			}
			if !send(importChunk{i: i, buf: buf}) {
				rc.Close()
				return
			}
			left -= n
		}
		rc.Close()
	}
}

// copy writes tensor i: its source bytes as they are when the stored type is the source's,
// else converted from them by the C encoder (ggufpack.Writer.WriteLE: the bytes the Go
// encoders write for the decoded values, without decoding them in Go).
func (f *importFeed) copy(w *ggufpack.Writer, i int) error {
	t, s := f.table[i], f.srcs[i]
	if s.transpose {
		vals, err := s.t.ReadFloat32()
		if err != nil {
			return err
		}
		return w.WriteFloat32(importSwapLast2(vals, s.t.Shape))
	}
	from, _ := importFileType(s.t.DType)
	same := importSameType(t, s)
	for left := s.t.Bytes(); left > 0; {
		c, ok := <-f.chunks
		switch {
		case !ok:
			return fmt.Errorf("%s (%s): the reader stopped early", s.t.Name, s.t.Where)
		case c.err != nil:
			return c.err
		case c.i != i:
			return fmt.Errorf("%s (%s): internal error: the reader sent tensor %d's bytes", s.t.Name, s.t.Where, c.i)
		}
		var err error
		if same {
			err = w.WriteRaw(c.buf)
		} else {
			err = w.WriteLE(c.buf, from)
		}
		left -= int64(len(c.buf))
		f.free <- c.buf
		if err != nil {
			return err
		}
	}
	return nil
}

// importSwapLast2 transposes the last two dims of a row-major tensor of shape.
func importSwapLast2(v []float32, shape []int) []float32 {
	r, c := shape[len(shape)-2], shape[len(shape)-1]
	out := make([]float32, len(v))
	for b := 0; b+r*c <= len(v) && r*c > 0; b += r * c {
		for i := range r {
			for j := range c {
				out[b+j*r+i] = v[b+i*c+j]
			}
		}
	}
	return out
}

// ---- sources ----

// importInput is a checkpoint (or side file) named on the command line.
type importInput struct {
	path   string
	role   string // forced with ROLE=PATH
	listed bool   // found in a folder (not named on the command line)
}

// importCheckpointExt reports whether a file name looks like a checkpoint.
func importCheckpointExt(name string) bool {
	for _, e := range []string{".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".index.json"} {
		if strings.HasSuffix(name, e) {
			return true
		}
	}
	return false
}

// importExpand turns --from values into files: folders are listed (checkpoints and the
// named side files, one level of sub-folders too), ROLE=FILE keeps its role. A file named
// twice counts once.
func importExpand(from []string, roles []string, side func(rel string) bool) ([]importInput, error) {
	var out []importInput
	seen := map[string]int{}
	add := func(in importInput) {
		abs, err := filepath.Abs(in.path)
		if err != nil {
			abs = in.path
		}
		if i, ok := seen[abs]; ok {
			if !in.listed { // named on the command line: its role and strictness win
				out[i].listed, out[i].role = false, cmp.Or(in.role, out[i].role)
			}
			return
		}
		seen[abs] = len(out)
		out = append(out, in)
	}
	for _, f := range from {
		role := ""
		if k, v, ok := strings.Cut(f, "="); ok && slices.Contains(roles, k) {
			role, f = k, v
		}
		st, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			add(importInput{path: f, role: role})
			continue
		}
		if role != "" {
			return nil, fmt.Errorf("%s=%s: a role takes a file, not a folder", role, f)
		}
		var found []string
		err = filepath.WalkDir(f, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(f, p)
			if d.IsDir() {
				if strings.Count(rel, string(filepath.Separator)) >= 1 || strings.HasPrefix(d.Name(), ".") && rel != "." {
					return filepath.SkipDir
				}
				return nil
			}
			if importCheckpointExt(d.Name()) || side != nil && side(filepath.ToSlash(rel)) {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		// A sharded checkpoint is read through its index, not shard by shard.
		shards := map[string]bool{}
		for _, p := range found {
			if strings.HasSuffix(p, ".index.json") {
				c, err := ckpt.OpenSafetensorsIndex(p)
				if err != nil {
					return nil, err
				}
				for _, s := range c.Shards {
					shards[s] = true
				}
				c.Close()
			}
		}
		for _, p := range found {
			if !shards[p] {
				add(importInput{path: p, listed: true})
			}
		}
	}
	return out, nil
}

// importPrefix finds the shortest prefix p ("" or ending in '.') with p+anchor in c.
func importPrefix(c *ckpt.Checkpoint, anchor string) (string, bool) {
	best, ok := "", false
	for _, t := range c.Tensors {
		if p, found := strings.CutSuffix(t.Name, anchor); found && (p == "" || strings.HasSuffix(p, ".")) {
			if !ok || len(p) < len(best) {
				best, ok = p, true
			}
		}
	}
	return best, ok
}

// importRoleFile is a checkpoint found to hold a role's tensors under prefix.
type importRoleFile struct {
	c      *ckpt.Checkpoint
	path   string
	prefix string
}

// importOpenRoles opens every checkpoint input and finds the roles (by anchor tensor) each holds.
// A file found in a folder that cannot be read (a training-state pickle, a corrupt file) is
// skipped with a warning; one named on the command line is an error.
func importOpenRoles(inputs []importInput, anchors map[string]string, plan *importPlan, log io.Writer) (map[string][]importRoleFile, error) {
	found := map[string][]importRoleFile{}
	for _, in := range inputs {
		if !importCheckpointExt(filepath.Base(in.path)) && in.role == "" {
			continue
		}
		c, err := ckpt.Open(in.path)
		if err != nil {
			if in.listed {
				fmt.Fprintf(log, "skipping %s: %v\n", in.path, err)
				continue
			}
			return nil, err
		}
		plan.ckpts = append(plan.ckpts, c)
		any := false
		for role, anchor := range anchors {
			if in.role != "" && in.role != role && !strings.HasPrefix(role, in.role+"_") {
				continue
			}
			if p, ok := importPrefix(c, anchor); ok {
				found[role] = append(found[role], importRoleFile{c: c, path: in.path, prefix: p})
				any = true
			}
		}
		if !any && in.role != "" {
			return nil, fmt.Errorf("%s=%s: no %s tensors in it (looked for …%s)", in.role, in.path, in.role, anchors[in.role])
		}
	}
	return found, nil
}

// ---- MeanVC2 ----

// mvc2Roles are the MeanVC2 checkpoints' contents, each recognised by one tensor: the DiT
// safetensors, the Fast-U2++ TorchScript, Vocos TorchScript, and the UniSpeech speaker
// checkpoint (WavLM-Large under feature_extract.model, the ECAPA head).
var mvc2Roles = map[string]string{
	"vc":            "transformer_blocks.0.attn.to_q.weight",
	"asr":           "encoders.0.self_attn.linear_q.weight",
	"vocos":         "backbone.convnext.0.pwconv1.weight",
	"speaker_wavlm": "feature_extractor.conv_layers.0.0.weight",
	"speaker_ecapa": "layer1.conv.weight",
}

// mvc2VariantHint reads a MeanVC2 variant from a file name: meanvc2_40ms_40ms / fastu2pp_80ms
// → 40ms, meanvc2_120ms_40ms / fastu2pp_160ms → 120ms.
func mvc2VariantHint(path string) string {
	b := strings.ToLower(filepath.Base(path))
	switch {
	case strings.Contains(b, "120ms"), strings.Contains(b, "160ms"):
		return "120ms"
	case strings.Contains(b, "40ms_40ms"), strings.Contains(b, "40ms-40ms"), strings.Contains(b, "80ms"):
		return "40ms"
	}
	return ""
}

// mvc2Rename maps a role's tensor name (prefix removed) to its packaged name, or "" for
// tensors the engine never reads.
func mvc2Rename(role, name string) string {
	switch role {
	case "vc":
		if strings.HasPrefix(name, "cache_embed.") { // in the runtime class, unused
			return ""
		}
		return name
	case "asr":
		// The prefix ends before "encoders."; WeNet's conv module is Fast-U2++'s streaming
		// branch (the non-streaming one is not used).
		name = "encoder." + name
		if i := strings.Index(name, ".conv_module."); i >= 0 {
			rest := name[i+len(".conv_module."):]
			switch {
			case strings.HasPrefix(rest, "non_streaming_conv."):
				return ""
			case !strings.HasPrefix(rest, "streaming_conv."):
				name = name[:i] + ".conv_module.streaming_conv." + rest
			}
		}
		return name
	case "speaker_wavlm":
		return wavlmRename(name)
	}
	return name
}

// wavlmRename spells unilm WavLM names as the packaged files do: the per-conv LayerNorm of
// the Large extractor "conv_layers.N.2.1.*" as "conv_layers.N.2.*", a parametrised weight
// norm (torch ≥ 2.1) as weight_g/weight_v.
func wavlmRename(name string) string {
	if rest, ok := strings.CutPrefix(name, "feature_extractor.conv_layers."); ok {
		parts := strings.Split(rest, ".")
		if len(parts) == 4 && parts[1] == "2" && parts[2] == "1" {
			return "feature_extractor.conv_layers." + parts[0] + ".2." + parts[3]
		}
	}
	name = strings.Replace(name, ".parametrizations.weight.original0", ".weight_g", 1)
	return strings.Replace(name, ".parametrizations.weight.original1", ".weight_v", 1)
}

// importPickRole chooses the checkpoint for a role among several by the variant in file names.
func importPickRole(role string, cands []importRoleFile, variant string) (importRoleFile, error) {
	if len(cands) == 1 {
		return cands[0], nil
	}
	var match []importRoleFile
	for _, c := range cands {
		if variant != "" && mvc2VariantHint(c.path) == variant {
			match = append(match, c)
		}
	}
	if len(match) == 1 {
		return match[0], nil
	}
	// The same weights as safetensors and as a torch pickle (pytorch_model.bin): take the
	// safetensors.
	match = match[:0]
	for _, c := range cands {
		if strings.HasPrefix(c.c.Format, "safetensors") {
			match = append(match, c)
		}
	}
	if len(match) == 1 && variant == "" {
		return match[0], nil
	}
	paths := make([]string, len(cands))
	for i, c := range cands {
		paths[i] = c.path
	}
	return importRoleFile{}, fmt.Errorf("several checkpoints hold the %s tensors (%s): name one with %s=FILE or pass --variant", role, strings.Join(paths, ", "), role)
}

func planMeanVC2(f importFlags, log io.Writer) (*importPlan, error) {
	plan := &importPlan{kv: gguf.KV{}}
	roles := []string{"vc", "asr", "vocos", "speaker", "speaker_wavlm", "speaker_ecapa"}
	inputs, err := importExpand(f.from, roles, nil)
	if err != nil {
		return plan, err
	}
	found, err := importOpenRoles(inputs, mvc2Roles, plan, log)
	if err != nil {
		return plan, err
	}
	variant := f.variant
	if variant == "" {
		for _, role := range []string{"vc", "asr"} {
			for _, c := range found[role] {
				if h := mvc2VariantHint(c.path); h != "" && len(found[role]) == 1 {
					if variant != "" && variant != h {
						return plan, fmt.Errorf("the DiT and the ASR checkpoints are of different variants (%s): pass --variant", h)
					}
					variant = h
				}
			}
		}
	}
	pickBy := variant // choosing among several files needs a variant given or read from a name
	variant = cmp.Or(variant, "120ms")
	if !slices.Contains(meanvc2.Variants, variant) {
		return plan, fmt.Errorf("--variant %q: use 120ms or 40ms", variant)
	}
	chosen := map[string]importRoleFile{}
	var missing []string
	for _, role := range []string{"vc", "asr", "vocos", "speaker_wavlm", "speaker_ecapa"} {
		if len(found[role]) == 0 {
			missing = append(missing, fmt.Sprintf("%s (a checkpoint with …%s)", role, mvc2Roles[role]))
			continue
		}
		rf, err := importPickRole(role, found[role], pickBy)
		if err != nil {
			return plan, err
		}
		chosen[role] = rf
	}
	if len(missing) > 0 {
		return plan, fmt.Errorf("meanvc2: missing %s; the originals are meanvc2_<variant>.safetensors, fastu2pp_*.pt, vocos.pt and wavlm_large_finetune.pth", strings.Join(missing, ", "))
	}
	if h := mvc2VariantHint(chosen["asr"].path); h != "" && h != variant {
		fmt.Fprintf(log, "warning: %s looks like the %s model's ASR; packaging it as %s\n", chosen["asr"].path, h, variant)
	}
	// Every tensor of the chosen files goes to the role with the longest matching prefix.
	src := map[string]importSource{}
	seen := map[*ckpt.Tensor]bool{}
	type claim struct {
		role string
		rf   importRoleFile
	}
	byCkpt := map[*ckpt.Checkpoint][]claim{}
	for role, rf := range chosen {
		byCkpt[rf.c] = append(byCkpt[rf.c], claim{role, rf})
	}
	for c, claims := range byCkpt {
		sort.Slice(claims, func(i, j int) bool { return len(claims[i].rf.prefix) > len(claims[j].rf.prefix) })
		for pos, t := range c.Tensors {
			for _, cl := range claims {
				rest, ok := strings.CutPrefix(t.Name, cl.rf.prefix)
				if !ok || seen[t] {
					continue
				}
				seen[t] = true
				ns := cl.role
				if ns == "asr" {
					ns = conformer.Namespace
				}
				target := mvc2Rename(cl.role, rest)
				if target == "" {
					plan.skipped = append(plan.skipped, t.Name)
					break
				}
				src[ns+"/"+target] = importSource{t: t, file: filepath.Base(cl.rf.path), pos: pos}
			}
			if !seen[t] {
				plan.skipped = append(plan.skipped, t.Name)
			}
		}
	}
	d, err := inferMVC2Dims(src)
	if err != nil {
		return plan, err
	}
	if d, err = d.withVariant(variant); err != nil {
		return plan, err
	}
	conf, err := d.configJSON()
	if err != nil {
		return plan, fmt.Errorf("meanvc2: config.json: %w", err)
	}
	// The published file's data order: vc, asr, vocos, speaker_wavlm, speaker_ecapa.
	if err := plan.fromSpecs(d.specs(), src, "vc", conformer.Namespace, "vocos", "speaker_wavlm", "speaker_ecapa"); err != nil {
		return plan, err
	}
	plan.files = []gguf.EmbeddedFile{{Name: "config.json", Data: conf}}
	if plan.spec, err = gguf.FamilySpec(meanvc2.Family, variant); err != nil {
		return plan, err
	}
	for _, role := range []string{"vc", "asr", "vocos", "speaker_wavlm", "speaker_ecapa"} {
		ns := role
		if role == "asr" {
			ns = conformer.Namespace
		}
		if err := plan.spec.SetSource(ns, filepath.Base(chosen[role].path)); err != nil {
			return plan, err
		}
	}
	name := d.published()
	if d.vc.Dim < 512 || d.wavlm.Hidden < 1024 {
		name += "-tiny" // narrower than the published model
	}
	if err := errors.Join(plan.kv.Set("general.name", name), plan.kv.Set("audiocpp.source_format", "packed")); err != nil {
		return plan, err
	}
	plan.desc = fmt.Sprintf("meanvc2 %s ms + 40 ms (DiT %d×%d, ASR %d×%d, WavLM %d×%d)", strings.TrimSuffix(variant, "ms"),
		d.vc.Depth, d.vc.Dim, d.asr.NumBlocks, d.asr.OutputSize, d.wavlm.Layers, d.wavlm.Hidden)
	for _, role := range []string{"vc", "asr", "vocos", "speaker_wavlm", "speaker_ecapa"} {
		fmt.Fprintf(log, "%-14s %s (%s)\n", role+":", chosen[role].path, chosen[role].c.Format)
	}
	return plan, nil
}

// fromSpecs lays out the table: every tensor of specs (the engine's table) must come from
// the sources with its shape; sources the table does not name are reported as skipped.
// Namespaces come in the order of specs, the tensors of a namespace in their checkpoint's
// order (as the published converter writes them).
func (p *importPlan) fromSpecs(specs []weights.Spec, src map[string]importSource, nsOrder ...string) error {
	used := map[string]bool{}
	var problems []string
	for _, s := range specs {
		in, ok := src[s.Name]
		if !ok {
			problems = append(problems, "missing "+s.Name+fmt.Sprint(s.Shape))
			continue
		}
		used[s.Name] = true
		shape := in.t.Shape
		if in.transpose {
			shape = slices.Clone(shape)
			n := len(shape)
			shape[n-2], shape[n-1] = shape[n-1], shape[n-2]
		}
		if !slices.Equal(shape, s.Shape) {
			problems = append(problems, fmt.Sprintf("%s (from %s) has shape %v, the model needs %v", s.Name, in.file, in.t.Shape, s.Shape))
			continue
		}
		if !in.t.DType.IsFloat() {
			problems = append(problems, fmt.Sprintf("%s (from %s) is %s (F32, F16 and BF16 are read)", s.Name, in.file, in.t.DType))
			continue
		}
		if err := in.t.Err(); err != nil {
			problems = append(problems, fmt.Sprintf("%s (from %s): %v", s.Name, in.file, err))
			continue
		}
		p.table = append(p.table, ggufpack.Tensor{Name: s.Name, Shape: slices.Clone(s.Shape), Type: importMark(s.Encoded)})
		p.src = append(p.src, in)
	}
	rank := map[string]int{}
	for _, ns := range nsOrder {
		rank[ns] = len(rank)
	}
	for _, s := range specs {
		if _, ok := rank[gguf.Namespace(s.Name)]; !ok {
			rank[gguf.Namespace(s.Name)] = len(rank)
		}
	}
	idx := make([]int, len(p.table))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ra, rb := rank[gguf.Namespace(p.table[idx[a]].Name)], rank[gguf.Namespace(p.table[idx[b]].Name)]
		if ra != rb {
			return ra < rb
		}
		return p.src[idx[a]].pos < p.src[idx[b]].pos
	})
	table, srcs := make([]ggufpack.Tensor, len(idx)), make([]importSource, len(idx))
	for i, j := range idx {
		table[i], srcs[i] = p.table[j], p.src[j]
	}
	p.table, p.src = table, srcs
	var extra []string
	for name, in := range src {
		if !used[name] {
			extra = append(extra, in.t.Name)
		}
	}
	sort.Strings(extra)
	p.skipped = append(p.skipped, extra...)
	if len(problems) > 0 {
		return fmt.Errorf("%d tensors do not fit the model: %s", len(problems), importListSome(problems, 10))
	}
	return nil
}

// importMark marks encoded tensors until finish's importStoredType pass: the table carries F16 as
// "encoded" and F32 as "keep F32".
func importMark(encoded bool) gguf.DType {
	if encoded {
		return gguf.F16
	}
	return gguf.F32
}

// applyDType turns the encoded marks of fromSpecs into stored types.
func (p *importPlan) applyDType(dt gguf.DType) {
	for i := range p.table {
		p.table[i].Type = importStoredType(p.table[i].Type == gguf.F16, p.table[i].Shape, dt)
	}
}

// inferMVC2Dims reads every width and depth of a MeanVC2 file from its tensor shapes (the
// packaged names), starting from the published model's structural constants.
func inferMVC2Dims(src map[string]importSource) (mvc2Dims, error) {
	d := mvc2Real()
	var problems []string
	dim := func(name string, i int) int {
		s, ok := src[name]
		if !ok || i >= len(s.t.Shape) {
			problems = append(problems, fmt.Sprintf("no %s", name))
			return 0
		}
		shape := s.t.Shape
		if s.transpose {
			shape = slices.Clone(shape)
			shape[len(shape)-2], shape[len(shape)-1] = shape[len(shape)-1], shape[len(shape)-2]
		}
		return shape[i]
	}
	count := func(prefix, suffix string) int {
		n := 0
		for {
			if _, ok := src[prefix+strconv.Itoa(n)+suffix]; !ok {
				return n
			}
			n++
		}
	}
	// vc: the DiT.
	v := &d.vc
	v.Dim = dim("vc/input_embed.proj.weight", 0)
	v.MelDim = dim("vc/proj_out.weight", 0)
	v.DimHead = dim("vc/transformer_blocks.0.attn.q_norm.weight", 0)
	if v.DimHead > 0 {
		v.Heads = dim("vc/transformer_blocks.0.attn.to_q.weight", 0) / v.DimHead
	}
	v.FF = dim("vc/transformer_blocks.0.ff.ff.0.0.weight", 0)
	if v.Dim > 0 {
		v.FFMult = v.FF / v.Dim
	}
	v.Depth = count("vc/transformer_blocks.", ".attn.to_q.weight")
	v.BNDim = dim("vc/temporal_timbre.q_proj.weight", 1)
	v.SpkDim = dim("vc/gtm.mlp_k.0.weight", 1)
	v.GTMSlots = dim("vc/gtm.k_prior", 0)
	v.GTMHidden = dim("vc/gtm.k_prior", 1)
	v.TVTAttnDim = dim("vc/temporal_timbre.q_proj.weight", 0)
	v.TimeFreqDim = dim("vc/t_time_embed.time_mlp.0.weight", 1)
	if v.Depth != len(v.PastChunks) {
		problems = append(problems, fmt.Sprintf("the DiT has %d blocks; the published per-layer masks are for %d", v.Depth, len(v.PastChunks)))
	}
	// asr: the conformer.
	a := &d.asr
	a.OutputSize = dim("asr/encoder.after_norm.weight", 0)
	a.Heads = dim("asr/encoder.encoders.0.self_attn.pos_bias_u", 0)
	a.LinearUnits = dim("asr/encoder.encoders.0.feed_forward.w_1.weight", 0)
	a.NumBlocks = count("asr/encoder.encoders.", ".self_attn.linear_q.weight")
	a.CNNKernel = dim("asr/encoder.encoders.0.conv_module.streaming_conv.depthwise_conv.weight", 2)
	a.SubsampleChannels = dim("asr/encoder.embed.conv.0.weight", 0)
	if in := dim("asr/encoder.embed.out.0.weight", 1); a.SubsampleChannels > 0 && in != a.SubsampleChannels*(((a.InputDim-1)/2-1)/2) {
		problems = append(problems, fmt.Sprintf("asr: embed.out.0 takes %d inputs, %d channels × the %d-bin fbank's %d subsampled bins give %d",
			in, a.SubsampleChannels, a.InputDim, ((a.InputDim-1)/2-1)/2, a.SubsampleChannels*(((a.InputDim-1)/2-1)/2)))
	}
	// vocos.
	d.vocos = vocos.Dims{
		Mels: dim("vocos/backbone.embed.weight", 1), Dim: dim("vocos/backbone.embed.weight", 0),
		Kernel: dim("vocos/backbone.embed.weight", 2), Inter: dim("vocos/backbone.convnext.0.pwconv1.weight", 0),
		Layers: count("vocos/backbone.convnext.", ".pwconv1.weight"), DWKernel: dim("vocos/backbone.convnext.0.dwconv.weight", 2),
		NFFT: dim("vocos/head.out.weight", 0) - 2,
	}
	// speaker_ecapa.
	e := ecapa.Dims{
		Layers: dim("speaker_ecapa/feature_weight", 0), Feat: dim("speaker_ecapa/layer1.conv.weight", 1),
		Channels: dim("speaker_ecapa/layer1.conv.weight", 0), Kernel1: dim("speaker_ecapa/layer1.conv.weight", 2),
		Scale: count("speaker_ecapa/layer2.Res2Conv1dReluBn.convs.", ".weight") + 1, Kernel: dim("speaker_ecapa/layer2.Res2Conv1dReluBn.convs.0.weight", 2),
		SE: dim("speaker_ecapa/layer2.SE_Connect.linear1.weight", 0), MFA: dim("speaker_ecapa/conv.weight", 0),
		Att: dim("speaker_ecapa/pooling.linear1.weight", 0), Emb: dim("speaker_ecapa/linear.weight", 0),
	}
	if s, ok := src["speaker_ecapa/layer2.SE_Connect.linear1.weight"]; ok && len(s.t.Shape) == 3 {
		e.SEConv = true
	}
	d.ecapa = e
	// speaker_wavlm.
	w := &d.wavlm
	nConv := count("speaker_wavlm/feature_extractor.conv_layers.", ".0.weight")
	if nConv != len(w.ConvDims) {
		problems = append(problems, fmt.Sprintf("speaker_wavlm: %d feature-extractor convolutions, WavLM has %d", nConv, len(w.ConvDims)))
	} else {
		for i := range nConv {
			w.ConvDims[i] = dim(fmt.Sprintf("speaker_wavlm/feature_extractor.conv_layers.%d.0.weight", i), 0)
			w.ConvKernels[i] = dim(fmt.Sprintf("speaker_wavlm/feature_extractor.conv_layers.%d.0.weight", i), 2)
		}
	}
	w.Hidden = dim("speaker_wavlm/encoder.layer_norm.weight", 0)
	w.FFN = dim("speaker_wavlm/encoder.layers.0.fc1.weight", 0)
	w.Layers = count("speaker_wavlm/encoder.layers.", ".fc1.weight")
	w.Heads = dim("speaker_wavlm/encoder.layers.0.self_attn.relative_attention_bias.weight", 1)
	w.NumBuckets = dim("speaker_wavlm/encoder.layers.0.self_attn.relative_attention_bias.weight", 0)
	w.PosConvKernel = dim("speaker_wavlm/encoder.pos_conv.0.weight_v", 2)
	if g := dim("speaker_wavlm/encoder.pos_conv.0.weight_v", 1); g > 0 {
		w.PosConvGroups = w.Hidden / g
	}
	if len(problems) > 0 {
		return d, fmt.Errorf("meanvc2: cannot read the model's dimensions: %s", importListSome(problems, 10))
	}
	return d, nil
}

// ---- MioCodec ----

var mioRoles = map[string]string{
	"weights":       "istft_head.out.weight",
	"wavlm_weights": "feature_extractor.conv_layers.0.0.weight",
}

func planMioCodec(f importFlags, log io.Writer) (*importPlan, error) {
	plan := &importPlan{kv: gguf.KV{}}
	side := func(rel string) bool {
		return strings.HasSuffix(rel, ".yaml") || strings.HasSuffix(rel, "/config.json")
	}
	inputs, err := importExpand(f.from, []string{"weights", "wavlm_weights", "config", "wavlm_config"}, side)
	if err != nil {
		return plan, err
	}
	var yamlPath string
	var wavlmConfigs []string
	for _, in := range inputs {
		switch {
		case in.role == "config" || in.role == "" && strings.HasSuffix(in.path, ".yaml"):
			if yamlPath != "" && yamlPath != in.path {
				return plan, fmt.Errorf("two config.yaml files: %s and %s (name one with config=FILE)", yamlPath, in.path)
			}
			yamlPath = in.path
		case in.role == "wavlm_config" || in.role == "" && filepath.Base(in.path) == "config.json":
			wavlmConfigs = append(wavlmConfigs, in.path)
		}
	}
	if yamlPath == "" {
		return plan, errors.New("miocodec: no config.yaml (give the model folder, or config=FILE)")
	}
	yml, err := os.ReadFile(yamlPath)
	if err != nil {
		return plan, err
	}
	if _, err := miocodec.ParseConfig(yml); err != nil {
		return plan, err
	}
	found, err := importOpenRoles(inputs, mioRoles, plan, log)
	if err != nil {
		return plan, err
	}
	chosen := map[string]importRoleFile{}
	for _, role := range []string{"weights", "wavlm_weights"} {
		if len(found[role]) == 0 {
			return plan, fmt.Errorf("miocodec: no %s checkpoint (one with …%s): give model.safetensors and wavlm-base-plus-mlx/weights.safetensors", role, mioRoles[role])
		}
		rf, err := importPickRole(role, found[role], "")
		if err != nil {
			return plan, err
		}
		chosen[role] = rf
	}
	if chosen["weights"].c == chosen["wavlm_weights"].c {
		return plan, errors.New("miocodec: the codec and WavLM tensors are in one file; give them as weights=FILE and wavlm_weights=FILE")
	}
	// The tables of the published model say which tensors the engine keeps encoded.
	encoded := map[string]bool{}
	for _, s := range namespaced("weights", miocodec.RealTensors()) {
		encoded[s.Name] = s.Encoded
	}
	wl := wavlm.RealBasePlus()
	wlSpecs := map[string][]int{}
	for _, s := range namespaced("wavlm_weights", wl.Tensors()) {
		encoded[s.Name] = s.Encoded
		wlSpecs[s.Name] = s.Shape
	}
	var unknown []string
	for _, role := range []string{"weights", "wavlm_weights"} {
		rf := chosen[role]
		for _, t := range rf.c.Tensors {
			rest, ok := strings.CutPrefix(t.Name, rf.prefix)
			if !ok || strings.HasSuffix(rest, "num_batches_tracked") {
				plan.skipped = append(plan.skipped, t.Name)
				continue
			}
			s := importSource{t: t, file: filepath.Base(rf.path)}
			if role == "wavlm_weights" {
				rest = wavlmRename(rest)
				s.transpose = importMLXConv(rest, t.Shape)
			}
			name := role + "/" + rest
			if _, known := encoded[name]; !known && !strings.Contains(name, ".layers.") {
				unknown = append(unknown, name)
			}
			if !t.DType.IsFloat() {
				return plan, fmt.Errorf("miocodec: %s (from %s) is %s (F32, F16 and BF16 are read)", t.Name, s.file, t.DType)
			}
			if err := t.Err(); err != nil {
				return plan, fmt.Errorf("miocodec: %s (from %s): %w", t.Name, s.file, err)
			}
			shape := slices.Clone(t.Shape)
			if s.transpose {
				shape[1], shape[2] = shape[2], shape[1]
			}
			plan.table = append(plan.table, ggufpack.Tensor{Name: name, Shape: shape, Type: importMark(encoded[name] || importLayerEncoded(name, encoded))})
			plan.src = append(plan.src, s)
		}
	}
	if len(unknown) > 0 {
		fmt.Fprintf(log, "warning: %d tensors are not in the published MioCodec table (packaged as they are): %s\n", len(unknown), importListSome(unknown, 6))
	}
	plan.files = []gguf.EmbeddedFile{{Name: "config.yaml", Data: yml}}
	wdir := filepath.Dir(chosen["wavlm_weights"].path)
	for _, p := range wavlmConfigs {
		if filepath.Dir(p) == wdir || len(wavlmConfigs) == 1 {
			raw, err := os.ReadFile(p)
			if err != nil {
				return plan, err
			}
			plan.files = append(plan.files, gguf.EmbeddedFile{Name: "wavlm-base-plus-mlx/config.json", Data: raw})
			break
		}
	}
	if plan.spec, err = gguf.FamilySpec("miocodec", ""); err != nil {
		return plan, err
	}
	weightsSrc := filepath.Base(chosen["weights"].path)
	wavlmSrc := filepath.Base(wdir) + "/" + filepath.Base(chosen["wavlm_weights"].path)
	if err := errors.Join(plan.spec.SetSource("weights", weightsSrc), plan.spec.SetSource("wavlm_weights", wavlmSrc)); err != nil {
		return plan, err
	}
	name := filepath.Base(filepath.Dir(chosen["weights"].path))
	if name == "." || name == "/" {
		name = "miocodec"
	}
	if err := errors.Join(plan.kv.Set("general.name", name), plan.kv.Set("audiocpp.source_format", "packed")); err != nil {
		return plan, err
	}
	plan.desc = fmt.Sprintf("miocodec (%d codec tensors, %d WavLM tensors)", len(chosen["weights"].c.Tensors), len(chosen["wavlm_weights"].c.Tensors))
	fmt.Fprintf(log, "weights:       %s\nwavlm_weights: %s\nconfig:        %s\n", chosen["weights"].path, chosen["wavlm_weights"].path, yamlPath)
	return plan, nil
}

// importLayerEncoded reports whether a layer tensor beyond the published depth (a model with more
// layers) is encoded like the same tensor of layer 0.
func importLayerEncoded(name string, encoded map[string]bool) bool {
	i := strings.Index(name, ".layers.")
	if i < 0 {
		return false
	}
	rest := name[i+len(".layers."):]
	j := strings.IndexByte(rest, '.')
	if j < 0 {
		return false
	}
	return encoded[name[:i]+".layers.0"+rest[j:]]
}

// importMLXConv reports whether a WavLM convolution weight is in MLX's [out, kernel, in] layout
// (mlx-community conversions store them so) rather than PyTorch's [out, in, kernel]: the
// feature extractor's first conv has one input channel and a kernel of 10, the positional
// conv a kernel of 128.
func importMLXConv(name string, shape []int) bool {
	if len(shape) != 3 {
		return false
	}
	switch {
	case name == "feature_extractor.conv_layers.0.0.weight":
		return shape[2] == 1 && shape[1] > 1
	case name == "encoder.pos_conv.0.weight_v":
		return shape[1] == 128 && shape[2] != 128
	case strings.HasPrefix(name, "feature_extractor.conv_layers."):
		return shape[1] < shape[2] && shape[1] <= 10
	}
	return false
}

// ---- MioTTS ----

// miottsFiles are the sidecar files the MioTTS loader reads, in the published file's order
// (tokenizer.json is optional).
var miottsFiles = []string{"config.json", "generation_config.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.json"}

func planMioTTS(f importFlags, log io.Writer) (*importPlan, error) {
	plan := &importPlan{kv: gguf.KV{}}
	side := func(rel string) bool { return slices.Contains(miottsFiles, rel) }
	inputs, err := importExpand(f.from, []string{"weights"}, side)
	if err != nil {
		return plan, err
	}
	sides := map[string]string{}
	var ckpts []importInput
	for _, in := range inputs {
		b := filepath.Base(in.path)
		if in.role == "" && slices.Contains(miottsFiles, b) {
			if prev, ok := sides[b]; ok && prev != in.path {
				return plan, fmt.Errorf("two %s: %s and %s", b, prev, in.path)
			}
			sides[b] = in.path
			continue
		}
		ckpts = append(ckpts, in)
	}
	for _, need := range miottsFiles[:5] {
		if _, ok := sides[need]; !ok {
			return plan, fmt.Errorf("miotts: no %s (give the model folder: config.json, generation_config.json, tokenizer_config.json, vocab.json, merges.txt and the weights)", need)
		}
	}
	for _, name := range miottsFiles {
		p, ok := sides[name]
		if !ok {
			continue
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return plan, err
		}
		plan.files = append(plan.files, gguf.EmbeddedFile{Name: name, Data: raw})
	}
	cfg, err := qwen3.ParseConfig(plan.files[0].Data)
	if err != nil {
		return plan, err
	}
	found, err := importOpenRoles(ckpts, map[string]string{"weights": "layers.0.self_attn.q_proj.weight"}, plan, log)
	if err != nil {
		return plan, err
	}
	if len(found["weights"]) == 0 {
		return plan, errors.New("miotts: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)")
	}
	rf, err := importPickRole("weights", found["weights"], "")
	if err != nil {
		return plan, err
	}
	// HF Qwen3 keys are model.layers.N…; the anchor's prefix is "model.".
	src := map[string]importSource{}
	base := strings.TrimSuffix(rf.prefix, "model.")
	for pos, t := range rf.c.Tensors {
		rest, ok := strings.CutPrefix(t.Name, base)
		if !ok {
			plan.skipped = append(plan.skipped, t.Name)
			continue
		}
		if rest == "lm_head.weight" && cfg.TieEmbed {
			plan.skipped = append(plan.skipped, t.Name+" (tied to model.embed_tokens)")
			continue
		}
		src[rest] = importSource{t: t, file: filepath.Base(rf.path), pos: pos}
	}
	if err := plan.fromSpecs(cfg.Tensors(), src); err != nil {
		return plan, fmt.Errorf("miotts: %w", err)
	}
	if plan.spec, err = gguf.FamilySpec("miotts", ""); err != nil {
		return plan, err
	}
	if err := plan.spec.SetSource("", filepath.Base(rf.path)); err != nil {
		return plan, err
	}
	name := filepath.Base(filepath.Dir(sides["config.json"]))
	if name == "." || name == "/" {
		name = "miotts"
	}
	format := "safetensors"
	if rf.c.Format != "safetensors" && rf.c.Format != "safetensors-sharded" {
		format = rf.c.Format
	}
	if err := errors.Join(plan.kv.Set("general.name", name), plan.kv.Set("audiocpp.source_format", format)); err != nil {
		return plan, err
	}
	plan.desc = fmt.Sprintf("miotts (Qwen3 %d layers × %d, vocabulary %d)", cfg.Layers, cfg.Hidden, cfg.Vocab)
	fmt.Fprintf(log, "weights: %s (%s)\nconfig:  %s\n", rf.path, rf.c.Format, sides["config.json"])
	return plan, nil
}
