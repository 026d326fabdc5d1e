package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Binaries are the programs of the image, as the Dockerfile copies them:
// the manager (the entrypoint), the Redis entrypoint gate, the in-pod agent
// and the kubectl plugin.
var Binaries = []string{"manager", "gate", "agent", "kubectl-redlock"}

// nonroot is the user the image runs as, as distroless's nonroot.
const nonroot = 65532

func imageCmd(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	bin := fs.String("bin", "", "directory with OS_ARCH/BINARY for each platform")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "platforms of the image")
	version := fs.String("version", "", "the release version")
	revision := fs.String("revision", "", "the commit built")
	source := fs.String("source", "https://github.com/redlock-operator/redlock-operator", "the repository")
	epoch := fs.Int64("created", 0, "creation time, seconds since 1970 (SOURCE_DATE_EPOCH)")
	out := fs.String("out", "", "release directory: image/, the SBOMs and image.digest are written in it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bin == "" || *version == "" || *out == "" {
		return fmt.Errorf("image: -bin, -version and -out are required")
	}
	created := time.Unix(*epoch, 0).UTC()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range strings.Split(*platforms, ",") {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return fmt.Errorf("platform %q: %w", p, err)
		}
		dir := filepath.Join(*bin, plat.OS+"_"+plat.Architecture)
		img, err := image(dir, *plat, created, map[string]string{
			"org.opencontainers.image.title":    "redlock-operator",
			"org.opencontainers.image.version":  *version,
			"org.opencontainers.image.revision": *revision,
			"org.opencontainers.image.source":   *source,
			"org.opencontainers.image.licenses": "Apache-2.0",
		})
		if err != nil {
			return fmt.Errorf("image for %s: %w", p, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		if err := writeSBOM(*out, dir, *version, *plat, digest, created, *source); err != nil {
			return fmt.Errorf("SBOM for %s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	path, err := layout.Write(filepath.Join(*out, "image"), empty.Index)
	if err != nil {
		return fmt.Errorf("write the OCI layout: %w", err)
	}
	// The ref name is what ctr images import and skopeo name the image by:
	// a tag, which cannot hold a semver build's "+" (Helm's OCI charts
	// write "_" for it too).
	tag := strings.ReplaceAll(*version, "+", "_")
	if err := path.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
		return fmt.Errorf("write the image index: %w", err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "image.digest"), []byte(digest.String()+"\n"), 0o644) //nolint:gosec // a release file
}

// image is the operator's image for plat: a base layer and the binaries
// of dir, created at created.
func image(dir string, plat v1.Platform, created time.Time, labels map[string]string) (v1.Image, error) {
	base, err := layer(func(tw *tar.Writer) error {
		for _, d := range []struct {
			name string
			mode int64
			uid  int
		}{{"etc/", 0o755, 0}, {"home/", 0o755, 0}, {"home/nonroot/", 0o700, nonroot}, {"tmp/", 0o1777, 0}} {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, Uid: d.uid, Gid: d.uid, ModTime: created}); err != nil {
				return err
			}
		}
		files := map[string]string{
			"etc/passwd": fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot),
			"etc/group":  fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot),
		}
		for _, name := range []string{"etc/group", "etc/passwd"} {
			if err := file(tw, name, 0o644, []byte(files[name]), created); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	bins, err := layer(func(tw *tar.Writer) error {
		for _, b := range Binaries {
			data, err := os.ReadFile(filepath.Join(dir, b)) //nolint:gosec // the build's output
			if err != nil {
				return err
			}
			if err := file(tw, b, 0o755, data, created); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range []v1.Layer{base, bins} {
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/release"}}); err != nil {
			return nil, err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = plat.OS, plat.Architecture, plat.Variant
	cfg.Created = v1.Time{Time: created}
	cfg.Config = v1.Config{
		Entrypoint: []string{"/manager"},
		User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels:     labels,
	}
	return mutate.ConfigFile(img, cfg)
}

// layer is a layer of the tar write writes.
func layer(write func(*tar.Writer) error) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := write(tw); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// file writes a regular file owned by root.
func file(tw *tar.Writer, name string, mode int64, data []byte, created time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: created}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}
