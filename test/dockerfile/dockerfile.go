// Package dockerfile reads the parts of the project's Dockerfile that the
// tests hold other build paths to: which binaries the builder stage builds
// and how, and how the final stage lays them out. It understands the
// subset of the syntax the Dockerfile uses, and nothing more.
package dockerfile

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Build is one `go build` of the builder stage.
type Build struct {
	Package string // e.g. ./cmd/manager
	Output  string // e.g. /out/manager
	Flags   string // the whole command line, for checks on its flags
}

// Copy is one `COPY --from=builder SRC DEST` of the final stage.
type Copy struct{ Src, Dest string }

// File is what the tests need to know about the Dockerfile.
type File struct {
	Builds     []Build
	Env        string // the builder's ENV line(s), joined
	BaseImages []string
	Copies     []Copy
	User       string
	WorkDir    string
	Entrypoint []string
}

var (
	goBuild = regexp.MustCompile(`go build .*-o (\S+) (\./\S+)`)
	copyRe  = regexp.MustCompile(`^COPY --from=builder (\S+) (\S+)$`)
)

// Parse reads a Dockerfile.
func Parse(r io.Reader) (*File, error) {
	f := &File{}
	stage := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "FROM "):
			stage++
			f.BaseImages = append(f.BaseImages, line)
			f.User, f.WorkDir, f.Entrypoint = "", "", nil
		case strings.HasPrefix(line, "ENV ") && stage == 1:
			f.Env += strings.TrimPrefix(line, "ENV ") + " "
		case strings.HasPrefix(line, "RUN ") && stage == 1:
			if m := goBuild.FindStringSubmatch(line); m != nil {
				f.Builds = append(f.Builds, Build{Package: m[2], Output: m[1], Flags: line})
			}
		case copyRe.MatchString(line):
			m := copyRe.FindStringSubmatch(line)
			f.Copies = append(f.Copies, Copy{Src: m[1], Dest: m[2]})
		case strings.HasPrefix(line, "USER "):
			f.User = strings.TrimPrefix(line, "USER ")
		case strings.HasPrefix(line, "WORKDIR "):
			f.WorkDir = strings.TrimPrefix(line, "WORKDIR ")
		case strings.HasPrefix(line, "ENTRYPOINT "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "ENTRYPOINT ")), &f.Entrypoint); err != nil {
				return nil, fmt.Errorf("ENTRYPOINT is not in exec (JSON) form: %w", err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if stage != 2 {
		return nil, fmt.Errorf("want a builder and a final stage, found %d stages", stage)
	}
	return f, nil
}

// Binaries maps each path in the final image to the package built into
// it, e.g. /manager → ./cmd/manager.
func (f *File) Binaries() (map[string]string, error) {
	out := map[string]string{}
	for _, c := range f.Copies {
		found := false
		for _, b := range f.Builds {
			if b.Output == c.Src {
				out[c.Dest], found = b.Package, true
			}
		}
		if !found {
			return nil, fmt.Errorf("COPY of %s: no go build writes it", c.Src)
		}
	}
	return out, nil
}
