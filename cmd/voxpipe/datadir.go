package main

import "os"

// defaultDataDir is where the voice library lives unless --voices says otherwise.
func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return d + "/voxpipe"
	}
	if h, err := os.UserHomeDir(); err == nil {
		return h + "/.local/share/voxpipe"
	}
	return "voxpipe-data"
}
