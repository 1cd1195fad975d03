package telephony_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/telephony"
)

func TestTwilioMessageParse(t *testing.T) {
	m, err := telephony.ParseMessage([]byte(`{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC1","streamSid":"MZ1","callSid":"CA1","tracks":["inbound"],"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1},"customParameters":{"voice":"dsp","pitch_semitones":4,"mode":"vc"}},"streamSid":"MZ1"}`))
	if err != nil || m.Event != "start" || m.Sequence != 1 || m.Start.CallSid != "CA1" || m.Start.StreamSid != "MZ1" ||
		m.Start.Params["voice"] != "dsp" || m.Start.Params["pitch_semitones"] != "4" {
		t.Errorf("start: %+v %+v %v", m, m.Start, err)
	}
	m, err = telephony.ParseMessage([]byte(`{"event":"media","sequenceNumber":3,"media":{"track":"inbound","chunk":"1","timestamp":"5","payload":"AAEC"},"streamSid":"MZ1"}`))
	if err != nil || m.Media.Chunk != 1 || m.Media.Timestamp != 5 || string(m.Media.Audio) != "\x00\x01\x02" {
		t.Errorf("media: %+v %v", m.Media, err)
	}
	m, err = telephony.ParseMessage([]byte(`{"event":"speak","text":"Hi there.","seed":18446744073709551615,"max_tokens":40,"mark_name":"hi"}`))
	if err != nil || m.Text != "Hi there." || m.Seed != 1<<64-1 || m.MaxTokens != 40 || m.MarkName != "hi" {
		t.Errorf("speak: %+v %v", m, err)
	}
	if m, err := telephony.ParseMessage([]byte(`{"event":"transcription","streamSid":"MZ1"}`)); err != nil || m.Known {
		t.Errorf("an unknown event: %+v %v, want parsed and not known", m, err)
	}
	for _, bad := range []struct{ msg, code string }{
		{`[]`, telephony.CodeBadJSON},
		{`{"event":`, telephony.CodeBadJSON},
		{`{"streamSid":"MZ1"}`, telephony.CodeBadMessage},
		{`{"event":"start"}`, telephony.CodeBadMessage},
		{`{"event":"start","start":{"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":16000,"channels":1}}}`, telephony.CodeBadMedia},
		{`{"event":"start","start":{"customParameters":{"a":{"b":1}}}}`, telephony.CodeBadParams},
		{`{"event":"media","media":{}}`, telephony.CodeBadMedia},
		{`{"event":"media","media":{"payload":"%%%%"}}`, telephony.CodeBadMedia},
		{`{"event":"media","media":{"payload":"` + strings.Repeat("A", 12000) + `"}}`, telephony.CodeBadMedia},
		{`{"event":"media","sequenceNumber":"x","media":{"payload":""}}`, telephony.CodeBadJSON},
		{`{"event":"mark","mark":{}}`, telephony.CodeBadMessage},
		{`{"event":"speak","text":""}`, telephony.CodeBadMessage},
		{`{"event":"speak","text":"` + strings.Repeat("a", telephony.MaxSpeakText+1) + `"}`, telephony.CodeTextTooLong},
		{`{"event":"speak","text":"Hi.","max_tokens":9223372036854775807}`, telephony.CodeBadMessage},
		{`{"event":"speak","text":"Hi.","seed":-1}`, telephony.CodeBadMessage},
	} {
		_, err := telephony.ParseMessage([]byte(bad.msg))
		var pe *telephony.ParseError
		if !errors.As(err, &pe) || pe.Code != bad.code {
			t.Errorf("%.80s: %v, want %s", bad.msg, err, bad.code)
		}
	}
}

// FuzzTwilioMessage: no input panics the parser, and whatever it accepts is within the
// limits the rest of the call relies on.
func FuzzTwilioMessage(f *testing.F) {
	if data, err := os.ReadFile(fixture); err == nil {
		lines := strings.Split(string(data), "\n")
		for _, l := range lines[:min(4, len(lines))] {
			f.Add([]byte(l))
		}
		f.Add([]byte(lines[len(lines)-2]))
	}
	for _, s := range []string{
		`{"event":"speak","text":"Hello.","seed":3,"max_tokens":20,"mark_name":"a"}`, `{"event":"cancel"}`,
		`{"event":"mark","mark":{"name":"x"}}`, `{"event":"dtmf","dtmf":{"digit":"1"}}`,
		`{"event":"media","media":{"payload":null}}`, `{"event":"start","start":{"customParameters":{"k":null,"n":1.5,"b":true}}}`,
		`{"event":"media","sequenceNumber":"1e3","media":{"chunk":null,"payload":"//8="}}`, `{"event":"\u0000"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := telephony.ParseMessage(data)
		if err != nil {
			var pe *telephony.ParseError
			if !errors.As(err, &pe) || pe.Code == "" || !errors.Is(err, telephony.ErrBadMessage) {
				t.Fatalf("error %v: not a ParseError with a code", err)
			}
			return
		}
		if m.Event == "" || !utf8.ValidString(m.Event) {
			t.Fatalf("accepted event %q", m.Event)
		}
		switch m.Event {
		case "media":
			if m.Media == nil || len(m.Media.Audio) > telephony.MaxPayload {
				t.Fatalf("media accepted: %+v", m.Media)
			}
		case "start":
			if m.Start == nil || len(m.Start.Params) > 64 || m.Start.Encoding != "audio/x-mulaw" || m.Start.SampleRate != 8000 {
				t.Fatalf("start accepted: %+v", m.Start)
			}
		case "speak":
			if !stream.HasWords(m.Text) || utf8.RuneCountInString(m.Text) > telephony.MaxSpeakText ||
				m.MaxTokens < 0 || m.MaxTokens > stream.MaxTokensLimit {
				t.Fatalf("speak accepted: %+v", m)
			}
		case "mark":
			if m.Mark == "" || len(m.Mark) > 256 {
				t.Fatalf("mark accepted: %q", m.Mark)
			}
		}
	})
}
