// Command failures prints, one short paragraph each, the failed specs of a
// Ginkgo JSON report (--ginkgo.json-report). CI keeps only the tail of a
// run's output, where Ginkgo's own summary names the failed specs but not
// what failed; the Makefile runs this last when a suite fails.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/onsi/ginkgo/v2/types"
)

// maxMessage bounds each failure's message: enough for a gomega
// expectation and its description, short enough for a log's tail.
const maxMessage = 600

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: failures REPORT.json")
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[1]) //nolint:gosec // the report named on the command line
	if err != nil {
		fmt.Fprintf(os.Stderr, "failures: no report: %v\n", err)
		os.Exit(1)
	}
	var reports []types.Report
	if err := json.Unmarshal(data, &reports); err != nil {
		fmt.Fprintf(os.Stderr, "failures: reading %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if !s.State.Is(types.SpecStateFailureStates) {
				continue
			}
			f := s.Failure
			fmt.Printf("FAILED %s [%s] at %s:%d: %s\n", s.FullText(), f.FailureNodeType, filepath.Base(f.Location.FileName), f.Location.LineNumber, squeeze(f.Message))
		}
	}
}

// squeeze puts msg on one line of at most maxMessage characters.
func squeeze(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > maxMessage {
		msg = msg[:maxMessage] + "…"
	}
	return msg
}
