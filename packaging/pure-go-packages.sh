#!/bin/sh
# Prints the module's packages that build without cgo, tests included: neither they nor
# anything they or their tests import (transitively) has cgo files. `make cross-check` vets
# them for macOS (GOOS=darwin CGO_ENABLED=0), where the cgo packages cannot be checked
# without the macOS SDK.
set -eu
GO=${GO:-go}
cgo=$($GO list -deps -test -f '{{if and (not .Standard) .CgoFiles}}{{.ImportPath}}{{end}}' ./... | sort -u)
# One line per package and per test variant ("p [p.test]", "p_test [p.test]", "p.test"):
# a package is pure when none of its lines names a cgo package.
$GO list -test -f '{{.ImportPath}} {{join .Deps " "}}' ./... | awk -v cgo="$cgo" '
	BEGIN { n = split(cgo, c, "\n"); for (i = 1; i <= n; i++) if (c[i] != "") iscgo[c[i]] = 1 }
	{
		p = $1; sub(/\.test$/, "", p); sub(/_test$/, "", p)
		seen[p] = 1
		for (i = 1; i <= NF; i++) if ($i in iscgo) bad[p] = 1
	}
	END { for (p in seen) if (!(p in bad)) print p }' | sort
