package lintcheck

import (
	"errors"
	"fmt"
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

// asyncFuncs start a Gomega asynchronous assertion.
var asyncFuncs = map[string]bool{
	"Eventually":             true,
	"Consistently":           true,
	"EventuallyWithOffset":   true,
	"ConsistentlyWithOffset": true,
}

// assertFuncs end one; their first argument is the matcher, the rest the
// description (a format and its arguments, or a func() string).
var assertFuncs = map[string]bool{
	"Should":    true,
	"ShouldNot": true,
	"To":        true,
	"ToNot":     true,
	"NotTo":     true,
}

// TestEveryEventuallyAndConsistentlyHasADescription fails, naming file:line,
// for every Eventually or Consistently in the repository whose Should,
// ShouldNot, To, ToNot or NotTo has no description after its matcher (or an
// empty one), and for every Eventually or Consistently that is not asserted
// in the same expression, as one a helper returns would be: a failure must say
// which object was waited for and what was expected of it (issue 21, item 7).
func TestEveryEventuallyAndConsistentlyHasADescription(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	var problems []string
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
				name == "vendor" || name == "testdata" || name == "node_modules" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, p := range undescribed(fset, f) {
			rel, _ := filepath.Rel(root, p.Filename)
			problems = append(problems, fmt.Sprintf("%s:%d: %s", rel, p.Line, p.what))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("parsed only %d Go files under %s: is that the repository?", files, root)
	}
	if len(problems) > 0 {
		t.Errorf("%d Eventually/Consistently without a description naming what is waited for, "+
			"e.g. .Should(Succeed(), \"lock %%s/%%s to be held by pod %%s\", ns, name, pod):\n%s",
			len(problems), strings.Join(problems, "\n"))
	}
}

// TestTheCheckFindsWhatIsMissing runs the check on source with and without
// descriptions, so that a check which finds nothing cannot pass unseen.
func TestTheCheckFindsWhatIsMissing(t *testing.T) {
	src := `package x

func f(g Gomega, desc ...any) {
	Eventually(func() error { return nil }).Should(Succeed()) // 4: missing
	Eventually(func() error { return nil }).Should(Succeed(), "lock %s held", name) // fine
	Consistently(get).WithTimeout(time.Second).ShouldNot(BeEmpty()) // 6: missing
	Consistently(get).WithTimeout(time.Second).ShouldNot(BeEmpty(), "pod %s gated", p) // fine
	g.Eventually(get).To(Equal(1)) // 8: missing
	gomega.Consistently(get).NotTo(HaveOccurred(), "") // 9: empty
	EventuallyWithOffset(1, get).Should(Succeed(), desc...) // fine: passed through
	a := Eventually(get) // 11: not asserted here
	a.Should(Succeed(), "x")
	Expect(x).To(Equal(1)) // not asynchronous
	Eventually(ctx, func(g Gomega) {
		g.Expect(x).To(Equal(1))
	}).WithPolling(time.Second).Should(Succeed()) // missing: reported at 14
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var lines []int
	for _, p := range undescribed(fset, f) {
		lines = append(lines, p.Line)
	}
	if want := []int{4, 6, 8, 9, 11, 14}; !slices.Equal(lines, want) {
		t.Errorf("found lines %v, want %v", lines, want)
	}
}

type problem struct {
	token.Position
	what string
}

// undescribed lists the asynchronous assertions of f that have no
// description, at the line of their Eventually or Consistently.
func undescribed(fset *token.FileSet, f *ast.File) []problem {
	var out []problem
	asserted := map[*ast.CallExpr]bool{}
	var starts []*ast.CallExpr
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if asyncFuncs[funcName(call)] {
			starts = append(starts, call)
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !assertFuncs[sel.Sel.Name] {
			return true
		}
		start := chainStart(sel.X)
		if start == nil {
			return true
		}
		asserted[start] = true
		switch {
		case len(call.Args) < 2:
			out = append(out, problem{fset.Position(start.Pos()),
				fmt.Sprintf("%s(...).%s (line %d) has no description",
					funcName(start), sel.Sel.Name, fset.Position(sel.Sel.Pos()).Line)})
		case emptyString(call.Args[1]):
			out = append(out, problem{fset.Position(start.Pos()),
				fmt.Sprintf("%s(...).%s (line %d) has an empty description",
					funcName(start), sel.Sel.Name, fset.Position(sel.Sel.Pos()).Line)})
		}
		return true
	})
	for _, s := range starts {
		if !asserted[s] {
			out = append(out, problem{fset.Position(s.Pos()),
				fmt.Sprintf("%s(...) is not asserted in the same expression: "+
					"assert it where it is made, with a description", funcName(s))})
		}
	}
	slices.SortFunc(out, func(a, b problem) int { return a.Offset - b.Offset })
	return out
}

// chainStart follows x through modifiers such as WithTimeout(...) and
// WithPolling(...) down to the Eventually or Consistently that begins it, or
// returns nil when x is no such chain.
func chainStart(x ast.Expr) *ast.CallExpr {
	for {
		x = ast.Unparen(x)
		call, ok := x.(*ast.CallExpr)
		if !ok {
			return nil
		}
		if asyncFuncs[funcName(call)] {
			return call
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return nil
		}
		x = sel.X
	}
}

// funcName is the name a call calls: F for F(...), x.F(...) and pkg.F(...).
func funcName(call *ast.CallExpr) string {
	switch fun := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		return fun.Name
	case *ast.SelectorExpr:
		return fun.Sel.Name
	}
	return ""
}

func emptyString(x ast.Expr) bool {
	lit, ok := ast.Unparen(x).(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return false
	}
	s, err := strconv.Unquote(lit.Value)
	return err == nil && strings.TrimSpace(s) == ""
}

// moduleRoot is the directory of this module's go.mod, above the test's.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && //nolint:gosec // the go.mod files above the test's directory
			strings.Contains(string(b), "module github.com/redlock-operator/redlock-operator\n") {
			return dir
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/redlock-operator/redlock-operator above the test")
		}
		dir = parent
	}
}
