package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// applyConfigFile sets the flags of fs from a YAML (or JSON) file whose keys are flag names
// (`listen: 0.0.0.0:8080`, `tts-model: /models/miotts.gguf`, `api-key: [k1, k2]`). Flags
// given on the command line win over the file; unknown keys are an error, so a typo does
// not go unnoticed.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var kv map[string]any
	if err := yaml.Unmarshal(data, &kv); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "config" || fs.Lookup(k) == nil {
			return fmt.Errorf("config %s: unknown setting %q (settings are serve's flag names)", path, k)
		}
		if set[k] {
			continue // the command line wins
		}
		v := kv[k]
		var s string
		switch x := v.(type) {
		case []any: // lists, e.g. several API keys
			parts := make([]string, len(x))
			for i, e := range x {
				parts[i] = fmt.Sprint(e)
			}
			s = strings.Join(parts, ",")
		case nil:
			continue
		default:
			s = fmt.Sprint(x)
		}
		if err := fs.Set(k, s); err != nil {
			return fmt.Errorf("config %s: %s: %w", path, k, err)
		}
	}
	return nil
}

// applyConfigFlag applies the --config file, if one was named, under the command line's flags;
// the file may name pulled models too.
func applyConfigFlag(fs *flag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	if err := applyConfigFile(fs, path); err != nil {
		return err
	}
	return resolveModelFlags(fs, modelFlags...)
}
