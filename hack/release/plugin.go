package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// krewPlugin is krew's Plugin manifest (krew.googlecontainertools.github.com/v1alpha2).
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string         `json:"version"`
		Homepage         string         `json:"homepage"`
		ShortDescription string         `json:"shortDescription"`
		Description      string         `json:"description"`
		Platforms        []krewPlatform `json:"platforms"`
	} `json:"spec"`
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string     `json:"uri"`
	SHA256 string     `json:"sha256"`
	Bin    string     `json:"bin"`
	Files  []krewFile `json:"files"`
}

type krewFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func pluginCmd(args []string) error {
	fs := flag.NewFlagSet("plugin", flag.ContinueOnError)
	bin := fs.String("bin", "", "directory with OS_ARCH/kubectl-redlock[.exe] for each platform")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64,windows/arm64", "platforms of the plugin")
	version := fs.String("version", "", "the release version")
	url := fs.String("url", "", "where the release's files are downloaded from (the archives' URLs are URL/NAME)")
	root := fs.String("root", ".", "the repository (LICENSE, the completion script)")
	epoch := fs.Int64("created", 0, "the files' time, seconds since 1970 (SOURCE_DATE_EPOCH)")
	out := fs.String("out", "", "release directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bin == "" || *version == "" || *out == "" || *url == "" {
		return fmt.Errorf("plugin: -bin, -version, -url and -out are required")
	}
	created := time.Unix(*epoch, 0).UTC()
	license, err := os.ReadFile(filepath.Join(*root, "LICENSE")) //nolint:gosec // a file of the repository
	if err != nil {
		return err
	}
	completion, err := os.ReadFile(filepath.Join(*root, "cmd", "kubectl-redlock", "kubectl_complete-redlock")) //nolint:gosec // a file of the repository
	if err != nil {
		return err
	}
	m := krewPlugin{APIVersion: "krew.googlecontainertools.github.com/v1alpha2", Kind: "Plugin"}
	m.Metadata.Name = "redlock"
	m.Spec.Version = *version
	m.Spec.Homepage = "https://github.com/redlock-operator/redlock-operator"
	m.Spec.ShortDescription = "Inspect and hand over redlock-operator's distributed locks"
	m.Spec.Description = "Answers what an on-call engineer asks about the DistributedLocks and\n" +
		"DistributedSemaphores of redlock-operator: who holds a lock and for how\n" +
		"long, why a pod is still gated, who waits, which locks share a Redis key,\n" +
		"a pod's fencing token; hands a lock on, and checks the operator answers.\n"
	for _, p := range strings.Split(*platforms, ",") {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok {
			return fmt.Errorf("platform %q is not OS/ARCH", p)
		}
		exe := "kubectl-redlock"
		if goos == "windows" {
			exe += ".exe"
		}
		data, err := os.ReadFile(filepath.Join(*bin, goos+"_"+goarch, exe)) //nolint:gosec // the build's output
		if err != nil {
			return err
		}
		files := []archived{{exe, 0o755, data}, {"LICENSE", 0o644, license}}
		kf := []krewFile{{exe, "."}, {"LICENSE", "."}}
		if goos != "windows" { // a sh script: kubectl runs it from PATH
			files = append(files, archived{"kubectl_complete-redlock", 0o755, completion})
			kf = append(kf, krewFile{"kubectl_complete-redlock", "."})
		}
		archive, err := tarGz(files, created)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("kubectl-redlock_%s_%s_%s.tar.gz", *version, goos, goarch)
		if err := os.WriteFile(filepath.Join(*out, name), archive, 0o644); err != nil { //nolint:gosec // a release file
			return err
		}
		sum := sha256.Sum256(archive)
		kp := krewPlatform{URI: strings.TrimSuffix(*url, "/") + "/" + name, SHA256: hex.EncodeToString(sum[:]), Bin: exe, Files: kf}
		kp.Selector.MatchLabels = map[string]string{"os": goos, "arch": goarch}
		m.Spec.Platforms = append(m.Spec.Platforms, kp)
	}
	data, err := yaml.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "redlock.yaml"), data, 0o644) //nolint:gosec // a release file
}

type archived struct {
	name string
	mode int64
	data []byte
}

// tarGz is a gzipped tar of files, all at created.
func tarGz(files []archived, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	gz.ModTime = created
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := file(tw, f.name, f.mode, f.data, created); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
