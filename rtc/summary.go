package rtc

import "time"

// summary is what a session's "session ended" log line carries: enough to match a user's
// "it sounded bad" with what the server saw. Called once the session has stopped.
func (p *peer) summary(started time.Time) []any {
	args := []any{"duration", time.Since(started).Round(time.Millisecond)}
	if p.sess == nil {
		return args // it never started
	}
	st := p.sess.Stats()
	js, fec, plc := p.pipe.Recovery()
	p.mu.Lock()
	voice := p.voiceName
	p.mu.Unlock()
	if p.tts.Load() != nil {
		voice = "tts"
	}
	return append(args, "voice", voice, "audio", st.Produced.Round(time.Millisecond), "chunks", st.Chunks,
		"late_chunks", st.LateChunks, "dropped", st.Dropped.Round(time.Millisecond), "underflows", st.Underflows,
		"stretched", st.Stretched.Round(time.Millisecond),
		"latency", st.Latency.Round(time.Millisecond), "packets", js.Received, "lost", js.Lost,
		"fec", fec, "plc", plc, "shed", js.Shed)
}
