package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// chartCmd rewrites the chart archive helm package wrote with every file
// dated created (helm dates them at packaging), so that two releases of one
// commit give one chart digest, as they give one image digest.
func chartCmd(args []string) error {
	fs := flag.NewFlagSet("chart", flag.ExitOnError)
	path := fs.String("tgz", "", "the chart archive, rewritten in place")
	epoch := fs.String("created", "", "seconds since the epoch every file is dated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("-created %q: %w", *epoch, err)
	}
	data, err := os.ReadFile(*path)
	if err != nil {
		return err
	}
	files, err := untarGz(data)
	if err != nil {
		return fmt.Errorf("%s: %w", *path, err)
	}
	created := time.Unix(secs, 0).UTC()
	out, err := tarGz(files, created)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*path, out, 0o644); err != nil { //nolint:gosec // a release file
		return err
	}
	// helm push dates the chart's OCI manifest by the file's time.
	return os.Chtimes(*path, created, created)
}

// untarGz reads the regular files of a gzipped tar, in order.
func untarGz(data []byte) ([]archived, error) {
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	var files []archived
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("%s: not a regular file (type %c)", h.Name, h.Typeflag)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files = append(files, archived{name: h.Name, mode: h.Mode, data: b})
	}
}
