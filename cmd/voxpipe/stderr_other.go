//go:build !unix

package main

// captureStderr runs f; where stderr cannot be redirected it captures nothing.
func captureStderr(f func() error) (string, error) { return "", f() }
