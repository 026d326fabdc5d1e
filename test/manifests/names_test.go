package manifests_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// cacheIndexes are redlock.dev/ names the code declares that no object
// carries: field indexes of the manager's cache.
var cacheIndexes = []string{"redlock.dev/policy-key", "redlock.dev/namespace-rule"}

// TestLabelsReference: docs/reference/labels-and-annotations.md names every
// redlock.dev/ label, annotation, gate, condition and finalizer the code
// declares as a constant (outside tests), so that the page cannot miss one.
func TestLabelsReference(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "reference", "labels-and-annotations.md"))
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]string{} // name → where
	fset := token.NewFileSet()
	for _, dir := range []string{"api", "cmd", "controllers", "internal", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				spec, ok := n.(*ast.ValueSpec)
				if !ok {
					return true
				}
				for _, v := range spec.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					if s, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(s, "redlock.dev/") {
						declared[s] = fset.Position(lit.Pos()).String()
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(declared) < 20 {
		t.Fatalf("found %d redlock.dev/ names, want every one the code declares", len(declared))
	}
	for name, where := range declared {
		if slices.Contains(cacheIndexes, name) {
			continue
		}
		if !strings.Contains(string(doc), "`"+name) {
			t.Errorf("docs/reference/labels-and-annotations.md does not name %s (declared at %s)", name, where)
		}
	}
}
