package meanvc2

import (
	"slices"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	goldendata "github.com/voxpipe/voxpipe/internal/golden"
)

// TestLoadWithSpeakerBackend: the speaker path on its own backend gives the same embedding
// and the same converted audio, and can run while a stream converts.
func TestLoadWithSpeakerBackend(t *testing.T) {
	path := goldendata.Path(t, "meanvc2", "model.gguf")
	newBE := func() engine.Backend {
		be, err := engine.NewCPU(1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(be.Close)
		return be
	}
	one, err := Load(path, newBE())
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	two, err := LoadWith(path, newBE(), newBE())
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close()
	clip := SyntheticSpeech(3*16000, 16000, 1)
	e1, err1 := one.SpeakerEmbedding(clip, 16000)
	e2, err2 := two.SpeakerEmbedding(clip, 16000)
	if err1 != nil || err2 != nil || !slices.Equal(e1, e2) {
		t.Fatalf("embeddings differ (%v, %v)", err1, err2)
	}
	tb, err := two.Timbre(e2)
	if err != nil {
		t.Fatal(err)
	}
	st, err := two.NewStream(tb)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Embed on the speaker backend while the stream converts on the other.
	done := make(chan error, 1)
	go func() {
		_, err := two.SpeakerEmbedding(SyntheticSpeech(5*16000, 16000, 2), 16000)
		done <- err
	}()
	in := SyntheticSpeech(2*16000, 16000, 3)
	var out []float32
	for i := 0; i+st.ChunkSize() <= len(in); i += st.ChunkSize() {
		if out, err = st.Process(out, in[i:i+st.ChunkSize()]); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Error("no audio while embedding")
	}
}
