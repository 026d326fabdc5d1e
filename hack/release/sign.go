package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Sums is the checksum file sign writes, Sig its signature.
const (
	Sums = "SHA256SUMS"
	Sig  = "SHA256SUMS.sig"
)

func signCmd(args []string) error {
	fs := flag.NewFlagSet("sign", flag.ContinueOnError)
	dir := fs.String("dir", "", "release directory")
	key := fs.String("key", "", "PEM file of the ECDSA P-256 private key (PKCS #8); empty: write SHA256SUMS only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("sign: -dir is required")
	}
	sums, err := checksums(*dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*dir, Sums), sums, 0o644); err != nil { //nolint:gosec // a release file
		return err
	}
	if *key == "" {
		return nil
	}
	priv, err := readKey(*key)
	if err != nil {
		return err
	}
	digest := sha256.Sum256(sums)
	sig, err := ecdsa.SignASN1(rand.Reader, priv, digest[:])
	if err != nil {
		return fmt.Errorf("sign %s: %w", Sums, err)
	}
	// cosign sign-blob writes the signature base64-encoded, as here.
	return os.WriteFile(filepath.Join(*dir, Sig), []byte(base64.StdEncoding.EncodeToString(sig)), 0o644) //nolint:gosec // a release file
}

// checksums lists the SHA-256 of every file under dir, as sha256sum
// prints them, sorted by path.
func checksums(dir string) ([]byte, error) {
	var lines []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == Sums || rel == Sig {
			return err
		}
		data, err := os.ReadFile(path) //nolint:gosec // the release's files
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		lines = append(lines, hex.EncodeToString(sum[:])+"  "+filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(lines, func(a, b string) int { return strings.Compare(a[66:], b[66:]) })
	return []byte(strings.Join(lines, "\n") + "\n"), nil
}

func readKey(path string) (*ecdsa.PrivateKey, error) {
	data, err := os.ReadFile(path) //nolint:gosec // the key named on the command line
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s holds no PEM block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	priv, ok := k.(*ecdsa.PrivateKey)
	if !ok || priv.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%s is not an ECDSA P-256 key", path)
	}
	return priv, nil
}

func keygenCmd(args []string) error {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	out := fs.String("out", "", "writes OUT.key (private, PKCS #8) and OUT.pub (public, PKIX)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("keygen: -out is required")
	}
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out+".key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		return err
	}
	return os.WriteFile(*out+".pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644) //nolint:gosec // a public key
}
