package miotts

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDetectLanguage(t *testing.T) {
	for text, want := range map[string]Language{
		"今日はいい天気ですね。":                Japanese,
		"Hello, how are you today?":  English,
		"日本語 and English mixed テキスト": Japanese,
		"12345 !!!":   AnyLang,
		"":            AnyLang,
		"Привет, мир": AnyLang,
	} {
		if got := DetectLanguage(text); got != want {
			t.Errorf("%q: %s, want %s", text, got, want)
		}
	}
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"  Hello world.  ":           "Hello world.", // non-Japanese: only trimmed
		"「こんにちは、世界！」":                "こんにちは、世界!",
		"ＡＢＣ１２３です。":                  "ABC123です",
		"ｶﾀｶﾅです":                     "カタカナです",
		"すごい～　本当？":                   "すごいー本当?",
		"えっと…………そうです":                "えっと……そうです",
		"東京—大阪[n]の\t旅":               "東京大阪の旅",
		"日本語 and English mixed":      "日本語 and English mixed",  // under 20 % kana/kanji: not Japanese
		"日本語 and English mixed テキスト": "日本語andEnglishmixedテキスト", // Japanese: spaces go, as in the server
	} {
		if got := Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSplitText(t *testing.T) {
	text := strings.Repeat("This is a sentence. ", 30) // 600 runes
	pieces := SplitText(text, 180)
	if len(pieces) < 4 {
		t.Fatalf("%d pieces", len(pieces))
	}
	for _, p := range pieces {
		if n := utf8.RuneCountInString(p); n > 180 || n == 0 {
			t.Errorf("piece of %d runes", n)
		}
		if !strings.HasSuffix(p, ".") {
			t.Errorf("piece not cut at a sentence end: %q", p)
		}
	}
	if got := strings.Join(pieces, " "); got != strings.TrimSpace(text) {
		t.Error("pieces do not rejoin to the text")
	}
	// Japanese without spaces is cut at 。, and a run with no break at all at the limit.
	ja := strings.Repeat("今日はいい天気ですね。", 40)
	for _, p := range SplitText(ja, 180) {
		if utf8.RuneCountInString(p) > 180 || !strings.HasSuffix(p, "。") {
			t.Errorf("ja piece %q", p)
		}
	}
	long := strings.Repeat("あ", 10000)
	pieces = SplitText(long, 180)
	total := 0
	for _, p := range pieces {
		total += utf8.RuneCountInString(p)
	}
	if total != 10000 || len(pieces) != 56 {
		t.Errorf("10000 unbroken runes: %d pieces, %d runes", len(pieces), total)
	}
	if len(SplitText("   ", 180)) != 0 || len(SplitText("", 180)) != 0 {
		t.Error("blank text gave pieces")
	}
}

func TestSpeakable(t *testing.T) {
	for text, want := range map[string]bool{"": false, "!!! ... ???": false, "。、！": false, "a": true, "３": true, "猫": true} {
		if Speakable(text) != want {
			t.Errorf("Speakable(%q) != %v", text, want)
		}
	}
}
