// Package version holds the version the binaries were built as, stamped at
// build time with
//
//	go build -ldflags "-X github.com/redlock-operator/redlock-operator/internal/version.Version=v0.3.0"
//
// (the Makefile and the Dockerfile do this; a plain go build says "dev").
package version

// Version is the operator's release, "dev" when not stamped.
var Version = "dev"
