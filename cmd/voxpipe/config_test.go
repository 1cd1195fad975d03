package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestApplyConfigFile(t *testing.T) {
	newFS := func() (*flag.FlagSet, *string, *int, *string) {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return fs, fs.String("listen", "localhost:8080", ""), fs.Int("tts-slots", 2, ""), fs.String("api-key", "", "")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "voxpipe.yaml")
	os.WriteFile(cfg, []byte("listen: 0.0.0.0:9000\ntts-slots: 6\napi-key: [key-one-0123456789, key-two-0123456789]\n"), 0o644)

	fs, listen, slots, keys := newFS()
	fs.Parse([]string{"--tts-slots", "3"}) // the command line wins over the file
	if err := applyConfigFile(fs, cfg); err != nil {
		t.Fatal(err)
	}
	if *listen != "0.0.0.0:9000" || *slots != 3 || *keys != "key-one-0123456789,key-two-0123456789" {
		t.Errorf("listen %q slots %d keys %q", *listen, *slots, *keys)
	}
	// JSON works too; unknown keys and bad values are errors naming them.
	for body, want := range map[string]string{
		`{"listen": "127.0.0.1:1"}`: "",
		"lisen: x\n":                `unknown setting "lisen"`,
		"tts-slots: many\n":         "tts-slots",
		"listen: [\n":               "config",
	} {
		os.WriteFile(cfg, []byte(body), 0o644)
		fs, _, _, _ := newFS()
		err := applyConfigFile(fs, cfg)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: %v (want %q)", body, err, want)
		}
	}
	if err := applyConfigFile(flag.NewFlagSet("x", flag.ContinueOnError), filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file: no error")
	}
}
