package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// printVersion prints the module version, the VCS commit the binary was
// built from (with "+dirty" for uncommitted changes) and the Go version.
func printVersion(w io.Writer) {
	version, commit, when := "(unknown)", "(unknown)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty {
			commit += "+dirty"
		}
	}
	fmt.Fprintf(w, "mqd %s\ncommit %s", version, commit)
	if when != "" {
		fmt.Fprintf(w, " (%s)", when)
	}
	fmt.Fprintf(w, "\n%s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
