package manifests_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	. "github.com/onsi/gomega"

	"github.com/redlock-operator/redlock-operator/test/dockerfile"
)

// finalStage is the Dockerfile's final stage: the release's image holds
// what a build of it would (its binaries, user, working directory and
// entrypoint), so the two cannot drift.
func finalStage() *dockerfile.File {
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	df, err := dockerfile.Parse(f)
	Expect(err).NotTo(HaveOccurred())
	return df
}

// binaries are the image's programs, as the Dockerfile copies them
// (paths in the image, without the leading /).
func binaries() []string {
	bins, err := finalStage().Binaries()
	Expect(err).NotTo(HaveOccurred())
	var out []string
	for path := range bins {
		out = append(out, strings.TrimPrefix(path, "/"))
	}
	return out
}

// tool runs a command in dir and fails the spec when it fails.
func tool(dir, name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s %s: %s", name, strings.Join(args, " "), out)
}

// read reads the file the path elements name.
func read(elem ...string) []byte {
	data, err := os.ReadFile(filepath.Join(elem...)) //nolint:gosec // the spec's own output
	Expect(err).NotTo(HaveOccurred())
	return data
}

// checkImage checks the OCI layout at dir: one index of digest, with a
// linux/amd64 and a linux/arm64 image of the binaries built for that
// architecture and stamped version, run as nonroot from /manager.
func checkImage(dir, digest, version string) {
	p, err := layout.FromPath(dir)
	Expect(err).NotTo(HaveOccurred())
	top, err := p.ImageIndex()
	Expect(err).NotTo(HaveOccurred())
	m, err := top.IndexManifest()
	Expect(err).NotTo(HaveOccurred())
	Expect(m.Manifests).To(HaveLen(1), "the layout holds one index")
	Expect(m.Manifests[0].Digest.String()).To(Equal(digest), "image.digest is the index's")
	Expect(m.Manifests[0].Annotations).To(HaveKeyWithValue("org.opencontainers.image.ref.name", version))
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	Expect(err).NotTo(HaveOccurred())
	im, err := idx.IndexManifest()
	Expect(err).NotTo(HaveOccurred())
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	var platforms []string
	for _, d := range im.Manifests {
		Expect(d.Platform).NotTo(BeNil())
		platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
		img, err := idx.Image(d.Digest)
		Expect(err).NotTo(HaveOccurred())
		cfg, err := img.ConfigFile()
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.OS + "/" + cfg.Architecture).To(Equal(platforms[len(platforms)-1]))
		df := finalStage()
		Expect(cfg.Config.Entrypoint).To(Equal(df.Entrypoint), "the Dockerfile's ENTRYPOINT")
		Expect(cfg.Config.User).To(Equal(df.User), "the Dockerfile's USER")
		Expect(cfg.Config.WorkingDir).To(Equal(df.WorkDir), "the Dockerfile's WORKDIR")
		Expect(cfg.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.version", version))
		files := filesOf(img)
		Expect(files).To(HaveKey("etc/passwd"))
		Expect(string(files["etc/passwd"])).To(ContainSubstring("nonroot:x:65532:65532:"))
		for _, b := range binaries() {
			Expect(files).To(HaveKey(b), "%s in the %s image", b, d.Platform.Architecture)
			f, err := elf.NewFile(bytes.NewReader(files[b]))
			Expect(err).NotTo(HaveOccurred(), b)
			Expect(f.Machine).To(Equal(machines[d.Platform.Architecture]), "%s is built for %s", b, d.Platform.Architecture)
			Expect(bytes.Contains(files[b], []byte(version))).To(BeTrue(), "%s is stamped %s", b, version)
		}
	}
	Expect(platforms).To(ConsistOf("linux/amd64", "linux/arm64"))
}

// filesOf reads the regular files of img's layers.
func filesOf(img v1.Image) map[string][]byte {
	layers, err := img.Layers()
	Expect(err).NotTo(HaveOccurred())
	out := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		Expect(err).NotTo(HaveOccurred())
		t := tar.NewReader(rc)
		for {
			h, err := t.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			Expect(err).NotTo(HaveOccurred())
			if h.Typeflag == tar.TypeReg {
				data, err := io.ReadAll(t)
				Expect(err).NotTo(HaveOccurred())
				out[h.Name] = data
			}
		}
		Expect(rc.Close()).To(Succeed())
	}
	return out
}

// checkSBOM checks an SPDX 2.3 document: it describes the image, which
// contains the four binaries, each depending on the modules of this
// repository's go.mod it was built from.
func checkSBOM(path, version string) {
	var doc struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			SPDXID      string `json:"SPDXID"`
			Name        string `json:"name"`
			VersionInfo string `json:"versionInfo"`
		} `json:"packages"`
		Relationships []struct {
			Element string `json:"spdxElementId"`
			Type    string `json:"relationshipType"`
			Related string `json:"relatedSpdxElement"`
		} `json:"relationships"`
	}
	Expect(json.Unmarshal(read(path), &doc)).To(Succeed(), path)
	Expect(doc.SPDXVersion).To(Equal("SPDX-2.3"))
	names := map[string]string{}
	for _, p := range doc.Packages {
		names[p.SPDXID] = p.Name + "@" + p.VersionInfo
	}
	related := map[string][]string{}
	for _, r := range doc.Relationships {
		related[r.Element+" "+r.Type] = append(related[r.Element+" "+r.Type], names[r.Related])
	}
	Expect(related["SPDXRef-DOCUMENT DESCRIBES"]).To(Equal([]string{"redlock-operator@" + version}))
	var contained []string
	for _, b := range binaries() {
		contained = append(contained, b+"@"+version)
	}
	Expect(related["SPDXRef-Image CONTAINS"]).To(ConsistOf(contained))
	// The modules the manager depends on, at go.mod's versions; among them
	// the root bundle it verifies public certificates with, since the
	// image has none.
	var want []string
	for _, m := range []string{"sigs.k8s.io/controller-runtime", "github.com/redis/go-redis/v9", "golang.org/x/crypto/x509roots/fallback"} {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}}@{{.Version}}", m)
		cmd.Dir = root
		v, err := cmd.Output()
		Expect(err).NotTo(HaveOccurred(), "go list -m %s", m)
		want = append(want, strings.TrimSpace(string(v)))
	}
	deps := related["SPDXRef-Binary-manager DEPENDS_ON"]
	Expect(deps).To(ContainElements(want), "%s lists the manager's modules at go.mod's versions", path)
	Expect(deps).To(ContainElement(HavePrefix("stdlib@go1.")))
}

// checkSums checks that sums lists every file of dir but itself and its
// signature, with its SHA-256.
func checkSums(dir string, sums []byte) {
	listed := map[string]string{}
	s := bufio.NewScanner(bytes.NewReader(sums))
	for s.Scan() {
		sum, name, ok := strings.Cut(s.Text(), "  ")
		Expect(ok).To(BeTrue(), "line %q", s.Text())
		listed[name] = sum
	}
	var files []string
	Expect(filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err == nil && rel != "SHA256SUMS" && rel != "SHA256SUMS.sig" {
			files = append(files, rel)
			sum := sha256.Sum256(read(path))
			Expect(listed).To(HaveKeyWithValue(rel, hex.EncodeToString(sum[:])), "SHA256SUMS lists %s", rel)
		}
		return err
	})).To(Succeed())
	Expect(listed).To(HaveLen(len(files)), "SHA256SUMS lists nothing else")
}

// verify verifies sig (base64, ASN.1), as cosign verify-blob --key does:
// ECDSA over the SHA-256 of data, with the PEM public key pub.
func verify(pub, data, sig []byte) bool {
	block, _ := pem.Decode(pub)
	Expect(block).NotTo(BeNil())
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	Expect(err).NotTo(HaveOccurred())
	raw, err := base64.StdEncoding.DecodeString(string(sig))
	Expect(err).NotTo(HaveOccurred())
	digest := sha256.Sum256(data)
	return ecdsa.VerifyASN1(k.(*ecdsa.PublicKey), digest[:], raw)
}
