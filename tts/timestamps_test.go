package tts_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/tts"
)

// rawSpeak runs one context on a fresh socket and returns its audio (from JSON or binary
// frames, checking each binary frame's header), its timestamps messages and its done.
func rawSpeak(t *testing.T, base string, msgs ...map[string]any) (audio []byte, stamps []tts.WordTimestamps, done tts.ServerMessage) {
	t.Helper()
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(base, "http")+"/v1/tts/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, m := range msgs {
		if err := conn.WriteJSON(m); err != nil {
			t.Fatal(err)
		}
	}
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	seq := uint32(0)
	for {
		typ, data, err := conn.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if typ == websocket.BinaryMessage {
			n := int(data[0])
			id, s := string(data[1:1+n]), binary.BigEndian.Uint32(data[1+n:])
			if seq++; id != "w" || s != seq {
				t.Fatalf("binary frame: context %q seq %d, want w %d", id, s, seq)
			}
			audio = append(audio, data[1+n+4:]...)
			continue
		}
		var m tts.ServerMessage
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		switch m.Type {
		case "audio":
			audio = append(audio, m.Data...)
		case "timestamps":
			if m.WordTimestamps == nil {
				t.Fatalf("timestamps without word_timestamps: %s", data)
			}
			stamps = append(stamps, *m.WordTimestamps)
		default:
			return audio, stamps, m
		}
	}
}

func TestWordTimestampsAndBinaryFrames(t *testing.T) {
	_, base := newServer(t, tts.Config{})
	text := []string{"Hello there, how are you? ", "I am fine."}
	msgs := func(extra map[string]any) []map[string]any {
		first := speak("w", text[0], true, extra)
		return []map[string]any{first, speak("w", text[1], false, nil)}
	}
	plain, none, done := rawSpeak(t, base, msgs(nil)...)
	if done.Type != "done" || len(none) != 0 {
		t.Fatalf("plain context: %+v, %d timestamps messages", done, len(none))
	}
	audio, stamps, done := rawSpeak(t, base, msgs(map[string]any{"add_timestamps": true, "binary": true})...)
	if done.Type != "done" {
		t.Fatalf("context ended with %+v", done)
	}
	// Binary frames carry the same audio as JSON messages (same text, voice and seed).
	if !bytes.Equal(audio, plain) {
		t.Errorf("binary frames gave %d bytes, JSON %d (equal %v)", len(audio), len(plain), bytes.Equal(audio, plain))
	}
	// One timestamps message per piece of text, in order, covering its words, each word
	// after the one before and within the audio.
	if len(stamps) != 2 {
		t.Fatalf("%d timestamps messages, want one per piece: %+v", len(stamps), stamps)
	}
	var words []string
	last := 0.0
	for _, s := range stamps {
		if len(s.Start) != len(s.Words) || len(s.End) != len(s.Words) {
			t.Fatalf("ragged timestamps %+v", s)
		}
		for i := range s.Words {
			if s.Start[i] < last || s.End[i] <= s.Start[i] {
				t.Errorf("word %q at [%.3f, %.3f] after %.3f", s.Words[i], s.Start[i], s.End[i], last)
			}
			last = s.End[i]
		}
		words = append(words, s.Words...)
	}
	if want := strings.Fields(text[0] + text[1]); !slices.Equal(words, want) {
		t.Errorf("words %q, want %q", words, want)
	}
	if audioS := done.Metrics.AudioMs / 1000; last > audioS+1e-3 {
		t.Errorf("last word ends at %.3f s, after the audio's %.3f s", last, audioS)
	}
	t.Logf("timestamps: %+v (audio %.0f ms)", stamps, done.Metrics.AudioMs)
}

func TestWordTimesFollowTheVoicedSpan(t *testing.T) {
	// 200 ms of silence, 1 s of tone, 300 ms of silence at 24 kHz.
	const rate = 24000
	pcm := make([]float32, rate*3/2)
	for i := rate / 5; i < rate*6/5; i++ {
		pcm[i] = float32(0.3 * math.Sin(float64(i)*0.1))
	}
	w := tts.NewWordTimer(rate)
	w.Add(pcm[:7000]) // in uneven pieces, as the codec delivers them
	w.Add(pcm[7000:])
	got := w.Piece("Hi, wonderful world.")
	if !slices.Equal(got.Words, []string{"Hi,", "wonderful", "world."}) {
		t.Fatalf("words %q", got.Words)
	}
	if math.Abs(got.Start[0]-0.2) > 0.011 || math.Abs(got.End[2]-1.2) > 0.011 {
		t.Errorf("words span [%.3f, %.3f], want the tone's [0.2, 1.2]", got.Start[0], got.End[2])
	}
	// Longer words take longer; the comma leaves a pause.
	if d0, d1 := got.End[0]-got.Start[0], got.End[1]-got.Start[1]; d1 < 3*d0 {
		t.Errorf("\"wonderful\" %.3f s vs \"Hi,\" %.3f s", d1, d0)
	}
	if got.Start[1] <= got.End[0] {
		t.Errorf("no pause after the comma: %+v", got)
	}
	// The next piece starts where this one's audio ended (1.5 s).
	w.Add(pcm[rate/5 : rate*6/5])
	next := w.Piece("Again")
	if math.Abs(next.Start[0]-1.5) > 0.011 || math.Abs(next.End[0]-2.5) > 0.011 {
		t.Errorf("second piece %+v, want [1.5, 2.5]", next)
	}
	if empty := w.Piece("... --"); len(empty.Words) != 0 {
		t.Errorf("no words: %+v", empty)
	}
}
