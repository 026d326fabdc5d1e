//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/redlock-operator/redlock-operator/test/dockerfile"
)

// imageFiles reads a docker-archive tarball (as hack/local-cluster imports
// it): the image config and every regular file of its layers, extracted
// into dir.
func imageFiles(archive, dir string) (cfg struct {
	Config struct {
		Entrypoint []string
		User       string
		WorkingDir string
	} `json:"config"`
}, files []string) {
	f, err := os.Open(archive) //nolint:gosec // the cluster's own file
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		Expect(err).NotTo(HaveOccurred())
		data, err := io.ReadAll(tr)
		Expect(err).NotTo(HaveOccurred())
		blobs[h.Name] = data
	}
	var manifest []struct {
		Config string
		Layers []string
	}
	Expect(json.Unmarshal(blobs["manifest.json"], &manifest)).To(Succeed())
	Expect(manifest).To(HaveLen(1))
	Expect(json.Unmarshal(blobs[manifest[0].Config], &cfg)).To(Succeed())
	for _, l := range manifest[0].Layers {
		var r io.Reader = bytes.NewReader(blobs[l])
		if gz, err := gzip.NewReader(bytes.NewReader(blobs[l])); err == nil {
			r = gz
		}
		lt := tar.NewReader(r)
		for {
			h, err := lt.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			Expect(err).NotTo(HaveOccurred())
			if h.Typeflag != tar.TypeReg {
				continue
			}
			name := "/" + strings.TrimPrefix(h.Name, "/")
			files = append(files, name)
			out := filepath.Join(dir, name)
			Expect(os.MkdirAll(filepath.Dir(out), 0o750)).To(Succeed())
			data, err := io.ReadAll(lt)
			Expect(err).NotTo(HaveOccurred())
			Expect(os.WriteFile(out, data, 0o700)).To(Succeed()) //nolint:gosec // an extracted binary, run below
		}
	}
	return cfg, files
}

var _ = Describe("the operator image the local cluster (and the demo) runs", func() {
	It("holds the binaries, entrypoint, user and working directory the Dockerfile declares, built as the Dockerfile builds them", func() {
		f, err := os.Open(filepath.Join(root, "Dockerfile"))
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = f.Close() }()
		df, err := dockerfile.Parse(f)
		Expect(err).NotTo(HaveOccurred())
		bins, err := df.Binaries()
		Expect(err).NotTo(HaveOccurred())

		dir := GinkgoT().TempDir()
		cfg, files := imageFiles(filepath.Join(state, "images", "operator.tar"), dir)
		Expect(cfg.Config.Entrypoint).To(Equal(df.Entrypoint))
		Expect(cfg.Config.User).To(Equal(df.User))
		Expect(cfg.Config.WorkingDir).To(Equal(df.WorkDir))
		var want []string
		for path := range bins {
			want = append(want, path)
		}
		Expect(files).To(ConsistOf(want), "the image holds exactly the Dockerfile's binaries")

		const module = "github.com/redlock-operator/redlock-operator"
		for path, pkg := range bins {
			info, err := buildinfo.ReadFile(filepath.Join(dir, path))
			Expect(err).NotTo(HaveOccurred(), path)
			Expect(info.Path).To(Equal(module+strings.TrimPrefix(pkg, ".")), "%s is built from %s", path, pkg)
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			Expect(settings).To(HaveKeyWithValue("CGO_ENABLED", "0"), path)
			Expect(settings).To(HaveKeyWithValue("-trimpath", "true"), path)
			// -trimpath keeps -ldflags out of the build info: ask the binary.
			out, err := exec.Command(filepath.Join(dir, path), "--version").Output()
			Expect(err).NotTo(HaveOccurred(), path)
			Expect(strings.TrimSpace(string(out))).NotTo(BeElementOf("", "dev"), "%s is stamped with a version", path)
		}
	})
})
