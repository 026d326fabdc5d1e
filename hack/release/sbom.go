package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// SPDX 2.3 (https://spdx.github.io/spdx-spec/v2.3/), the fields this
// SBOM fills.
type (
	spdxDocument struct {
		SPDXVersion       string             `json:"spdxVersion"`
		DataLicense       string             `json:"dataLicense"`
		SPDXID            string             `json:"SPDXID"`
		Name              string             `json:"name"`
		DocumentNamespace string             `json:"documentNamespace"`
		CreationInfo      spdxCreationInfo   `json:"creationInfo"`
		Packages          []spdxPackage      `json:"packages"`
		Relationships     []spdxRelationship `json:"relationships"`
	}
	spdxCreationInfo struct {
		Created  string   `json:"created"`
		Creators []string `json:"creators"`
	}
	spdxPackage struct {
		SPDXID           string            `json:"SPDXID"`
		Name             string            `json:"name"`
		VersionInfo      string            `json:"versionInfo,omitempty"`
		DownloadLocation string            `json:"downloadLocation"`
		FilesAnalyzed    bool              `json:"filesAnalyzed"`
		PrimaryPurpose   string            `json:"primaryPackagePurpose,omitempty"`
		Checksums        []spdxChecksum    `json:"checksums,omitempty"`
		ExternalRefs     []spdxExternalRef `json:"externalRefs,omitempty"`
	}
	spdxChecksum struct {
		Algorithm string `json:"algorithm"`
		Value     string `json:"checksumValue"`
	}
	spdxExternalRef struct {
		Category string `json:"referenceCategory"`
		Type     string `json:"referenceType"`
		Locator  string `json:"referenceLocator"`
	}
	spdxRelationship struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
)

// writeSBOM writes out/redlock-operator-OS-ARCH.spdx.json: the image of
// plat (digest), the binaries of dir it contains, and the Go modules each
// was built from, as Go's build info records them.
func writeSBOM(out, dir, version string, plat v1.Platform, digest v1.Hash, created time.Time, source string) error {
	image := spdxPackage{
		SPDXID: "SPDXRef-Image", Name: "redlock-operator", VersionInfo: version, DownloadLocation: "NOASSERTION", PrimaryPurpose: "CONTAINER",
		Checksums:    []spdxChecksum{{"SHA256", digest.Hex}},
		ExternalRefs: []spdxExternalRef{{"PACKAGE-MANAGER", "purl", "pkg:oci/redlock-operator@" + digest.String() + "?arch=" + plat.Architecture}},
	}
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              fmt.Sprintf("redlock-operator %s %s/%s", version, plat.OS, plat.Architecture),
		DocumentNamespace: fmt.Sprintf("%s/sbom/%s/%s-%s/%s", source, version, plat.OS, plat.Architecture, digest.Hex),
		CreationInfo:      spdxCreationInfo{Created: created.Format(time.RFC3339), Creators: []string{"Tool: redlock-operator-hack-release"}},
		Packages:          []spdxPackage{image},
		Relationships:     []spdxRelationship{{"SPDXRef-DOCUMENT", "DESCRIBES", image.SPDXID}},
	}
	seen := map[string]bool{}
	for _, b := range Binaries {
		info, err := buildinfo.ReadFile(filepath.Join(dir, b))
		if err != nil {
			return fmt.Errorf("read the build info of %s: %w", b, err)
		}
		id := "SPDXRef-Binary-" + b
		doc.Packages = append(doc.Packages, spdxPackage{
			SPDXID: id, Name: b, VersionInfo: version, DownloadLocation: "NOASSERTION", PrimaryPurpose: "APPLICATION",
			ExternalRefs: []spdxExternalRef{{"PACKAGE-MANAGER", "purl", purl(info.Path, version)}},
		})
		doc.Relationships = append(doc.Relationships, spdxRelationship{image.SPDXID, "CONTAINS", id})
		deps := append([]*debugModule{{Path: "stdlib", Version: info.GoVersion}}, modules(info)...)
		for _, m := range deps {
			mid := "SPDXRef-Module-" + spdxID(m.Path+"-"+m.Version)
			if !seen[mid] {
				seen[mid] = true
				p := spdxPackage{SPDXID: mid, Name: m.Path, VersionInfo: m.Version, DownloadLocation: "NOASSERTION", PrimaryPurpose: "LIBRARY",
					ExternalRefs: []spdxExternalRef{{"PACKAGE-MANAGER", "purl", purl(m.Path, m.Version)}}}
				if m.Sum != "" {
					p.Checksums = nil // h1: sums hash a module's tree, not a file: kept in the purl's checksum qualifier
					p.ExternalRefs[0].Locator += "?checksum=" + m.Sum
				}
				doc.Packages = append(doc.Packages, p)
			}
			doc.Relationships = append(doc.Relationships, spdxRelationship{id, "DEPENDS_ON", mid})
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil { //nolint:gosec // a release directory
		return err
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	name := filepath.Join(out, fmt.Sprintf("redlock-operator-%s-%s.spdx.json", plat.OS, plat.Architecture))
	return os.WriteFile(name, append(data, '\n'), 0o644) //nolint:gosec // a release file
}

type debugModule struct{ Path, Version, Sum string }

// modules are the modules a binary was built from (replacements resolved).
func modules(info *buildinfo.BuildInfo) []*debugModule {
	var out []*debugModule
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		out = append(out, &debugModule{Path: d.Path, Version: d.Version, Sum: d.Sum})
	}
	return out
}

func purl(path, version string) string {
	if path == "stdlib" {
		return "pkg:golang/stdlib@" + version
	}
	return "pkg:golang/" + path + "@" + version
}

// spdxID makes s a valid SPDX ID part: letters, digits, . and -.
func spdxID(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '-'
	}, s)
}
