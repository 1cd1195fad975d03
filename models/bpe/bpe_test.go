package bpe

import (
	"fmt"
	"github.com/voxpipe/voxpipe/internal/golden"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// goldenDir returns the MioTTS golden folder, or skips the test when it is absent.
func goldenDir(tb testing.TB) string {
	tb.Helper()
	golden.Path(tb, "miotts", "model.gguf")
	golden.Path(tb, "miotts", "cases.gguf")
	return golden.Path(tb, "miotts")
}

var (
	goldenOnce sync.Once
	goldenTok  *Tokenizer
	goldenErr  error
)

func goldenTokenizer(tb testing.TB) *Tokenizer {
	tb.Helper()
	d := goldenDir(tb)
	goldenOnce.Do(func() {
		m, err := gguf.OpenModel(filepath.Join(d, "model.gguf"))
		if err != nil {
			goldenErr = err
			return
		}
		defer m.Close()
		goldenTok, goldenErr = FromModel(m)
	})
	if goldenErr != nil {
		tb.Fatal(goldenErr)
	}
	return goldenTok
}

func readI32(tb testing.TB, m *gguf.Model, name string) []int {
	tb.Helper()
	v, _, err := m.GetInt32(name)
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func TestGoldenCases(t *testing.T) {
	tok := goldenTokenizer(t)
	cf, err := gguf.OpenModel(filepath.Join(goldenDir(t), "cases.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	count, err := cf.File.KV.Int("tok.count")
	if err != nil {
		t.Fatal(err)
	}
	if count != 34 {
		t.Errorf("tok.count = %d, MANIFEST lists 34 cases", count)
	}
	checkedNoNFC := 0
	defer func() { t.Logf("%d golden tokenizer cases, %d with ids_no_nfc", count, checkedNoNFC) }()
	for i := 0; i < int(count); i++ {
		key := fmt.Sprintf("tok.%02d", i)
		text, err := cf.File.KV.String(key + ".text")
		if err != nil {
			t.Fatal(err)
		}
		want := readI32(t, cf, key+".ids")
		wantPieces, err := cf.File.KV.Strings(key + ".pieces")
		if err != nil {
			t.Fatal(err)
		}
		got := tok.Encode(text)
		if !slices.Equal(got, want) {
			t.Errorf("%s %q:\n got  %v %q\n want %v %q", key, text, got, tok.Pieces(text), want, wantPieces)
			continue
		}
		if p := tok.Pieces(text); !slices.Equal(p, wantPieces) {
			t.Errorf("%s %q: pieces %q, want %q", key, text, p, wantPieces)
		}
		if dec := tok.Decode(got); dec != NFC(text) {
			t.Errorf("%s: Decode(Encode(text)) = %q, want NFC(text) %q", key, dec, NFC(text))
		}
		if cf.Has(key + ".ids_no_nfc") {
			checkedNoNFC++
			wantRaw := readI32(t, cf, key+".ids_no_nfc")
			if NFC(text) == text {
				t.Errorf("%s: has ids_no_nfc but NFC does not change %q", key, text)
			}
			// Encoding the text with NFC bypassed must give the no-NFC ids.
			var st encState
			var raw []int
			for _, sp := range splitAppend(nil, text) {
				raw = tok.bpe(raw, text[sp[0]:sp[1]], &st)
			}
			if !slices.Equal(raw, wantRaw) {
				t.Errorf("%s: without NFC got %v, want %v", key, raw, wantRaw)
			}
		}
	}
}

func TestSpeechTokens(t *testing.T) {
	tok := goldenTokenizer(t)
	start, ok := tok.TokenID("<|s_0|>")
	if !ok {
		t.Fatal("<|s_0|> is not a token")
	}
	for _, n := range []int{0, 1, 12, 123, 9999, 12799} {
		s := fmt.Sprintf("<|s_%d|>", n)
		if got := tok.Encode(s); !slices.Equal(got, []int{start + n}) {
			t.Errorf("Encode(%q) = %v, want [%d]", s, got, start+n)
		}
	}
	var sb strings.Builder
	var want []int
	for n := 0; n < 12800; n += 37 {
		fmt.Fprintf(&sb, "<|s_%d|>", n)
		want = append(want, start+n)
	}
	ids := tok.Encode(sb.String())
	if !slices.Equal(ids, want) {
		t.Fatalf("speech run: got %d ids, want %d", len(ids), len(want))
	}
	if got := tok.DecodeSkipSpecial(append([]int{757}, ids...)); got != sb.String() {
		t.Errorf("DecodeSkipSpecial dropped speech tokens or kept <|im_start|>")
	}
	if !tok.IsSpecial(758) || tok.IsSpecial(start) {
		t.Errorf("special flags: IsSpecial(758)=%v IsSpecial(%d)=%v", tok.IsSpecial(758), start, tok.IsSpecial(start))
	}
	// Not added tokens: go through BPE (several ids).
	for _, s := range []string{"<|s_12800|>", "<|s_|>", "<|im_start|"} {
		if ids := tok.Encode(s); len(ids) < 2 {
			t.Errorf("Encode(%q) = %v, want a BPE split", s, ids)
		}
	}
}

// randomText returns a string mixing ASCII, whitespace, newlines, CJK, combining marks,
// emoji, numbers of several scripts and added-token fragments.
func randomText(r *rand.Rand, n int) string {
	pools := []string{
		"abcXYZ", " ", "  \t", "\r\n", "\n", "0123456789", ".,;:!?'\"-()[]{}<>|_",
		"'s'T're'VE'm'll'D", "ÜnïcödéàçßñØ", "e\u0301a\u0308o\u0302\u0323", "こんにちは世界カタカナ",
		"ｶﾀｶﾅ１２３", "①½Ⅻ", "😀🎉👍🏽❤️", "\u3000\u00a0\u2009\u2028\u0085", "Привет", "한국어\u1100\u1161\u11a8",
		"<|s_", "|>", "<|im_start|>", "<|s_42|>", "\u0000\x7f", "ſ", "٣٤", "ǅ",
	}
	var sb strings.Builder
	for sb.Len() < n {
		p := []rune(pools[r.IntN(len(pools))])
		k := 1 + r.IntN(4)
		for j := 0; j < k; j++ {
			sb.WriteRune(p[r.IntN(len(p))])
		}
		if r.IntN(20) == 0 {
			sb.WriteRune(rune(r.IntN(0x30000)))
		}
	}
	return sb.String()
}

// normalizedText is what Encode tokenizes: NFC of the text between added tokens.
func (t *Tokenizer) normalizedText(s string) string {
	var sb strings.Builder
	start := 0
	for i := 0; i < len(s); {
		_, n := t.matchAdded(s, i)
		if n == 0 {
			i++
			continue
		}
		sb.WriteString(NFC(s[start:i]))
		sb.WriteString(s[i : i+n])
		i += n
		start = i
	}
	sb.WriteString(NFC(s[start:]))
	return sb.String()
}

func TestRoundTripRandom(t *testing.T) {
	tok := goldenTokenizer(t)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		s := randomText(r, 1+r.IntN(80))
		ids := tok.Encode(s)
		want := tok.normalizedText(s)
		if got := tok.Decode(ids); got != want {
			t.Fatalf("round trip of %q: got %q, want %q (ids %v)", s, got, want, ids)
		}
		if NFC(s) == s && !strings.Contains(s, "<|") {
			if got := tok.Decode(ids); got != s {
				t.Fatalf("round trip of NFC text %q: got %q", s, got)
			}
		}
	}
}

func TestPretokenize(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"I'm LOUD'S", []string{"I", "'m", " LOUD", "'S"}},
		{"'sure", []string{"'s", "ure"}},
		{"has 365 days", []string{"has", " ", "3", "6", "5", " days"}},
		{"a   b", []string{"a", "  ", " b"}},
		{"end   ", []string{"end", "   "}},
		{"x\n\ny", []string{"x", "\n\n", "y"}},
		{"\r\n windows\r\nnew \n\n\n", []string{"\r\n", " windows", "\r\n", "new", " \n\n\n"}},
		{"f(x): return x**2", []string{"f", "(x", "):", " return", " x", "**", "2"}},
		{"!!!???...,,, --- ~~~", []string{"!!!???...,,,", " ---", " ~~~"}},
		{"a.\n\nb", []string{"a", ".\n\n", "b"}},
		{"\t\tdef", []string{"\t", "\tdef"}},
		{"全角　の", []string{"全角", "　の"}},
		{"-42", []string{"-", "4", "2"}},
		{"x \u3000 y", []string{"x", " \u3000", " y"}},
		{" \x80a", []string{" \x80", "a"}},
	}
	for _, c := range cases {
		if got := Pretokenize(c.in); !slices.Equal(got, c.want) {
			t.Errorf("Pretokenize(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestNFC(t *testing.T) {
	cases := [][2]string{
		{"cafe\u0301", "café"},
		{"A\u030A", "Å"},
		{"\u212B", "Å"},                  // singleton decomposition
		{"o\u0323\u0302", "ộ"},           // reordered, then composed
		{"o\u0302\u0323", "ộ"},           // same, other order
		{"\u1100\u1161\u11A8", "각"},      // Hangul LVT
		{"가\u11A8", "각"},                 // LV + T
		{"a\u0301\u0301", "á\u0301"},     // second mark blocked
		{"\u0344", "\u0308\u0301"},       // non-starter decomposition
		{"e\u0301\xffe\u0301", "é\xffé"}, // invalid byte kept
		{"ｶﾀｶﾅ", "ｶﾀｶﾅ"},                 // compatibility forms untouched
		{"\u0958", "\u0915\u093C"},       // composition exclusion
		{"plain ascii", "plain ascii"},
	}
	for _, c := range cases {
		if got := NFC(c[0]); got != c[1] {
			t.Errorf("NFC(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}

func TestDecodeInvalidUTF8(t *testing.T) {
	for _, c := range [][2]string{
		{"a\xffb", "a\uFFFDb"},
		{"\xe3\x81", "\uFFFD"},
		{"\xe3\x81a", "\uFFFDa"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"},
		{"\xf0\x9f\x98", "\uFFFD"},
	} {
		if got := toValidUTF8([]byte(c[0])); got != c[1] {
			t.Errorf("toValidUTF8(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}

// tinyFiles returns a small valid tokenizer description.
func tinyFiles() (vocab, merges, cfg string) {
	var sb strings.Builder
	sb.WriteString("{")
	for b := 0; b < 256; b++ {
		fmt.Fprintf(&sb, "%q:%d,", string(byteToSym[b]), b)
	}
	sb.WriteString(`"ab":256,"abc":257}`)
	return sb.String(), "#version: 0.2\na b\nab c\n",
		`{"added_tokens_decoder":{"258":{"content":"<x>","special":true},"259":{"content":"<xy>","special":false}}}`
}

func TestLoadTiny(t *testing.T) {
	v, m, c := tinyFiles()
	tok, err := Load([]byte(v), []byte(m), []byte(c))
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("abc<xy>ab<x>"); !slices.Equal(got, []int{257, 259, 256, 258}) {
		t.Errorf("Encode = %v", got)
	}
	if got := tok.DecodeSkipSpecial([]int{257, 259, 258, 99999, -1}); got != "abc<xy>" {
		t.Errorf("DecodeSkipSpecial = %q", got)
	}
	if tok.VocabSize() != 260 {
		t.Errorf("VocabSize = %d", tok.VocabSize())
	}
}

func TestLoadErrors(t *testing.T) {
	v, m, c := tinyFiles()
	cases := []struct {
		name          string
		vocab, merges string
		cfg           string
		want          string
	}{
		{"bad json", "{", m, c, "vocab.json"},
		{"empty vocab", "{}", m, c, "empty vocabulary"},
		{"missing bytes", `{"a":0}`, "", "", "byte symbol"},
		{"negative id", strings.Replace(v, `"abc":257`, `"abc":-3`, 1), m, c, "out of range"},
		{"duplicate id", strings.Replace(v, `"abc":257`, `"abc":256`, 1), m, c, "used by both"},
		{"not byte symbols", strings.Replace(v, `"abc":257`, `"a c":257`, 1), m, c, "not a byte symbol"},
		{"merge arity", v, "a b c\n", c, "line 1"},
		{"merge unknown symbol", v, "#version: 0.2\na ac\n", c, `symbol "ac"`},
		{"merge result missing", v, "b a\n", c, `merged token "ba"`},
		{"bad config", v, m, "[", "tokenizer_config.json"},
		{"bad added id", v, m, `{"added_tokens_decoder":{"x":{"content":"<y>"}}}`, "not a token id"},
		{"added id clash", v, m, `{"added_tokens_decoder":{"97":{"content":"<y>"}}}`, "vocab.json gives"},
		{"added empty", v, m, `{"added_tokens_decoder":{"300":{"content":""}}}`, "empty content"},
		{"added lstrip", v, m, `{"added_tokens_decoder":{"300":{"content":"<y>","lstrip":true}}}`, "not supported"},
		{"added twice", v, m, `{"added_tokens_decoder":{"300":{"content":"<y>"},"301":{"content":"<y>"}}}`, "two ids"},
	}
	for _, tc := range cases {
		_, err := Load([]byte(tc.vocab), []byte(tc.merges), []byte(tc.cfg))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "bpe: ") {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestFromModelMissingFile(t *testing.T) {
	d := goldenDir(t)
	m, err := gguf.OpenModel(filepath.Join(d, "cases.gguf"))
	if err != nil {
		t.Skipf("cases.gguf is not a packaged model: %v", err)
	}
	defer m.Close()
	if _, err := FromModel(m); err == nil || !strings.Contains(err.Error(), "vocab.json") {
		t.Errorf("FromModel(cases.gguf) err = %v, want missing vocab.json", err)
	}
}

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"Hello world", "<|s_12|><|im_end|>\n", "cafe\u0301 ｶﾀｶﾅ 😀", "\r\n  \t x", "'S'll 123", "\xff\xe3\x81", ""} {
		f.Add(s)
	}
	tok := goldenTokenizer(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		for _, id := range ids {
			if _, ok := tok.Token(id); !ok {
				t.Fatalf("Encode(%q) produced id %d that is not a token", s, id)
			}
		}
		want := tok.normalizedText(s)
		if got := string(tok.DecodeBytes(ids)); got != want {
			t.Fatalf("DecodeBytes(Encode(%q)) = %q, want %q", s, got, want)
		}
		if utf8.ValidString(s) {
			if got := tok.Decode(ids); got != want {
				t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, got, want)
			}
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	tok := goldenTokenizer(b)
	r := rand.New(rand.NewPCG(7, 8))
	texts := map[string]string{
		"english":  strings.Repeat("The quick brown fox jumps over the lazy dog, doesn't it? 1234 times.\n", 64),
		"japanese": strings.Repeat("今日はいい天気ですね。東京タワーは333メートルです。", 64),
		"speech":   strings.Repeat("<|s_123|><|s_4567|><|s_12799|>", 256),
		"mixed":    randomText(r, 4096),
	}
	for _, name := range []string{"english", "japanese", "speech", "mixed"} {
		s := texts[name]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			b.ReportAllocs()
			var ids []int
			for b.Loop() {
				ids = tok.AppendEncode(ids[:0], s)
			}
			b.ReportMetric(float64(len(ids)), "tokens/op")
		})
	}
}

func TestByteSymbols(t *testing.T) {
	seen := map[rune]bool{}
	for b, r := range byteToSym {
		if seen[r] {
			t.Fatalf("symbol %q used twice", r)
		}
		seen[r] = true
		if symToByte[r] != byte(b) {
			t.Fatalf("symToByte[%q] = %d, want %d", r, symToByte[r], b)
		}
	}
	if byteToSym[' '] != 'Ġ' || byteToSym['\n'] != 'Ċ' || byteToSym[0] != 0x100 || byteToSym[0xAD] != 0x143 {
		t.Errorf("byte symbols: ' '=%q '\\n'=%q 0x00=%q 0xAD=%q", byteToSym[' '], byteToSym['\n'], byteToSym[0], byteToSym[0xAD])
	}
	tok := goldenTokenizer(t)
	for id, want := range map[int]string{0: "!", 220: "Ġ", 198: "Ċ", 756: "<|endoftext|>", 758: "<|im_end|>"} {
		if got, _ := tok.Token(id); got != want {
			t.Errorf("Token(%d) = %q, want %q", id, got, want)
		}
	}
}

func TestConcurrentEncode(t *testing.T) {
	tok := goldenTokenizer(t)
	r := rand.New(rand.NewPCG(3, 4))
	texts := make([]string, 64)
	want := make([][]int, len(texts))
	for i := range texts {
		texts[i] = randomText(r, 200)
		want[i] = tok.Encode(texts[i])
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for k := 0; k < 200; k++ {
				i := (k*7 + g) % len(texts)
				if got := tok.Encode(texts[i]); !slices.Equal(got, want[i]) {
					t.Errorf("concurrent Encode(%q) differs", texts[i])
					return
				}
			}
		})
	}
	wg.Wait()
}
