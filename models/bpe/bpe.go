// Package bpe is a byte-level BPE tokenizer with GPT-2/Qwen2 semantics: added tokens are
// matched first (longest match), the text between them is NFC-normalised, split with the
// Qwen2 pre-tokenizer pattern, mapped byte by byte to the GPT-2 byte symbols and merged by
// rank with merges.txt.
package bpe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// AddedToken is an entry of tokenizer_config.json added_tokens_decoder.
type AddedToken struct {
	ID      int
	Content string
	Special bool
}

// Tokenizer encodes text to token ids and back. It is safe for concurrent use.
type Tokenizer struct {
	tokens  []string       // id -> token string (byte symbols or added-token text); "" = unused id
	isAdded []bool         // id -> added token
	special []bool         // id -> added token with special=true
	vocab   map[string]int // byte-symbol string -> id (vocab.json)
	added   map[string]int // added-token content -> id
	addedL  []AddedToken   // sorted by id

	byteID   [256]int32       // byte -> id of its symbol
	merges   map[uint64]merge // (left id, right id) -> merge, while loading
	mergeAt  []int32          // left id -> start of its entries in mergeR/mergeV (len ids+1)
	mergeR   []int32          // right ids, sorted within each left id
	mergeV   []merge
	pool     sync.Pool  // *encState
	symBytes [][]byte   // id -> bytes of a vocab token (nil for added tokens)
	trie     []trieNode // added-token trie while loading, node 0 = root
	// flattened trie: node k has edges edgeAt[k]..edgeAt[k+1] (edgeByte sorted) and
	// nodeID[k] = id of the token ending there, or -1.
	edgeAt    []int32
	edgeByte  []byte
	edgeNext  []int32
	nodeID    []int32
	firstByte [256]bool // first bytes of added tokens
}

type merge struct {
	rank int32
	id   int32
}

type trieNode struct {
	next map[byte]int32
	id   int32 // token id ending here, -1 if none
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// byteSymbols returns the GPT-2 byte -> unicode symbol table: printable bytes 0x21-0x7E,
// 0xA1-0xAC and 0xAE-0xFF map to the same code point, the 68 others to U+0100, U+0101…
// in increasing byte order.
func byteSymbols() (sym [256]rune) {
	next := rune(0x100)
	for b := 0; b < 256; b++ {
		if (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			sym[b] = rune(b)
		} else {
			sym[b] = next
			next++
		}
	}
	return sym
}

// ByteSymbols is the GPT-2 byte -> unicode symbol table (for writing byte-level vocabularies).
func ByteSymbols() [256]rune { return byteSymbols() }

var (
	byteToSym = byteSymbols()
	symToByte = func() map[rune]byte {
		m := make(map[rune]byte, 256)
		for b, r := range byteToSym {
			m[r] = byte(b)
		}
		return m
	}()
)

// FromModel builds the tokenizer from the vocab.json, merges.txt and tokenizer_config.json
// files embedded in a packaged model.
func FromModel(m *gguf.Model) (*Tokenizer, error) {
	var files [3][]byte
	for i, name := range []string{"vocab.json", "merges.txt", "tokenizer_config.json"} {
		b, ok := m.EmbeddedFile(name)
		if !ok {
			return nil, fmt.Errorf("bpe: model has no embedded %s (embedded files: %v)", name, m.EmbeddedFiles())
		}
		files[i] = b
	}
	return Load(files[0], files[1], files[2])
}

// Load builds the tokenizer from the contents of vocab.json (token -> id), merges.txt (an
// optional "#version" header line, then one "left right" pair per line, in rank order) and
// tokenizer_config.json (its added_tokens_decoder; nil or empty means no added tokens).
func Load(vocabJSON, mergesTXT, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	t := &Tokenizer{}
	if err := t.loadVocab(vocabJSON); err != nil {
		return nil, err
	}
	if err := t.loadMerges(mergesTXT); err != nil {
		return nil, err
	}
	if err := t.loadAdded(tokenizerConfigJSON); err != nil {
		return nil, err
	}
	t.buildMergeTable()
	t.flattenTrie()
	return t, nil
}

func (t *Tokenizer) setToken(id int, s string) {
	for len(t.tokens) <= id {
		t.tokens = append(t.tokens, "")
		t.isAdded = append(t.isAdded, false)
		t.special = append(t.special, false)
		t.symBytes = append(t.symBytes, nil)
	}
	t.tokens[id] = s
}

const maxID = 1 << 24

func (t *Tokenizer) loadVocab(data []byte) error {
	var raw map[string]int64
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("bpe: vocab.json: %w", err)
	}
	if len(raw) == 0 {
		return fmt.Errorf("bpe: vocab.json: empty vocabulary")
	}
	t.vocab = make(map[string]int, len(raw))
	byID := make(map[int64]string, len(raw))
	for tok, id := range raw {
		if id < 0 || id >= maxID {
			return fmt.Errorf("bpe: vocab.json: token %q has id %d out of range [0, %d)", tok, id, maxID)
		}
		if prev, ok := byID[id]; ok {
			a, b := prev, tok
			if a > b {
				a, b = b, a
			}
			return fmt.Errorf("bpe: vocab.json: id %d is used by both %q and %q", id, a, b)
		}
		byID[id] = tok
		if tok == "" {
			return fmt.Errorf("bpe: vocab.json: empty token string (id %d)", id)
		}
		bs, err := symbolsToBytes(tok)
		if err != nil {
			return fmt.Errorf("bpe: vocab.json: token %q (id %d): %w", tok, id, err)
		}
		t.vocab[tok] = int(id)
		t.setToken(int(id), tok)
		t.symBytes[id] = bs
	}
	for b := 0; b < 256; b++ {
		sym := string(byteToSym[b])
		id, ok := t.vocab[sym]
		if !ok {
			return fmt.Errorf("bpe: vocab.json: byte symbol %q (byte 0x%02X) is missing; not a byte-level BPE vocabulary", sym, b)
		}
		t.byteID[b] = int32(id)
	}
	return nil
}

// symbolsToBytes maps a string of GPT-2 byte symbols back to bytes.
func symbolsToBytes(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := symToByte[r]
		if !ok {
			return nil, fmt.Errorf("character %q is not a byte symbol", r)
		}
		out = append(out, b)
	}
	return out, nil
}

func (t *Tokenizer) loadMerges(data []byte) error {
	if !utf8.Valid(data) {
		return fmt.Errorf("bpe: merges.txt: not valid UTF-8")
	}
	t.merges = make(map[uint64]merge)
	lines := strings.Split(string(data), "\n")
	rank := int32(0)
	for n, line := range lines {
		line = strings.TrimSuffix(line, "\r")
		if n == 0 && strings.HasPrefix(line, "#version") {
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		parts := strings.Fields(line)
		if len(parts) != 2 {
			return fmt.Errorf("bpe: merges.txt line %d: %q: want two space-separated symbols", n+1, line)
		}
		a, okA := t.vocab[parts[0]]
		b, okB := t.vocab[parts[1]]
		if !okA || !okB {
			missing := parts[0]
			if okA {
				missing = parts[1]
			}
			return fmt.Errorf("bpe: merges.txt line %d: %q: symbol %q is not in vocab.json", n+1, line, missing)
		}
		id, ok := t.vocab[parts[0]+parts[1]]
		if !ok {
			return fmt.Errorf("bpe: merges.txt line %d: %q: merged token %q is not in vocab.json", n+1, line, parts[0]+parts[1])
		}
		k := pairKey(int32(a), int32(b))
		if _, dup := t.merges[k]; !dup { // the first (lowest-rank) occurrence wins
			t.merges[k] = merge{rank: rank, id: int32(id)}
		}
		rank++
	}
	return nil
}

type addedEntry struct {
	Content    string `json:"content"`
	Special    bool   `json:"special"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	SingleWord bool   `json:"single_word"`
	Normalized bool   `json:"normalized"`
}

func (t *Tokenizer) loadAdded(data []byte) error {
	t.added = make(map[string]int)
	t.trie = []trieNode{{id: -1}}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	var cfg struct {
		Added map[string]addedEntry `json:"added_tokens_decoder"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("bpe: tokenizer_config.json: %w", err)
	}
	for key, e := range cfg.Added {
		id, err := strconv.Atoi(key)
		if err != nil || id < 0 || id >= maxID {
			return fmt.Errorf("bpe: tokenizer_config.json: added_tokens_decoder key %q is not a token id", key)
		}
		if e.Content == "" {
			return fmt.Errorf("bpe: tokenizer_config.json: added token %d has empty content", id)
		}
		if e.LStrip || e.RStrip || e.SingleWord {
			return fmt.Errorf("bpe: tokenizer_config.json: added token %d %q: lstrip/rstrip/single_word are not supported", id, e.Content)
		}
		if id < len(t.tokens) && t.tokens[id] != "" && !t.isAdded[id] && t.tokens[id] != e.Content {
			return fmt.Errorf("bpe: tokenizer_config.json: added token %q has id %d, which vocab.json gives to %q", e.Content, id, t.tokens[id])
		}
		if prev, ok := t.added[e.Content]; ok {
			return fmt.Errorf("bpe: tokenizer_config.json: added token %q has two ids, %d and %d", e.Content, min(prev, id), max(prev, id))
		}
		t.added[e.Content] = id
		t.setToken(id, e.Content)
		t.isAdded[id] = true
		t.special[id] = e.Special
		t.symBytes[id] = nil
		t.addedL = append(t.addedL, AddedToken{ID: id, Content: e.Content, Special: e.Special})
	}
	sort.Slice(t.addedL, func(i, j int) bool { return t.addedL[i].ID < t.addedL[j].ID })
	for _, a := range t.addedL {
		t.insertTrie(a.Content, int32(a.ID))
	}
	return nil
}

// flattenTrie stores the trie as arrays, edges of a node sorted by byte.
func (t *Tokenizer) flattenTrie() {
	t.edgeAt = make([]int32, len(t.trie)+1)
	t.nodeID = make([]int32, len(t.trie))
	for k, nd := range t.trie {
		t.nodeID[k] = nd.id
		bs := make([]byte, 0, len(nd.next))
		for c := range nd.next {
			bs = append(bs, c)
		}
		slices.Sort(bs)
		for _, c := range bs {
			t.edgeByte = append(t.edgeByte, c)
			t.edgeNext = append(t.edgeNext, nd.next[c])
		}
		t.edgeAt[k+1] = int32(len(t.edgeByte))
	}
	t.trie = nil
}

func (t *Tokenizer) insertTrie(s string, id int32) {
	t.firstByte[s[0]] = true
	n := int32(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		nx, ok := t.trie[n].next[c]
		if !ok {
			if t.trie[n].next == nil {
				t.trie[n].next = make(map[byte]int32, 1)
			}
			nx = int32(len(t.trie))
			t.trie[n].next[c] = nx
			t.trie = append(t.trie, trieNode{id: -1})
		}
		n = nx
	}
	t.trie[n].id = id
}

// matchAdded returns the id and length of the longest added token at s[i:], or (-1, 0).
func (t *Tokenizer) matchAdded(s string, i int) (int32, int) {
	if !t.firstByte[s[i]] {
		return -1, 0
	}
	best, bestLen := int32(-1), 0
	n := int32(0)
	for j := i; j < len(s); j++ {
		c, e, end := s[j], t.edgeAt[n], t.edgeAt[n+1]
		for e < end && t.edgeByte[e] < c {
			e++
		}
		if e == end || t.edgeByte[e] != c {
			break
		}
		n = t.edgeNext[e]
		if id := t.nodeID[n]; id >= 0 {
			best, bestLen = id, j+1-i
		}
	}
	return best, bestLen
}

// buildMergeTable turns the merge map into per-left-id sorted arrays (cheaper to probe).
func (t *Tokenizer) buildMergeTable() {
	n := len(t.tokens)
	t.mergeAt = make([]int32, n+1)
	keys := make([]uint64, 0, len(t.merges))
	for k := range t.merges {
		keys = append(keys, k)
		t.mergeAt[k>>32+1]++
	}
	slices.Sort(keys)
	for i := 0; i < n; i++ {
		t.mergeAt[i+1] += t.mergeAt[i]
	}
	t.mergeR = make([]int32, len(keys))
	t.mergeV = make([]merge, len(keys))
	for i, k := range keys { // sorted by (left, right): entries land in order
		t.mergeR[i] = int32(uint32(k))
		t.mergeV[i] = t.merges[k]
	}
	t.merges = nil
}

// lookupMerge returns the merge of the pair (a, b).
func (t *Tokenizer) lookupMerge(a, b int32) (merge, bool) {
	lo, end := int(t.mergeAt[a]), int(t.mergeAt[a+1])
	hi := end
	for hi-lo > 8 { // narrow to a short window that holds the lower bound of b
		mid := int(uint(lo+hi) >> 1)
		if t.mergeR[mid] < b {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	for ; lo < end; lo++ {
		if r := t.mergeR[lo]; r >= b {
			if r == b {
				return t.mergeV[lo], true
			}
			break
		}
	}
	return merge{}, false
}

// VocabSize returns one more than the largest token id.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of a token string: an added token's text or a vocab entry (byte
// symbols).
func (t *Tokenizer) TokenID(tok string) (int, bool) {
	if id, ok := t.added[tok]; ok {
		return id, true
	}
	id, ok := t.vocab[tok]
	return id, ok
}

// Token returns the string of a token id (byte symbols, or an added token's text).
func (t *Tokenizer) Token(id int) (string, bool) {
	if id < 0 || id >= len(t.tokens) || t.tokens[id] == "" {
		return "", false
	}
	return t.tokens[id], true
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int) bool { return id >= 0 && id < len(t.special) && t.special[id] }

// Encode returns the token ids of text.
func (t *Tokenizer) Encode(text string) []int {
	return t.AppendEncode(make([]int, 0, len(text)/3+1), text)
}

// AppendEncode appends the token ids of text to dst.
func (t *Tokenizer) AppendEncode(dst []int, text string) []int {
	st, _ := t.pool.Get().(*encState)
	if st == nil {
		st = new(encState)
	}
	defer t.pool.Put(st)
	start := 0
	for i := 0; i < len(text); {
		id, n := t.matchAdded(text, i)
		if n == 0 {
			i++
			continue
		}
		dst = t.encodeOrdinary(dst, text[start:i], st)
		dst = append(dst, int(id))
		i += n
		start = i
	}
	return t.encodeOrdinary(dst, text[start:], st)
}

// AppendEncodeText appends the token ids of text read as plain text: added tokens such as
// <|im_end|> or <|s_5|> written in it are encoded as their characters, never as the token, so
// user text cannot inject control tokens into a prompt.
func (t *Tokenizer) AppendEncodeText(dst []int, text string) []int {
	st, _ := t.pool.Get().(*encState)
	if st == nil {
		st = new(encState)
	}
	defer t.pool.Put(st)
	return t.encodeOrdinary(dst, text, st)
}

// Pieces returns the token strings of text (byte symbols / added-token text).
func (t *Tokenizer) Pieces(text string) []string {
	ids := t.Encode(text)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = t.tokens[id]
	}
	return out
}

type encState struct {
	spans [][2]int
	syms  []int32
	ranks []int32
	ids   []int32
	fresh []bool
}

func (t *Tokenizer) encodeOrdinary(dst []int, s string, st *encState) []int {
	if s == "" {
		return dst
	}
	s = NFC(s)
	st.spans = splitAppend(st.spans[:0], s)
	for _, sp := range st.spans {
		dst = t.bpe(dst, s[sp[0]:sp[1]], st)
	}
	return dst
}

// bpe merges the byte symbols of one pre-token: while some adjacent pair has a merge, the
// pair of lowest rank is merged at all its non-overlapping occurrences, left to right.
// ranks[i] holds the rank of the pair (syms[i], syms[i+1]) and is only looked up again for
// pairs next to a merge.
func (t *Tokenizer) bpe(dst []int, word string, st *encState) []int {
	const none = int32(math.MaxInt32)
	syms, ranks, ids := st.syms[:0], st.ranks[:0], st.ids[:0]
	for i := 0; i < len(word); i++ {
		syms = append(syms, t.byteID[word[i]])
	}
	lookup := func(i int) {
		if m, ok := t.lookupMerge(syms[i], syms[i+1]); ok {
			ranks[i], ids[i] = m.rank, m.id
		} else {
			ranks[i] = none
		}
	}
	if len(syms) > 1 {
		ranks = append(ranks, make([]int32, len(syms)-1)...)
		ids = append(ids, make([]int32, len(syms)-1)...)
		for i := range ranks {
			lookup(i)
		}
	}
	for len(syms) > 1 {
		best := none
		for _, r := range ranks {
			if r < best {
				best = r
			}
		}
		if best == none {
			break
		}
		// Merge every occurrence of the best pair, left to right (in place: w <= i). A kept
		// symbol carries the rank of the pair it started; it stays valid unless the next
		// symbol is new.
		fresh := st.fresh[:0]
		w := 0
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && ranks[i] == best {
				syms[w] = ids[i]
				fresh = append(fresh, true)
				i++
			} else {
				syms[w] = syms[i]
				if i < len(ranks) {
					ranks[w], ids[w] = ranks[i], ids[i]
				}
				fresh = append(fresh, false)
			}
			w++
		}
		syms = syms[:w]
		ranks, ids = ranks[:w-1], ids[:w-1]
		for k := range ranks {
			if fresh[k] || fresh[k+1] {
				lookup(k)
			}
		}
		st.fresh = fresh
	}
	for _, id := range syms {
		dst = append(dst, int(id))
	}
	st.syms, st.ranks, st.ids = syms, ranks, ids
	return dst
}

// DecodeBytes returns the bytes the ids stand for: added tokens give their text, other ids
// the bytes of their symbols. Ids that are not tokens are skipped.
func (t *Tokenizer) DecodeBytes(ids []int) []byte {
	return t.appendDecode(nil, ids, false)
}

func (t *Tokenizer) appendDecode(out []byte, ids []int, skipSpecial bool) []byte {
	for _, id := range ids {
		if id < 0 || id >= len(t.tokens) {
			continue
		}
		if t.isAdded[id] {
			if skipSpecial && t.special[id] {
				continue
			}
			out = append(out, t.tokens[id]...)
			continue
		}
		out = append(out, t.symBytes[id]...)
	}
	return out
}

// Decode returns the text of ids; byte sequences that are not valid UTF-8 become U+FFFD
// (one per maximal invalid subpart). Ids that are not tokens are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	return toValidUTF8(t.appendDecode(nil, ids, false))
}

// DecodeSkipSpecial is Decode without the added tokens marked special (speech tokens such
// as <|s_N|> are not special and are kept).
func (t *Tokenizer) DecodeSkipSpecial(ids []int) string {
	return toValidUTF8(t.appendDecode(nil, ids, true))
}

// toValidUTF8 replaces every maximal subpart of an ill-formed UTF-8 sequence with U+FFFD
// (the Unicode "substitution of maximal subparts" practice).
func toValidUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			out = append(out, b[i:i+n]...)
			i += n
			continue
		}
		out = utf8.AppendRune(out, utf8.RuneError)
		i += maximalSubpart(b[i:])
	}
	return string(out)
}

// maximalSubpart returns the length (>= 1) of the longest prefix of b that starts a
// well-formed UTF-8 sequence without completing it.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		if b[n] < lo || b[n] > hi {
			break
		}
		n++
		lo, hi = 0x80, 0xBF
	}
	return n
}
