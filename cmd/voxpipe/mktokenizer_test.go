package main

import (
	"testing"

	"github.com/voxpipe/voxpipe/models/bpe"
	"github.com/voxpipe/voxpipe/models/qwen3"
)

// loadMadeTokenizer loads the tokenizer files mkmodel embeds in a MioTTS model of size.
func loadMadeTokenizer(t *testing.T, size string) *bpe.Tokenizer {
	t.Helper()
	files, err := byteLevelTokenizer(qwen3.Sizes[size], size)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{}
	for _, f := range files {
		data[f.Name] = f.Data
	}
	tok, err := bpe.Load(data["vocab.json"], data["merges.txt"], data["tokenizer_config.json"])
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestMadeTokenizerCompressesEnglish: a real-size random model's tokenizer gives English
// about the token count of a real one (the bench sentence: a token a word and one a full
// stop, 15 for 73 bytes), text outside its corpus still round-trips and shrinks, and the chat and
// speech tokens keep their ids; a tiny model's stays one token a byte.
func TestMadeTokenizerCompressesEnglish(t *testing.T) {
	tok := loadMadeTokenizer(t, "0.6b")
	const bench = "Thank you for calling. Your order has shipped and will arrive on Tuesday."
	ids := tok.Encode(bench)
	if len(ids) > 18 {
		t.Errorf("%q: %d tokens, want at most 18 (≈ a word each)", bench, len(ids))
	}
	for _, text := range []string{bench, "Zebras quickly vexed the unusual jury, 42 times! ünïcödé", "  two  spaces\nand a line"} {
		ids := tok.Encode(text)
		if got := tok.Decode(ids); got != text {
			t.Errorf("%q decodes back as %q", text, got)
		}
		if text != bench && len(ids) >= len(text) {
			t.Errorf("%q: %d tokens for %d bytes, want fewer", text, len(ids), len(text))
		}
	}
	for id, want := range map[int]string{151644: "<|im_start|>", 151645: "<|im_end|>", 151669: "<|s_0|>", 151669 + 12799: "<|s_12799|>"} {
		if got, ok := tok.Token(id); !ok || got != want {
			t.Errorf("token %d is %q, want %q", id, got, want)
		}
	}
	tiny := loadMadeTokenizer(t, "tiny")
	if n := len(tiny.Encode(bench)); n != len(bench) {
		t.Errorf("tiny tokenizer: %d tokens for %d bytes, want one a byte", n, len(bench))
	}
}

// TestEnglishMergesDeterministic: the merges are learnt the same way every time (a model
// made twice with one seed is the same file).
func TestEnglishMergesDeterministic(t *testing.T) {
	a, b := englishMerges(), englishMerges()
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("%d and %d merges", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("merge %d: %v, then %v", i, a[i], b[i])
		}
	}
}
