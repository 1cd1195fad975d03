package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// buildCommit is set by the Makefile (-ldflags -X main.buildCommit=…) for builds whose
// toolchain does not stamp the VCS revision (GOFLAGS=-buildvcs=false).
var buildCommit string

// buildVersion is the release name make stamps (git describe: the nearest tag, else the
// commit), where the module version is "(devel)".
var buildVersion string

// runVersion prints what a bug report needs: the module version, the commit and its time
// (and whether the tree had changes), the Go version and the platform.
func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "version", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	version, commit, when, dirty := "(devel)", "unknown", "", ""
	if buildCommit != "" {
		commit = buildCommit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			version = v
		} else if buildVersion != "" {
			version = buildVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				when = " (" + s.Value + ")"
			case "vcs.modified":
				if s.Value == "true" {
					dirty = ", with uncommitted changes"
				}
			}
		}
	}
	fmt.Fprintf(stdout, "voxpipe %s, commit %s%s%s\n%s %s/%s, %d CPUs\n", version, commit, when, dirty,
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	return nil
}
