package bpe

import "golang.org/x/text/unicode/norm"

// NFC is Unicode canonical composition, the normaliser Qwen's tokenizer applies to text
// between added tokens. Bytes that are not valid UTF-8 pass through.
func NFC(s string) string { return norm.NFC.String(s) }
