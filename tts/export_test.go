package tts

// WordTimer exposes the word timer to the external tests.
type WordTimer struct{ w *wordTimer }

func NewWordTimer(rate int) *WordTimer                { return &WordTimer{newWordTimer(rate)} }
func (t *WordTimer) Add(samples []float32)            { t.w.add(samples) }
func (t *WordTimer) Piece(text string) WordTimestamps { return t.w.piece(text) }
