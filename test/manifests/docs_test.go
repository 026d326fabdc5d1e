package manifests_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The docs are README.md and every Markdown page under docs/. These tests
// read them without an API server: the links between them, and which pages
// the example test (manifests_test.go) must cover.

// generatedPages are docs pages written by a generator, whose examples and
// links are the generator's: docs/reference/api.md (make api-docs) and
// docs/reference/helm-values.md (make helm-docs).
var generatedPages = []string{"docs/reference/api.md", "docs/reference/helm-values.md"}

// docPages lists README.md and every .md file under docs/, relative to the
// repository root, in a stable order.
func docPages(tb testing.TB) []string {
	tb.Helper()
	out, err := listDocPages()
	if err != nil {
		tb.Fatalf("listing docs/: %v", err)
	}
	return out
}

func listDocPages() ([]string, error) {
	out := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(out[1:])
	return out, err
}

// outsideFences returns the lines of a Markdown text with the lines of
// fenced code blocks blanked (so that line numbers stay right).
func outsideFences(text string) []string {
	lines := strings.Split(text, "\n")
	fence := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			fence = !fence
			lines[i] = ""
			continue
		}
		if fence {
			lines[i] = ""
		}
	}
	return lines
}

var heading = regexp.MustCompile(`^#{1,6} +(.*?)#*\s*$`)

// slug is the anchor GitHub gives a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces as '-'.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchorsOf are the anchors of a Markdown text: its headings' slugs, a
// repeated slug numbered as GitHub does (-1, -2, ...), and explicit
// <a id="..."> / <a name="..."> anchors.
func anchorsOf(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	explicit := regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
	for _, l := range outsideFences(text) {
		for _, m := range explicit.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(stripInline(m[1]))
		if n, dup := seen[s]; dup {
			seen[s] = n + 1
			out[s+"-"+strconv.Itoa(n+1)] = true
			continue
		}
		seen[s] = 0
		out[s] = true
	}
	return out
}

var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// stripInline drops what GitHub does not put in a heading's anchor: code
// spans' backticks and links' targets.
func stripInline(h string) string {
	h = inlineLink.ReplaceAllString(h, "$1")
	return strings.ReplaceAll(h, "`", "")
}

// mdLink is a Markdown link's target: [text](target) or [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestDocLinks checks every relative link in README.md, docs/ and the
// chart's README: the file
// or directory it names exists inside the repository, and an anchor names
// a heading of the page it points at.
func TestDocLinks(t *testing.T) {
	pages := append(docPages(t), "charts/redlock-operator/README.md")
	anchors := map[string]map[string]bool{}
	anchorsFor := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		data, err := os.ReadFile(filepath.Join(root, page)) //nolint:gosec // a file of this repository
		if err != nil {
			t.Fatalf("reading %s: %v", page, err)
		}
		anchors[page] = anchorsOf(string(data))
		return anchors[page]
	}
	checked := 0
	for _, page := range pages {
		data, err := os.ReadFile(filepath.Join(root, page)) //nolint:gosec // a file of this repository
		if err != nil {
			t.Fatalf("reading %s: %v", page, err)
		}
		for n, line := range outsideFences(string(data)) {
			line = regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "")
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`).MatchString(target) {
					continue // https:, mailto:
				}
				where := page + ":" + strconv.Itoa(n+1)
				path, anchor, _ := strings.Cut(target, "#")
				file := page
				if path != "" {
					file = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), path)))
					if strings.HasPrefix(file, "../") {
						t.Errorf("%s: link %s leaves the repository", where, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(root, file)); err != nil { //nolint:gosec // a path inside this repository, checked above
						t.Errorf("%s: link %s: %s does not exist", where, target, file)
						continue
					}
				}
				checked++
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(file, ".md") {
					t.Errorf("%s: link %s: an anchor into %s, which is not Markdown", where, target, file)
					continue
				}
				if !anchorsFor(file)[anchor] {
					t.Errorf("%s: link %s: %s has no heading with the anchor #%s", where, target, file, anchor)
				}
			}
		}
	}
	if checked < 100 {
		t.Errorf("only %d relative links found in README.md and docs/: is the link pattern still right?", checked)
	}
}
