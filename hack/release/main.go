// Command release packs what hack/release.sh built into the outputs of a
// release, without Docker and without a registry:
//
//	release image   -bin DIR -platforms linux/amd64,linux/arm64 -version V -out DIR
//	release plugin  -bin DIR -platforms linux/amd64,…,windows/arm64 -version V -url URL -out DIR
//	release chart   -tgz FILE -created EPOCH
//	release sign    -dir DIR -key KEY.pem
//	release keygen  -out PREFIX
//
// image writes the operator's image for each platform into an OCI image
// layout (image/), as one index, from a base assembled here (the users and
// directories distroless/static:nonroot has) and the four binaries, with an
// SPDX SBOM a platform (redlock-operator-OS-ARCH.spdx.json); the index's
// digest goes to image.digest.
// plugin writes a tar.gz a platform of kubectl-redlock and its completion
// script, and the krew manifest redlock.yaml naming them. chart dates every
// file of the chart archive helm package wrote at EPOCH. sign writes
// SHA256SUMS over every file of DIR and SHA256SUMS.sig, an ECDSA P-256
// signature in cosign's sign-blob format (cosign verify-blob --key). keygen
// writes a key pair for it (tests; a real release keeps its key in CI).
//
// Why not ko, goreleaser, syft or cosign: ko builds one Go program an image
// and needs a base image from a registry; goreleaser builds images with
// Docker or ko; syft and cosign are each hundreds of modules to build for
// what this does with go-containerregistry, Go's build info (which syft's
// Go cataloger reads too) and the standard library's ECDSA (which cosign's
// key-based blob signatures are). docs/design/release.md says more.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: release image|plugin|chart|sign|keygen [flags]")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "image":
		err = imageCmd(args)
	case "plugin":
		err = pluginCmd(args)
	case "chart":
		err = chartCmd(args)
	case "sign":
		err = signCmd(args)
	case "keygen":
		err = keygenCmd(args)
	default:
		err = fmt.Errorf("unknown command %q: image, plugin, chart, sign or keygen", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}
