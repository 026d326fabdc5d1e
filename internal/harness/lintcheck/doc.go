// Package lintcheck holds checks of the repository's own source that no
// linter makes: plain go tests that parse the tree with go/ast and fail
// naming file:line. It has no code of its own; see its tests.
package lintcheck
