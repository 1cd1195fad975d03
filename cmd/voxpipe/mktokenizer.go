package main

import (
	"slices"
	"strings"

	"github.com/voxpipe/voxpipe/models/bpe"
)

// englishCorpus is the text a real-size random model's tokenizer learns its merges from:
// plain English of the kind the benches and a call center speak. Its words become single
// tokens, as the common words are in Qwen3's published tokenizer, so a bench prompt costs
// about the tokens the real model would prefill (an English sentence ≈ 4–5 characters a
// token) rather than one a byte. Written for voxpipe.
const englishCorpus = `Thank you for calling. Your order has shipped and will arrive on Tuesday.
Thank you for calling. How can I help you today? Hello there, streaming world.
Good morning, and welcome to the support line. My name is Alex, and I will be helping you today.
Could you please tell me your account number, or the phone number on the account?
I can see your order here. It left our warehouse yesterday evening and should arrive by Friday.
If it does not arrive by then, please call us back and we will send a replacement at no cost.
Is there anything else I can help you with? Thank you for your patience while I check that.
Your appointment is confirmed for Monday at ten in the morning. We will send you a reminder
the day before. You can change or cancel it at any time from your account, or by calling us.
The quick brown fox jumps over the lazy dog. This is a test of the voice, one two three.
We are sorry for the wait. All of our agents are busy right now, but your call is important to us.
Please stay on the line, and the next available person will be with you in a few minutes.
Your payment of forty dollars was received on Wednesday. Your balance is now zero.
For billing questions, press one. For technical support, press two. To speak with an agent, press zero.
The weather today will be sunny with a light wind from the west, and rain is likely on Thursday evening.
She said that they would meet after work, then walk home through the park before it got dark.
We have updated our terms of service. You can read the new version on our website at any time.
Would you like me to send a copy of this by email? Have a great day, and goodbye.`

// maxMerges bounds the merges englishMerges learns (the corpus's words need about 460).
const maxMerges = 4000

// englishMerges trains byte-level BPE on englishCorpus as such tokenizers are trained: the
// pre-tokenizer's pieces, as byte symbols, counted; the most frequent adjacent pair merged
// (ties: the first pair in byte order), again and again until every piece is one token.
// It returns the merges in rank order.
func englishMerges() [][2]string {
	sym := bpe.ByteSymbols()
	counts := map[string]int{}
	for _, p := range bpe.Pretokenize(englishCorpus) {
		counts[p]++
	}
	type piece struct {
		parts []string
		count int
	}
	var pieces []piece
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for k := range counts {
			if !yield(k) {
				return
			}
		}
	}) {
		parts := make([]string, len(p))
		for i := range len(p) {
			parts[i] = string(sym[p[i]])
		}
		pieces = append(pieces, piece{parts, counts[p]})
	}
	var merges [][2]string
	for len(merges) < maxMerges {
		pairs := map[[2]string]int{}
		for _, w := range pieces {
			for i := 0; i+1 < len(w.parts); i++ {
				pairs[[2]string{w.parts[i], w.parts[i+1]}] += w.count
			}
		}
		var best [2]string
		bestN := 0
		for p, n := range pairs {
			if n > bestN || n == bestN && (p[0] < best[0] || p[0] == best[0] && p[1] < best[1]) {
				best, bestN = p, n
			}
		}
		if bestN == 0 {
			break
		}
		merges = append(merges, best)
		for k := range pieces {
			w := pieces[k].parts
			out := w[:0]
			for i := 0; i < len(w); i++ {
				if i+1 < len(w) && w[i] == best[0] && w[i+1] == best[1] {
					out = append(out, best[0]+best[1])
					i++
					continue
				}
				out = append(out, w[i])
			}
			pieces[k].parts = out
		}
	}
	return merges
}

// mergesFile is merges.txt for merges, and adds each merged token to vocab from id next on.
func mergesFile(merges [][2]string, vocab map[string]int, next int) []byte {
	var b strings.Builder
	b.WriteString("#version: 0.2\n")
	for _, m := range merges {
		b.WriteString(m[0] + " " + m[1] + "\n")
		if _, ok := vocab[m[0]+m[1]]; !ok {
			vocab[m[0]+m[1]] = next
			next++
		}
	}
	return []byte(b.String())
}
