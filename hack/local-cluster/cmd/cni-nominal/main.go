// Command cni-nominal is a CNI plugin for the local single-node cluster: it
// gives each pod sandbox nothing but its own loopback (the runtime creates
// the network namespace) and reports a nominal IP so that the kubelet marks
// the node Ready. There is no pod network: pods reach each other and the
// host through hostNetwork on 127.0.0.1, never through these addresses.
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

func main() {
	cmd := os.Getenv("CNI_COMMAND")
	conf, _ := io.ReadAll(os.Stdin)
	var nc struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(conf, &nc)
	if nc.CNIVersion == "" {
		nc.CNIVersion = "1.0.0"
	}
	switch cmd {
	case "ADD":
		// A stable nominal address per container, in a range never routed.
		h := fnv.New32a()
		h.Write([]byte(os.Getenv("CNI_CONTAINERID")))
		n := h.Sum32()
		ip := fmt.Sprintf("10.244.%d.%d/32", (n>>8)%250+1, n%250+2)
		out := map[string]any{
			"cniVersion": nc.CNIVersion,
			// Named as the runtime asked (eth0): containerd looks for the
			// pod's address on that interface. Nothing is created.
			"interfaces": []map[string]any{{"name": ifName(), "sandbox": os.Getenv("CNI_NETNS")}},
			"ips":        []map[string]any{{"address": ip, "interface": 0}},
		}
		_ = json.NewEncoder(os.Stdout).Encode(out)
	case "DEL", "CHECK", "GC", "STATUS":
		// nothing to undo or check
	case "VERSION":
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
			"cniVersion":        nc.CNIVersion,
			"supportedVersions": []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"},
		})
	default:
		fmt.Fprintf(os.Stderr, "cni-nominal: unknown CNI_COMMAND %q\n", cmd)
		os.Exit(1)
	}
}

// ifName is the interface the runtime asked for.
func ifName() string {
	if n := os.Getenv("CNI_IFNAME"); n != "" {
		return n
	}
	return "eth0"
}
