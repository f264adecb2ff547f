package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Stamped by scripts/release.sh with -ldflags "-X main.version=... -X
// main.commit=... -X main.date=...": a release binary says what it is
// whatever GOFLAGS said (-buildvcs=false leaves no VCS settings in the
// build info). Empty in other builds, which fall back to the build info.
var (
	version string
	commit  string
	date    string
)

// printVersion prints the version, the VCS commit the binary was built
// from (with "+dirty" for uncommitted changes) and its time, and the Go
// version: the stamped values when there are, else the build info's.
func printVersion(w io.Writer) {
	v, c, when := buildVersion()
	fmt.Fprintf(w, "mqd %s\ncommit %s", v, c)
	if when != "" {
		fmt.Fprintf(w, " (%s)", when)
	}
	fmt.Fprintf(w, "\n%s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// buildVersion is the binary's version, commit and commit time.
func buildVersion() (v, c, when string) {
	v, c = "(unknown)", "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				c = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty {
			c += "+dirty"
		}
	}
	if version != "" {
		v = version
	}
	if commit != "" {
		c, when = commit, date
	}
	return v, c, when
}
