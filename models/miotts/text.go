package miotts

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Language is what DetectLanguage decides: "ja", "en" or "auto".
type Language string

const (
	Japanese Language = "ja"
	English  Language = "en"
	AnyLang  Language = "auto"
)

func isJapanese(r rune) bool {
	return r >= 0x3040 && r <= 0x309F || // hiragana
		r >= 0x30A0 && r <= 0x30FF || // katakana
		r >= 0x4E00 && r <= 0x9FFF || r >= 0x3400 && r <= 0x4DBF || r >= 0xF900 && r <= 0xFAFF // kanji
}

// DetectLanguage follows the MioTTS server: Japanese when at least 20 % of the
// non-whitespace characters are kana or kanji, English when at least half are ASCII
// letters, otherwise undecided.
func DetectLanguage(text string) Language {
	var n, ja, ascii int
	for _, r := range text {
		if unicode.IsSpace(r) {
			continue
		}
		n++
		if isJapanese(r) {
			ja++
		}
		if r < 0x80 && unicode.IsLetter(r) {
			ascii++
		}
	}
	switch {
	case n == 0:
		return AnyLang
	case ja*5 >= n:
		return Japanese
	case ascii*2 >= n:
		return English
	}
	return AnyLang
}

// Normalize prepares text the way the model was trained on it: Japanese text gets the
// server's character clean-up, everything else only loses surrounding whitespace.
func Normalize(text string) string {
	text = strings.TrimSpace(text)
	if DetectLanguage(text) != Japanese {
		return text
	}
	return normalizeJapanese(text)
}

// jaDrop are characters the Japanese normaliser deletes: tabs, spaces, a few symbols and
// every dash-like character.
var jaDrop = map[rune]bool{
	'\t': true, ' ': true, '\u3000': true, ';': true, '▼': true, '♀': true, '♂': true,
	'《': true, '》': true, '≪': true, '≫': true, '①': true, '②': true, '③': true, '④': true,
	'⑤': true, '⑥': true, '\u02D7': true, '\u2010': true, '\u2011': true, '\u2012': true,
	'\u2013': true, '\u2014': true, '\u2015': true, '\u2043': true, '\u2212': true,
	'\u23AF': true, '\u23E4': true, '\u2500': true, '\u2501': true, '\u2E3A': true, '\u2E3B': true,
}

var jaMap = map[rune]rune{
	'～': 'ー', '〜': 'ー', '？': '?', '！': '!', '●': '○', '◯': '○', '〇': '○', '♥': '♡',
}

// halfKana maps half-width katakana (U+FF61..U+FF9F) to full width, one character at a
// time (a following voiced mark stays a separate character, as the server does it).
var halfKana = []rune("。「」、・ヲァィゥェォャュョッーアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワン゛゜")

func normalizeJapanese(s string) string {
	s = strings.ReplaceAll(s, "[n]", "")
	var b strings.Builder
	for _, r := range s {
		switch {
		case jaDrop[r]:
			continue
		case jaMap[r] != 0:
			r = jaMap[r]
		case r >= 'Ａ' && r <= 'Ｚ', r >= 'ａ' && r <= 'ｚ', r >= '０' && r <= '９':
			r -= 0xFEE0 // full-width Latin letters and digits → ASCII
		case r >= 0xFF61 && r <= 0xFF9F:
			r = halfKana[r-0xFF61]
		}
		b.WriteRune(r)
	}
	s = b.String()
	for strings.Contains(s, "………") { // runs of three or more ellipses → two
		s = strings.ReplaceAll(s, "………", "……")
	}
	for _, p := range [][2]string{{"「", "」"}, {"『", "』"}, {"（", "）"}, {"【", "】"}, {"(", ")"}} {
		if strings.HasPrefix(s, p[0]) && strings.HasSuffix(s, p[1]) && len(s) > len(p[0])+len(p[1]) {
			s = s[len(p[0]) : len(s)-len(p[1])]
			break
		}
	}
	return strings.TrimRight(s, "。、")
}

// MaxChunkRunes bounds one generation's text, as the reference engine does: longer text
// is split at sentence ends (then clause marks, then spaces) and each piece is spoken in
// turn.
const MaxChunkRunes = 180

// SplitText cuts text into pieces of at most max code points, preferring sentence ends,
// then clause punctuation, then whitespace, and only as a last resort the middle of a
// word. Pieces are trimmed; empty ones are dropped.
func SplitText(text string, max int) []string {
	if max <= 0 {
		max = MaxChunkRunes
	}
	var out []string
	rest := strings.TrimSpace(text)
	for rest != "" {
		if utf8.RuneCountInString(rest) <= max {
			out = append(out, rest)
			break
		}
		cut := cutPoint(rest, max)
		if piece := strings.TrimSpace(rest[:cut]); piece != "" {
			out = append(out, piece)
		}
		rest = strings.TrimSpace(rest[cut:])
	}
	return out
}

// cutPoint is the byte offset of the best place to end a piece within the first max runes.
func cutPoint(s string, max int) int {
	end, n := 0, 0
	best := [3]int{} // after a sentence end, after a clause mark, before a space
	for i, r := range s {
		if n == max {
			break
		}
		n++
		end = i + utf8.RuneLen(r)
		switch {
		case strings.ContainsRune(".!?。！？…\n", r):
			best[0] = end
		case strings.ContainsRune(",;:、，；：)）」』", r):
			best[1] = end
		case unicode.IsSpace(r):
			best[2] = i
		}
	}
	for _, b := range best {
		if b > 0 {
			return b
		}
	}
	return end
}

// Speakable reports whether text has anything to say: a letter or a digit (text of only
// punctuation or whitespace makes the model babble or stop at once).
func Speakable(text string) bool {
	for _, r := range text {
		if unicode.IsLetter(r) || unicode.IsNumber(r) {
			return true
		}
	}
	return false
}
