package bpe

import (
	"unicode"
	"unicode/utf8"
)

// Pre-tokenisation with the Qwen2 split pattern
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// implemented by hand (Go's regexp has no lookahead). At each position the alternatives are
// tried in order, each with the match a backtracking regex engine would give; every byte of
// the text belongs to exactly one piece. \s is Unicode White_Space (unicode.IsSpace), \p{L}
// unicode.IsLetter, \p{N} unicode.IsNumber. A byte that is not valid UTF-8 counts as a
// character that is neither a letter, a number nor whitespace.

// char classes of one rune
const (
	clsOther = iota // punctuation, symbols, marks, invalid bytes…
	clsLetter
	clsNumber
	clsSpace // whitespace other than \r and \n
	clsNewline
)

func classOf(r rune, size int) int {
	if r < utf8.RuneSelf {
		c := byte(r)
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			return clsLetter
		case c >= '0' && c <= '9':
			return clsNumber
		case c == '\r' || c == '\n':
			return clsNewline
		case c == ' ' || c == '\t' || c == '\v' || c == '\f':
			return clsSpace
		}
		return clsOther
	}
	if r == utf8.RuneError && size == 1 {
		return clsOther
	}
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// runeAt decodes the rune at s[i:] and returns it, its size and its class; at the end of s it
// returns size 0 and class -1.
func runeAt(s string, i int) (rune, int, int) {
	if i >= len(s) {
		return 0, 0, -1
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1, classOf(rune(c), 1)
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, n, classOf(r, n)
}

func isWhite(cls int) bool { return cls == clsSpace || cls == clsNewline }

// contraction returns the length of a case-insensitive 's 't 're 've 'm 'll 'd at s[i:]
// (s[i] == '\”), or 0.
func contraction(s string, i int) int {
	if i+1 >= len(s) {
		return 0
	}
	lower := func(j int) (rune, int) {
		r, n := utf8.DecodeRuneInString(s[j:])
		if r == 'ſ' { // U+017F LATIN SMALL LETTER LONG S case-folds to 's'
			return 's', n
		}
		return unicode.ToLower(r), n
	}
	a, n1 := lower(i + 1)
	switch a {
	case 's', 't', 'm', 'd':
		if a != 's' && n1 != 1 {
			return 0
		}
		return 1 + n1
	case 'r', 'v', 'l':
		if n1 != 1 || i+2 >= len(s) {
			return 0
		}
		b, n2 := lower(i + 2)
		if n2 == 1 && ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
			return 3
		}
	}
	return 0
}

// splitAppend appends the pre-tokens of s (as [start, end) offsets relative to s) to dst.
func splitAppend(dst [][2]int, s string) [][2]int {
	for i := 0; i < len(s); {
		n := matchAt(s, i)
		dst = append(dst, [2]int{i, i + n})
		i += n
	}
	return dst
}

// Pretokenize splits s with the Qwen2 pattern and returns the pieces (their concatenation
// is s).
func Pretokenize(s string) []string {
	spans := splitAppend(nil, s)
	out := make([]string, len(spans))
	for k, sp := range spans {
		out[k] = s[sp[0]:sp[1]]
	}
	return out
}

// matchAt returns the length (> 0) of the pre-token starting at s[i].
func matchAt(s string, i int) int {
	r0, n0, c0 := runeAt(s, i)
	// 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r0 == '\'' {
		if n := contraction(s, i); n > 0 {
			return n
		}
	}
	// 2. [^\r\n\p{L}\p{N}]?\p{L}+
	if c0 == clsLetter {
		return letterRun(s, i+n0) - i
	}
	if c0 == clsOther || c0 == clsSpace {
		if _, _, c1 := runeAt(s, i+n0); c1 == clsLetter {
			return letterRun(s, i+n0) - i
		}
	}
	// 3. \p{N}
	if c0 == clsNumber {
		return n0
	}
	// 4. ' '?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r0 == ' ' {
		j++
	}
	if _, _, c := runeAt(s, j); c == clsOther {
		for {
			_, n, c := runeAt(s, j)
			if c != clsOther {
				break
			}
			j += n
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j - i
	}
	// Only whitespace is left (c0 is clsSpace or clsNewline).
	end := i     // end of the whitespace run
	lastNL := -1 // end of the last \r or \n in the run
	count := 0   // runes in the run
	prevEnd := i // start of the last rune in the run
	for {
		_, n, c := runeAt(s, end)
		if !isWhite(c) {
			break
		}
		prevEnd = end
		end += n
		count++
		if c == clsNewline {
			lastNL = end
		}
	}
	// 5. \s*[\r\n]+
	if lastNL > 0 {
		return lastNL - i
	}
	// 6. \s+(?!\S): the whole run at the end of the text, else all but its last rune.
	if end == len(s) {
		return end - i
	}
	if count >= 2 {
		return prevEnd - i
	}
	// 7. \s+
	return end - i
}

// letterRun returns the end of the run of letters starting at s[j].
func letterRun(s string, j int) int {
	for {
		_, n, c := runeAt(s, j)
		if c != clsLetter {
			return j
		}
		j += n
	}
}
