//go:build !linux

package ckpt

import "os"

// adviseSequential is a no-op where posix_fadvise is not available.
func adviseSequential(*os.File) {}
