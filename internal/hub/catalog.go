// Package hub fetches the published model files (GGUF) from a Hugging Face style hub into a
// local cache, and maps the short names users type (meanvc2, miotts-1.7b-q8_0, miocodec …) to
// those cached files.
//
// The files are audio.cpp's packages in the Hugging Face repository audio-cpp/audio.cpp-gguf:
// file names as audio.cpp's model_specs/{miotts,miocodec}.json list them (and
// ../shared/reference/audiocpp.md §2.1 and §3.1 for MeanVC2). Models that are only published
// as original checkpoints have an entry too: pulling one prints the `voxpipe import` command
// that builds it.
package hub

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const (
	// DefaultHub is the hub's base URL; files are at {hub}/{repo}/resolve/main/{path}.
	DefaultHub = "https://huggingface.co"
	// Repo is the repository audio.cpp publishes its GGUF packages in.
	Repo = "audio-cpp/audio.cpp-gguf"
)

// Model is one catalog entry.
type Model struct {
	Name   string // what users type: voxpipe pull NAME, --vc-model NAME
	Family string // meanvc2, miotts or miocodec
	Repo   string // hub repository ("" for Import entries)
	Path   string // file in Repo; "" when the model is not published as GGUF (see Import)
	File   string // the file's name in the cache directory
	// Size is the file's size in bytes: exact for the MeanVC2 files, otherwise an estimate
	// from the tensor shapes, on the high side. A download larger than 1.5 × Size is refused.
	Size  int64
	About string // what it is for, one line
	Use   string // how to use it once pulled (flags)
	// Import, for a model published only as original checkpoints: how to build the GGUF.
	Import *Import
}

// Import tells how to build a model file from its original checkpoints with voxpipe import.
type Import struct {
	Sources string // where the originals come from, for the hint
	From    string // what --from names in the printed command
	DType   string // --dtype
}

// Published reports whether the hub has the file (otherwise it is built with voxpipe import).
func (m Model) Published() bool { return m.Path != "" }

// URL is the file's download address on hub (Hugging Face layout).
func (m Model) URL(hub string) string {
	return strings.TrimRight(hub, "/") + "/" + m.Repo + "/resolve/main/" + m.Path
}

// CachePath is where the file lives in the cache directory dir.
func (m Model) CachePath(dir string) string { return filepath.Join(dir, m.File) }

// ImportCommand is the voxpipe import command that builds an Import entry's file into dir.
func (m Model) ImportCommand(dir string) string {
	if m.Import == nil {
		return ""
	}
	return fmt.Sprintf("voxpipe import --family %s --from %s --out %s --dtype %s",
		m.Family, m.Import.From, m.CachePath(dir), m.Import.DType)
}

var catalog = []Model{
	{
		Name: "meanvc2", Family: "meanvc2", Repo: Repo,
		Path: "MeanVC2-GGUF/meanvc2-120ms-40ms-fp32.gguf", File: "meanvc2-120ms-40ms-fp32.gguf",
		// Size of the published file (hub revision 83c5d96c, as recorded in a third-party
		// survey of the repository); audio.cpp's default MeanVC2 package.
		Size:  1_629_326_784,
		About: "MeanVC2 voice conversion, 120 ms + 40 ms model (quality), fp32; the pick for CPU",
		Use:   "voxpipe serve --vc-model meanvc2 (or convert/bridge --model meanvc2 --ref REF.wav)",
	},
	{
		Name: "meanvc2-q4_k", Family: "meanvc2", Repo: Repo,
		Path: "MeanVC2-GGUF/meanvc2-120ms-40ms-q4_k.gguf", File: "meanvc2-120ms-40ms-q4_k.gguf",
		Size:  342_368_032,
		About: "the same MeanVC2 model quantised to Q4_K: a fifth of the download and half the memory of fp32 (kept Q4_K when loaded)",
		Use:   "voxpipe serve --vc-model meanvc2-q4_k (or convert/bridge --model meanvc2-q4_k --ref REF.wav)",
	},
	{
		// audio.cpp ships only the 120 ms variant (reference §2.1): the 40 ms one comes from
		// the original checkpoints in ASLP-lab/MeanVC2.
		Name: "meanvc2-40ms", Family: "meanvc2", File: "meanvc2-40ms-40ms-fp32.gguf",
		Size:  1_700_000_000,
		About: "MeanVC2 40 ms + 40 ms model (low latency), fp32; not published as GGUF: built with voxpipe import",
		Use:   "voxpipe serve --vc-model meanvc2-40ms (both variants: --vc-model meanvc2,meanvc2-40ms)",
		Import: &Import{
			Sources: "meanvc2_40ms_40ms.safetensors, fastu2pp_80ms.pt and vocos.pt from https://huggingface.co/ASLP-lab/MeanVC2, " +
				"and wavlm_large_finetune.pth (the UniSpeech WavLM-Large + ECAPA-TDNN speaker-verification fine-tune, on Google Drive, not on the hub)",
			From:  "MEANVC2_DIR",
			DType: "f32",
		},
	},
	{
		Name: "miotts-1.7b-q8_0", Family: "miotts", Repo: Repo,
		Path: "MioTTS-1.7B-GGUF/miotts-1.7b-q8_0.gguf", File: "miotts-1.7b-q8_0.gguf",
		// Estimate: 1.4 G weights at 8.5 bits plus the F16 embedding table; 1.9–2.5 GB.
		Size:  2_200_000_000,
		About: "MioTTS 1.7B text to speech (English, Japanese), Q8_0; the pick for CPU; needs a codec (miocodec)",
		Use:   "voxpipe serve --tts-model miotts-1.7b-q8_0 --codec miocodec (or tts --model miotts-1.7b-q8_0 --codec miocodec)",
	},
	{
		Name: "miotts-1.7b-bf16", Family: "miotts", Repo: Repo,
		Path: "MioTTS-1.7B-GGUF/miotts-1.7b-bf16.gguf", File: "miotts-1.7b-bf16.gguf",
		Size:  3_500_000_000, // estimate: 1.74 G weights × 2 bytes
		About: "MioTTS 1.7B, BF16: closer to the original than Q8_0, twice the memory traffic",
		Use:   "voxpipe serve --tts-model miotts-1.7b-bf16 --codec miocodec",
	},
	{
		Name: "miotts-1.7b-orig", Family: "miotts", Repo: Repo,
		Path: "MioTTS-1.7B-GGUF/miotts-1.7b-orig.gguf", File: "miotts-1.7b-orig.gguf",
		// Estimate on the high side: the checkpoint's own dtype, f32 judging by audio.cpp's
		// docs/gguf.md (its 16-bit file "drifts" from it); 3.5 GB if it is bf16 after all.
		Size:  7_000_000_000,
		About: "MioTTS 1.7B in the checkpoint's own dtype (the reference; largest)",
		Use:   "voxpipe serve --tts-model miotts-1.7b-orig --codec miocodec-f16",
	},
	{
		// audio.cpp packages only MioTTS-1.7B (reference §3.1): 0.6B comes from Aratako's
		// original checkpoint.
		Name: "miotts-0.6b-q8_0", Family: "miotts", File: "miotts-0.6b-q8_0.gguf",
		Size:  750_000_000,
		About: "MioTTS 0.6B, Q8_0: faster, smaller; not published as GGUF: built with voxpipe import",
		Use:   "voxpipe serve --tts-model miotts-0.6b-q8_0 --codec miocodec",
		Import: &Import{
			Sources: "https://huggingface.co/Aratako/MioTTS-0.6B (model.safetensors, config.json, generation_config.json, " +
				"tokenizer_config.json, vocab.json, merges.txt), e.g. huggingface-cli download Aratako/MioTTS-0.6B --local-dir MioTTS-0.6B",
			From:  "MioTTS-0.6B",
			DType: "q8_0",
		},
	},
	{
		Name: "miocodec", Family: "miocodec", Repo: Repo,
		Path: "MioCodec-25Hz-44.1kHz-v2-GGUF/miocodec-25hz-44khz-v2-q8_0.gguf", File: "miocodec-25hz-44khz-v2-q8_0.gguf",
		Size:  310_000_000, // estimate (codec + WavLM-Base+ at Q8_0)
		About: "MioCodec 25 Hz 44.1 kHz v2, Q8_0: the codec (and speaker encoder) MioTTS speaks through",
		Use:   "--codec miocodec (with --tts-model)",
	},
	{
		Name: "miocodec-f16", Family: "miocodec", Repo: Repo,
		Path: "MioCodec-25Hz-44.1kHz-v2-GGUF/miocodec-25hz-44khz-v2-f16.gguf", File: "miocodec-25hz-44khz-v2-f16.gguf",
		Size:  500_000_000, // estimate
		About: "MioCodec v2, F16: a little closer to the original codec than Q8_0",
		Use:   "--codec miocodec-f16 (with --tts-model)",
	},
}

// Catalog returns the known models in display order.
func Catalog() []Model {
	out := make([]Model, len(catalog))
	copy(out, catalog)
	return out
}

// Lookup finds a catalog entry by name.
func Lookup(name string) (Model, bool) {
	for _, m := range catalog {
		if m.Name == name {
			return m, true
		}
	}
	return Model{}, false
}

// Names lists the catalog's names.
func Names() []string {
	names := make([]string, len(catalog))
	for i, m := range catalog {
		names[i] = m.Name
	}
	return names
}

// Dir is the model cache directory: $VOXPIPE_MODELS, else voxpipe/models in the user's
// cache directory (~/.cache on Linux).
func Dir() (string, error) {
	if d := os.Getenv("VOXPIPE_MODELS"); d != "" {
		return d, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no model cache directory (%v): set VOXPIPE_MODELS", err)
	}
	return filepath.Join(c, "voxpipe", "models"), nil
}

// ErrNotPulled is what Resolve's error wraps when a catalog name's file is not in the cache.
var ErrNotPulled = errors.New("not in the model cache")

// Resolve maps the value of a flag that takes a model file: an existing path stays as it is;
// a catalog name becomes its cached file, or an error that says to pull it first; anything
// else stays as it is (the loader then reports the missing file).
func Resolve(value string) (string, error) {
	if value == "" {
		return value, nil
	}
	if _, err := os.Stat(value); err == nil {
		return value, nil
	}
	m, ok := Lookup(value)
	if !ok {
		return value, nil
	}
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	p := m.CachePath(dir)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if !m.Published() {
		return "", fmt.Errorf("%s is %w (%s): it is built with voxpipe import; run `voxpipe pull %s` first for the command", m.Name, ErrNotPulled, p, m.Name)
	}
	return "", fmt.Errorf("%s is %w (%s): run `voxpipe pull %s` first", m.Name, ErrNotPulled, p, m.Name)
}
